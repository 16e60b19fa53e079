"""The lease store in a dict, for unit tests and single-process runs.

Each operation yields to the event loop once and then runs without awaiting, so concurrent tasks
interleave between operations but never inside one: the same atomicity a conditional update has.
A ``threading.Lock`` makes it safe from several event loops too.
"""

from __future__ import annotations

import asyncio
import threading

from tollway.governance.store.base import check_take

__all__ = ["MemoryLeaseStore"]


class MemoryLeaseStore:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        """``counter_key`` → total granted."""
        self.expires: dict[str, int | None] = {}
        self.takes = 0
        """Calls of :meth:`take`, for tests that count round trips."""
        self._lock = threading.Lock()

    async def take(self, counter_key: str, amount: int, limit: int, expires_at: int | None) -> int:
        want = check_take(amount, limit)
        await asyncio.sleep(0)
        with self._lock:
            self.takes += 1
            current = self.counters.get(counter_key, 0)
            grant = max(0, min(want, limit - current))
            if grant or counter_key in self.counters:
                self.counters[counter_key] = current + grant
                self.expires[counter_key] = expires_at
            return grant

    async def give_back(self, counter_key: str, amount: int) -> None:
        if amount < 0:
            raise ValueError("amount must not be negative")
        await asyncio.sleep(0)
        with self._lock:
            current = self.counters.get(counter_key)
            if current is not None and current >= amount:
                self.counters[counter_key] = current - amount

    async def granted(self, counter_key: str) -> int:
        await asyncio.sleep(0)
        with self._lock:
            return self.counters.get(counter_key, 0)
