"""Where snapshots are published: a key → bytes store behind a Protocol.

The layout and the publication order live in :mod:`tollway.pricing.publish`, shared by every
backend; a backend only gets, checks and puts whole objects.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SnapshotStore"]


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
