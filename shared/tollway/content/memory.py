"""An in-memory :class:`~tollway.content.base.ContentStore` for unit tests and single-process runs.

It keeps the S3 store's semantics (the same key layout, the same checks of a reference against
what is stored, ``None`` for a deleted object, ``True`` only for a delete that found one) but
not its protection: it encrypts nothing, and holds the plaintext in this process's memory until
it is deleted or the store is closed.

Memory is bounded: at most ``max_objects`` objects. A full store refuses a put of a new key with
:class:`ContentUnavailable` (what a caller does with a store that is down: drop the capture)
rather than evict an object whose reference the audit trail already holds.
"""

from __future__ import annotations

import hashlib
from typing import Final

from tollway.content.base import ContentError, ContentRecord, ContentRef, ContentUnavailable
from tollway.content.envelope import key_parts, object_key, record_plaintext, verified_record

__all__ = ["MemoryContentStore"]

DEFAULT_MAX_OBJECTS: Final = 10_000
DEFAULT_MAX_OBJECT_BYTES: Final = 16 * 1024 * 1024


class MemoryContentStore:
    """``bucket`` and ``key_ref`` are what its references name (no bucket or KMS key exists)."""

    def __init__(
        self,
        *,
        bucket: str = "memory",
        key_ref: str = "memory",
        max_objects: int = DEFAULT_MAX_OBJECTS,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
    ) -> None:
        if max_objects < 1 or max_object_bytes < 1:
            raise ValueError("max_objects and max_object_bytes must be at least 1")
        self.bucket = bucket
        self.key_ref = key_ref
        self._objects: dict[str, bytes] = {}
        self._max_objects = max_objects
        self._max_object_bytes = max_object_bytes
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryContentStore(bucket={self.bucket!r}, objects={self.objects})"

    @property
    def objects(self) -> int:
        """How many objects it holds."""
        return len(self._objects)

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise ContentUnavailable(f"content store memory: {operation} failed: closed")

    def _check_bucket(self, ref: ContentRef) -> None:
        if ref.bucket != self.bucket:
            raise ContentError("a content reference names another bucket than this store's")

    async def put(self, record: ContentRecord, retention_class: str) -> ContentRef:
        self._check_open("PutObject")
        key, _ = object_key(record, retention_class)
        plaintext = record_plaintext(record, self._max_object_bytes)
        if key not in self._objects and len(self._objects) >= self._max_objects:
            raise ContentUnavailable(f"content store memory: PutObject failed: full ({self._max_objects} objects)")
        self._objects[key] = plaintext
        return ContentRef(
            bucket=self.bucket,
            key=key,
            digest=hashlib.sha256(plaintext).hexdigest(),
            size=len(plaintext),
            key_ref=self.key_ref,
            retention_class=retention_class,
            mode=record.mode,
            purposes=record.purposes,
        )

    async def get(self, ref: ContentRef) -> ContentRecord | None:
        self._check_open("GetObject")
        self._check_bucket(ref)
        parts = key_parts(ref.key)
        if parts.retention_class != ref.retention_class:
            raise ContentError("a content reference's retention class does not match its key")
        plaintext = self._objects.get(ref.key)
        if plaintext is None:
            return None
        return verified_record(plaintext, ref, parts)

    async def delete(self, ref: ContentRef) -> bool:
        self._check_open("DeleteObject")
        self._check_bucket(ref)
        key_parts(ref.key)
        return self._objects.pop(ref.key, None) is not None

    async def aclose(self) -> None:
        self._objects.clear()
        self._closed = True
