"""Shipping the audit WAL to its queue: the shipper loop (``shipper``), the sinks per backend
(``sinks``), and server mode's ship process (``process``, ``python -m tollway.audit.ship.process``)."""
