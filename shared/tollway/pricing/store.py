"""Where snapshots are published: a key → bytes store behind a Protocol, and its in-memory fake.

The layout and the publication order live in :mod:`tollway.pricing.publish`, shared by every
backend; a backend only gets, checks and puts whole objects. The S3 backend is
:mod:`tollway.pricing.s3`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

__all__ = ["MemorySnapshotStore", "SnapshotStore"]


class SnapshotStore(Protocol):
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or ``None`` when there is no such key; :class:`SnapshotStoreError` on failure."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists, without reading it."""
        ...

    def put(self, key: str, body: bytes) -> None:
        """Write the whole object (a new version of it, on a versioned bucket)."""
        ...


class MemorySnapshotStore:
    """The store in a dict, for unit tests; ``puts`` records every write in order."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self.objects.get(key)

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self.objects

    def put(self, key: str, body: bytes) -> None:
        with self._lock:
            self.objects[key] = bytes(body)
            self.puts.append(key)


if TYPE_CHECKING:
    _memory_is_a_store: type[SnapshotStore] = MemorySnapshotStore
