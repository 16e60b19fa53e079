"""Lambda layer build recipes: the dependencies layer and the core (``tollway``) layer.

Run ``python -m layers.build``. The recipes live in :mod:`layers.build`, the reproducible zip
writer and Lambda's size limits in :mod:`layers.archive`. Nothing is re-exported here, so that
``python -m layers.build`` does not import its own module twice.
"""
