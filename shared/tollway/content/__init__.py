"""Captured content: the records an alias's ``contentMode`` keeps, and the store they are kept in.

Modules: ``base`` (:class:`ContentRecord`, :class:`ContentRef`, the :class:`ContentStore`
interface, the key layout and the errors), ``envelope`` (the stored object's binary envelope and
associated data), ``s3`` (the store on S3 with KMS envelope encryption), ``memory`` (one
process's store, for tests) and ``writer`` (the bounded background path from the request to the
store).
"""

from tollway.content.base import (
    CAPTURING_MODES,
    CONTENT_MEDIA_TYPE,
    CONTENT_MODES,
    ContentError,
    ContentMode,
    ContentRecord,
    ContentRef,
    ContentStore,
    ContentUnavailable,
    content_key,
)
from tollway.content.memory import MemoryContentStore
from tollway.content.s3 import ContentStoreSettings, S3ContentStore
from tollway.content.writer import DROP_REASONS, ContentWriter, DropReason

__all__ = [
    "CAPTURING_MODES",
    "CONTENT_MEDIA_TYPE",
    "CONTENT_MODES",
    "DROP_REASONS",
    "ContentError",
    "ContentMode",
    "ContentRecord",
    "ContentRef",
    "ContentStore",
    "ContentStoreSettings",
    "ContentUnavailable",
    "ContentWriter",
    "DropReason",
    "MemoryContentStore",
    "S3ContentStore",
    "content_key",
]

_memory_is_a_store: type[ContentStore] = MemoryContentStore
_s3_is_a_store: type[ContentStore] = S3ContentStore
