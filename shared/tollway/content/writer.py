"""The background path from a finished exchange to the content store.

The request path calls :meth:`ContentWriter.submit`, which only appends to a bounded queue: it is
synchronous, never awaits, never blocks and never raises. Capturing content is best effort by
design: a full queue, a store that stays down or a record the store refuses is *dropped*, counted
by reason and reported through ``on_dropped``, and the exchange itself is unaffected. The audit
trail learns where a stored record went through ``on_stored`` (its :class:`ContentRef`).

* **Bounds.** At most ``max_pending`` records and ``max_pending_bytes`` bytes of plaintext
  (``ContentRecord.to_json()``) are pending: queued or being written. A submit past either bound is
  dropped as ``queue_full``; a record larger than ``max_pending_bytes`` on its own, which could
  never fit, as ``too_large``. Measuring a record serialises it once on the caller's thread
  (orjson: linear in its size, no I/O); the store serialises it again to seal it.
* **Workers.** ``workers`` asyncio tasks (two by default) take records in submit order and put
  them; they start on the first submit made inside a running event loop (or on :meth:`drain`), so
  building a writer needs no loop. ``submit`` must be called on that loop's thread.
* **Retries.** A put that raises :class:`ContentUnavailable` is tried once more after
  ``retry_delay_s``; if that fails too the record is dropped as ``store_unavailable``. Any other
  error (a record the store refuses: not serialisable, a key segment that is not URL-safe, too
  large for the store) is ``rejected`` at once: trying again would fail again.
* **Close.** :meth:`aclose` refuses new records (``closed``), waits up to ``timeout_s`` for what is
  pending, then cancels the workers; a record still queued or in flight is dropped as ``closed``.
  It does not close the store, which the caller owns.

Callbacks run on the event loop's thread and must not block; an exception from one is logged
(its type only) and swallowed, so a faulty callback cannot stop the workers or make submit raise.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from tollway.content.base import ContentError, ContentRecord, ContentRef, ContentStore, ContentUnavailable

__all__ = ["DROP_REASONS", "ContentWriter", "DropReason"]

log = logging.getLogger("tollway.content")

DropReason = Literal["queue_full", "too_large", "store_unavailable", "rejected", "closed"]
DROP_REASONS: Final[tuple[DropReason, ...]] = ("queue_full", "too_large", "store_unavailable", "rejected", "closed")
MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Pending:
    record: ContentRecord
    retention_class: str
    size: int


class ContentWriter:
    """Puts submitted records to ``store`` in the background; one per event loop."""

    def __init__(
        self,
        store: ContentStore,
        *,
        max_pending: int = 1000,
        max_pending_bytes: int = 64 * MIB,
        on_stored: Callable[[ContentRecord, ContentRef], None],
        on_dropped: Callable[[ContentRecord, str], None],
        workers: int = 2,
        retry_delay_s: float = 0.1,
    ) -> None:
        if max_pending < 1 or max_pending_bytes < 1 or not 1 <= workers <= 64 or retry_delay_s < 0:
            raise ValueError("max_pending and max_pending_bytes are positive, workers 1..64, retry_delay_s >= 0")
        self._store = store
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._on_stored = on_stored
        self._on_dropped = on_dropped
        self._workers = workers
        self._retry_delay_s = retry_delay_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending = 0
        self._pending_bytes = 0
        self._closed = False
        self.stored = 0
        """Records put to the store."""
        self.retried = 0
        """Puts tried a second time (after a :class:`ContentUnavailable`)."""
        self.dropped: collections.Counter[str] = collections.Counter()
        """Records dropped, by reason (:data:`DROP_REASONS`)."""

    def __repr__(self) -> str:
        return f"ContentWriter(pending={self._pending}, stored={self.stored}, dropped={dict(self.dropped)})"

    @property
    def store(self) -> ContentStore:
        """The store it writes to (the caller closes it, after :meth:`aclose`)."""
        return self._store

    @property
    def pending(self) -> int:
        """Records queued or being written."""
        return self._pending

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    # ------------------------------------------------------------ the request path

    def submit(self, record: ContentRecord, retention_class: str) -> bool:
        """Queue ``record``; ``False`` (and ``on_dropped``) when it is dropped instead. Never raises."""
        try:
            return self._submit(record, retention_class)
        except Exception as exc:
            log.error("content writer: submit failed (%s); the record is dropped", type(exc).__name__)
            self._drop(record, "rejected")
            return False

    def _submit(self, record: ContentRecord, retention_class: str) -> bool:
        if self._closed:
            self._drop(record, "closed")
            return False
        try:
            size = len(record.to_json())
        except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
            self._drop(record, "rejected")
            return False
        if size > self.max_pending_bytes:
            self._drop(record, "too_large")
            return False
        if self._pending >= self.max_pending or self._pending_bytes + size > self.max_pending_bytes:
            self._drop(record, "queue_full")
            return False
        self._queue.put_nowait(_Pending(record, retention_class, size))
        self._pending += 1
        self._pending_bytes += size
        self._idle.clear()
        self._start()
        return True

    def _start(self) -> None:
        if self._tasks:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the record waits for the first submit in one, or for drain()
        self._tasks = [loop.create_task(self._work(), name=f"tollway-content-writer-{i}") for i in range(self._workers)]

    # ------------------------------------------------------------ the workers

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._write(item)
            finally:
                self._pending -= 1
                self._pending_bytes -= item.size
                if self._pending == 0:
                    self._idle.set()

    async def _write(self, item: _Pending) -> None:
        record = item.record
        for attempt in (1, 2):
            try:
                ref = await self._store.put(record, item.retention_class)
            except asyncio.CancelledError:
                self._drop(record, "closed")
                raise
            except ContentUnavailable:
                if attempt == 1:
                    self.retried += 1
                    if self._retry_delay_s:
                        await self._sleep_or_close(record)
                    continue
                self._drop(record, "store_unavailable")
                return
            except ContentError:
                self._drop(record, "rejected")
                return
            except Exception as exc:
                log.error("content writer: the store's put raised %s; the record is dropped", type(exc).__name__)
                self._drop(record, "rejected")
                return
            self.stored += 1
            self._call("on_stored", self._on_stored, record, ref)
            return

    async def _sleep_or_close(self, record: ContentRecord) -> None:
        try:
            await asyncio.sleep(self._retry_delay_s)
        except asyncio.CancelledError:
            self._drop(record, "closed")
            raise

    def drop(self, record: ContentRecord, reason: DropReason) -> None:
        """Count and report a record the caller will not submit (``too_large`` before it was built whole)."""
        self._drop(record, reason)

    def _drop(self, record: ContentRecord, reason: DropReason) -> None:
        self.dropped[reason] += 1
        self._call("on_dropped", self._on_dropped, record, reason)

    @staticmethod
    def _call(name: str, callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception as exc:
            log.error("content writer: the %s callback raised %s", name, type(exc).__name__)

    # ------------------------------------------------------------ draining and closing

    async def drain(self, timeout_s: float) -> bool:
        """Wait until nothing is pending, at most ``timeout_s``; ``True`` when nothing is."""
        if self._pending == 0:
            return True
        self._start()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return self._pending == 0
        return True

    async def aclose(self, timeout_s: float = 1.0) -> None:
        """Refuse new records, drain for up to ``timeout_s``, then stop; what is left is dropped (``closed``)."""
        self._closed = True
        await self.drain(timeout_s)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while not self._queue.empty():
            item = self._queue.get_nowait()
            self._pending -= 1
            self._pending_bytes -= item.size
            self._drop(item.record, "closed")
        self._idle.set()
