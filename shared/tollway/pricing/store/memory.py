"""The snapshot store in a dict, for unit tests."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

__all__ = ["MemorySnapshotStore"]


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
    from tollway.pricing.store.base import SnapshotStore

    _memory_is_a_store: type[SnapshotStore] = MemorySnapshotStore
