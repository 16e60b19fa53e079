"""Where pricing snapshots are published: the :class:`SnapshotStore` interface and its backends.

A store only gets, checks and puts whole objects; the layout and the order of publication are
:mod:`tollway.pricing.publish`'s, shared by every backend.

Modules: ``base`` (the interface), ``memory`` (a dict, for tests) and ``s3`` (the stage's pricing
bucket, with its settings and a reader of ``s3://`` objects).
"""

from tollway.pricing.store.base import SnapshotStore
from tollway.pricing.store.memory import MemorySnapshotStore
from tollway.pricing.store.s3 import MAX_OBJECT_BYTES, S3SnapshotStore, StoreSettings, read_s3_object, s3_client

__all__ = [
    "MAX_OBJECT_BYTES",
    "MemorySnapshotStore",
    "S3SnapshotStore",
    "SnapshotStore",
    "StoreSettings",
    "read_s3_object",
    "s3_client",
]
