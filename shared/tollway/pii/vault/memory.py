"""An in-memory :class:`~tollway.pii.vault.base.PiiVault` for unit tests and single-process runs.

It keeps the vault's semantics (no overwrite, exact binding, revoke discards the value, expiry
checked on every read) but not its durability: entries live in this process only and are lost
when it ends, so it never qualifies for a durable ``session`` profile across replicas. Values
are held in clear, in memory: it protects nothing at rest and is not meant to.

Memory is bounded: at most ``max_entries`` entries. A full vault first drops entries whose
deadline has passed (:meth:`MemoryPiiVault.expire`); if it is still full, the insert raises
:class:`VaultUnavailable`, because evicting a live mapping would silently break a placeholder
that a client still holds.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tollway.pii.vault.base import TokenExists, VaultEntry, VaultUnavailable, check_value

__all__ = ["MemoryPiiVault"]

DEFAULT_MAX_ENTRIES: Final = 100_000


@dataclass(slots=True)
class _Stored:
    binding: bytes
    deadline: int
    value: str | None
    """``None`` once revoked."""


class MemoryPiiVault:
    """``clock`` (epoch seconds) decides when an expired entry may be replaced or purged (when the
    vault is full); resolve takes the caller's ``now``."""

    def __init__(self, *, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.time) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._entries: dict[str, _Stored] = {}
        self._max_entries = max_entries
        self._clock = clock
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise VaultUnavailable(f"memory pii vault: {operation} failed: closed")

    async def insert(self, entry: VaultEntry, value: str) -> None:
        self._check_open("insert")
        check_value(value)
        existing = self._entries.get(entry.token_id)
        if existing is not None and (existing.value is None or self._clock() < existing.deadline):
            live = existing.deadline if existing.value is not None else None
            raise TokenExists("memory pii vault: insert refused: the token id already has an entry", live)
        if len(self._entries) >= self._max_entries:
            self.expire(self._clock())
            if len(self._entries) >= self._max_entries:
                raise VaultUnavailable(f"memory pii vault: insert failed: full ({self._max_entries} live entries)")
        self._entries[entry.token_id] = _Stored(bytes(entry.binding), entry.deadline, value)

    async def resolve(self, token_id: str, binding: bytes, now: float) -> str | None:
        self._check_open("resolve")
        stored = self._entries.get(token_id)
        if stored is None or not hmac.compare_digest(stored.binding, bytes(binding)):
            return None
        if stored.value is None or now >= stored.deadline:
            return None
        return stored.value

    async def revoke(self, token_id: str) -> None:
        self._check_open("revoke")
        stored = self._entries.get(token_id)
        if stored is not None:
            stored.value = None

    def expire(self, now: float) -> int:
        """Drop every entry (revoked or not) whose deadline is at or before ``now``; returns how many.

        What a store's TTL does; until it runs, an expired entry still refuses a duplicate insert.
        """
        expired = [token_id for token_id, stored in self._entries.items() if now >= stored.deadline]
        for token_id in expired:
            del self._entries[token_id]
        return len(expired)

    async def aclose(self) -> None:
        self._entries.clear()
        self._closed = True
