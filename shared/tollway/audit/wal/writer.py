"""The audit write-ahead log: one writer thread, group commit, a durable watermark, recovery.

Every audit event passes through here before the shipper sends it anywhere. The gateway appends
(in memory, never waiting on I/O), a single writer thread writes batches, and under
``local-durable`` a request is dispatched only once its ``attempt_started`` record is at or below
the durable watermark. Payloads are opaque bytes (the events of :mod:`tollway.audit.events`).

On-disk format, version 1 (stable: a change means a new version number)
------------------------------------------------------------------------

One directory (created 0700) per writer, holding::

    wal-<first sequence, 20 digits>.seg    segments, 0600; names sort in sequence order
    ack.ckpt                               the durable acknowledgement checkpoint
    wal.lock                               flock'd by the one writer

A segment is a header followed by records. All integers are little-endian::

    header   magic        8   b"TWLAUDIT"
             version      u16 1; any other value is rejected, never guessed at
             segment id   16  a random UUID (bytes)
             created at   u64 epoch milliseconds
             id length    u16 1..256
             instance id  UTF-8 gateway instance id
             checksum     u32 CRC-32 of every header byte before it

    record   length       u32 payload bytes, at most max_record_bytes (never above 16 MiB)
             checksum     u32 CRC-32 of the sequence bytes followed by the payload
             sequence     u64 strictly increasing across all segments, starting at 1
             payload      ``length`` bytes

    ack.ckpt magic b"TWLACKPT", version u16, acknowledged sequence u64, CRC-32 of those (22 bytes)

The checksum is ``zlib.crc32`` (IEEE CRC-32): Python 3.11's standard library has no CRC32C. A
segment's first record carries the sequence in its name. A segment rolls over before a record
that would take it past ``segment_bytes``; the bytes of all segments stay within ``max_bytes``.

Durability
----------

``durable=True`` (``local-durable``): each batch is written, then fdatasync'd, then the watermark
moves to its last sequence; a new segment's directory entry is fsync'd too. ``durable=False``
(``bounded-async``): the watermark moves once the batch is written to the OS. That profile is not
crash-durable: records appended but not yet written are lost when the process dies
(``stats()["loss_window_records"]``; in loop mode they wait up to ``async_write_delay_s``, longer
while the loop is blocked), and written records the OS has not flushed are lost when the
machine dies. Either way a segment is fdatasync'd when it is sealed at rollover and at recovery,
so only the newest segment can ever end in a torn record.

A write or fdatasync error (EIO, ENOSPC, EROFS...) or the death of the writer thread makes the
writer unavailable for good: the watermark stays before the failed batch, and every pending and
later ``wait_durable`` and ``append`` raises :class:`WalUnavailable`. A restart recovers. Records
of a failed batch that did reach the disk are not erased (after EIO nothing can be trusted to
undo them): recovery keeps them if they verify, so the sink may see an ``attempt_started`` whose
request then failed with a 503, which it reports as an incomplete attempt.

Space
-----

``append`` reserves each record's bytes (and a header's, where it starts a segment) against
``max_bytes`` and raises :class:`WalFull` past it, so pending records are bounded too. Space comes
back when :meth:`WalReader.acknowledge` deletes segments: in this process it tells the writer at
once; after a ``WalFull`` the writer also re-measures the directory (at most every 50 ms), which
picks up deletions by a reader in another process (the Lambda extension). The newest segment is
never deleted, hence ``max_bytes >= 2 * segment_bytes``.

Reading
-------

:class:`WalReader` returns records in sequence order. In the writer's process it never returns
one above the durable watermark; in another process it returns the complete records on disk and
stops before a record still being written. ``acknowledge`` makes the checkpoint durable (temp
file, fdatasync, rename, directory fsync) before it deletes any segment whose records are all at
or below it.

Recovery
--------

:meth:`WalWriter.open` verifies every segment header and record. It truncates only a partial
final record of the newest segment (a file whose header was cut short while being created is
removed), and rejects with :class:`WalCorrupt` a bad checksum or impossible length followed by
more data, a record out of sequence, a damaged header or an unknown format version. Sequences
continue after the last valid record (or the ack checkpoint, if higher); records above the
checkpoint are unacknowledged, and the reader replays them. Each open starts a new segment.

Modules: ``wal_format`` (the bytes, and the error classes), ``wal_fs`` (the file-system seam
every byte goes through; tests inject faults there), ``wal_segments`` (the verifying scan),
``wal_recovery``, ``wal_reader``, and this one (the writer). Import the public names from here.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
import uuid
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tollway.audit.wal.format import (
    FORMAT_MAX_RECORD_BYTES,
    LOCK_FILE,
    MAX_HEADER_BYTES,
    RECORD_OVERHEAD,
    WalCommitTimeout,
    WalFull,
    WalUnavailable,
    encode_header,
    encode_record,
    segment_name,
)
from tollway.audit.wal.fs import OsFileSystem, WalFileSystem
from tollway.audit.wal.recovery import RecoveryReport, recover
from tollway.audit.wal.segments import list_segments, register_writer, unregister_writer, write_all

__all__ = ["COMMIT_WAIT_BUCKETS_S", "WalLimits", "WalWriter"]

log = logging.getLogger("tollway.audit")

COMMIT_WAIT_BUCKETS_S: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the append → watermark histogram in ``stats()`` (cumulative, plus ``inf``)."""
_IDLE_WAIT_S: Final = 0.5
_REFRESH_INTERVAL_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class WalLimits:
    """The spool limits of the ``audit.spool`` configuration block (its defaults are the seed's)."""

    max_bytes: int = 1024 * 1024 * 1024
    segment_bytes: int = 64 * 1024 * 1024
    max_record_bytes: int = 64 * 1024
    max_batch_records: int = 256
    max_batch_bytes: int = 1024 * 1024
    max_commit_delay_s: float = 0.001
    commit_timeout_s: float = 10.0
    async_write_delay_s: float = 0.01
    """Loop mode (:meth:`WalWriter.write_on_loop`, ``bounded-async`` in server mode): how long the
    first record of a batch waits in memory before the event loop writes the batch to the OS.
    It bounds the crash-loss window in time; ``max_commit_delay_s`` paces the writer thread."""

    def __post_init__(self) -> None:
        """Reject limits the WAL cannot honour, before anything is written."""
        if min(self.max_bytes, self.segment_bytes, self.max_record_bytes) < 1:
            raise ValueError("WAL byte limits must be positive")
        if min(self.max_batch_records, self.max_batch_bytes) < 1:
            raise ValueError("WAL batch limits must be positive")
        if self.max_commit_delay_s < 0 or self.async_write_delay_s < 0 or self.commit_timeout_s <= 0:
            raise ValueError("WAL commit and write delays must be >= 0 and commit timeout > 0")
        if self.max_record_bytes > FORMAT_MAX_RECORD_BYTES:
            raise ValueError(f"max_record_bytes above the format's {FORMAT_MAX_RECORD_BYTES}")
        if self.segment_bytes < MAX_HEADER_BYTES + RECORD_OVERHEAD + self.max_record_bytes:
            raise ValueError("segment_bytes must hold a header and one record of max_record_bytes")
        if self.max_bytes < 2 * self.segment_bytes:
            # The newest segment is never deleted, so the bound must leave room to roll past a full one.
            raise ValueError("max_bytes must be at least twice segment_bytes")


_NEW, _OPENING, _OPEN, _CLOSING, _CLOSED = "new", "opening", "open", "closing", "closed"
_Pending = tuple[int, bytes, float, bool]  # sequence, payload, append time, starts a new segment
_Waiter = tuple[int, int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class WalWriter:
    """The single writer of one WAL directory. ``append`` is thread-safe and never waits on I/O."""

    def __init__(
        self,
        directory: Path,
        *,
        instance_id: str,
        limits: WalLimits,
        durable: bool,
        fs: WalFileSystem | None = None,
    ) -> None:
        self._dir = Path(directory)
        self._instance_id = instance_id
        self._limits = limits
        self._durable = durable
        self._fs: WalFileSystem = fs if fs is not None else OsFileSystem()
        self._header_len = len(encode_header(uuid.UUID(int=0), instance_id, 0))  # ValueError for a bad id
        self._cond = threading.Condition(threading.Lock())
        self._state = _NEW
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._commit_lock = threading.Lock()
        """Held while a batch is taken from ``_pending`` and written, by the writer thread or by the
        event loop (:meth:`write_on_loop`), so batches reach the segment in sequence order."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._flush_scheduled = False
        self._handoff = False
        """Loop mode: the writer thread commits what is pending (a rollover is due, or the loop
        could not take the commit lock) until nothing is."""
        self._lock_fd: int | None = None
        self._pending: deque[_Pending] = deque()
        self._pending_bytes = 0
        self._appended = 0
        self._durable_seq = 0
        self._waiters: list[_Waiter] = []
        self._tiebreak = itertools.count()
        # Append-side projection of the disk once every pending record is written: the writer rolls
        # over exactly where append decided to (the flag in each pending tuple), so this is exact.
        self._projected = 0
        self._tail = 0
        self._tail_has_records = False
        self._refresh_wanted = False
        # Owned by the writer thread (and by open/close before and after it runs).
        self._fd: int | None = None
        self._active_name = ""
        self._active_size = 0
        self._last_refresh = 0.0
        # Published under the lock for stats().
        self._disk = 0
        self._segments = 0
        self._commits = self._fsyncs = self._records_written = self._bytes_written = 0
        self._rollovers = self._full_rejections = 0
        self._wait_counts = [0] * (len(COMMIT_WAIT_BUCKETS_S) + 1)
        self._wait_sum = 0.0

    @property
    def durable_watermark(self) -> int:
        """Highest sequence that is durable (``durable=True``) or written to the OS; never decreases."""
        return self._durable_seq

    @property
    def durable(self) -> bool:
        """Whether each batch is fdatasync'd before the watermark moves (``local-durable``)."""
        return self._durable

    @property
    def appended(self) -> int:
        """The last sequence handed out by :meth:`append` (or recovered by :meth:`open`)."""
        return self._appended

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Lock the directory, recover what is on disk, start a new segment and the writer thread.

        Raises :class:`WalCorrupt` for damage recovery must not repair, :class:`WalUnavailable` when
        the directory cannot be locked or written (another writer, EROFS, ENOSPC, EIO).
        """
        with self._cond:
            if self._state is not _NEW:
                raise RuntimeError("WalWriter.open() called twice")
            self._state = _OPENING
        fs = self._fs
        try:
            fs.makedirs(self._dir)
            self._lock_fd = fs.lock(self._dir / LOCK_FILE)
        except BlockingIOError:
            self._state = _CLOSED
            raise WalUnavailable(f"another writer holds {self._dir}") from None
        except OSError as exc:
            self._state = _CLOSED
            raise WalUnavailable(f"cannot open the WAL directory: {exc}") from exc
        try:
            report, disk, segments = recover(self._fs, self._dir)
            self._start_segment(report.last_sequence + 1, sync=True)
        except BaseException as exc:
            self._release()
            self._state = _CLOSED
            if isinstance(exc, OSError):
                raise WalUnavailable(f"WAL recovery failed: {exc}") from exc
            raise
        self._appended = self._durable_seq = report.last_sequence
        self._disk = self._projected = disk + self._active_size
        self._segments = segments + 1
        self._tail = self._active_size
        self._thread = threading.Thread(target=self._run, name=f"wal-writer:{self._dir.name}", daemon=True)
        self._state = _OPEN
        self._thread.start()
        register_writer(self._dir, self)
        return report

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is pending (fdatasync'd when durable), stop the thread, release the directory.

        Idempotent. Raises :class:`WalUnavailable` if the thread does not stop within ``timeout_s``.
        """
        with self._cond:
            if self._state in (_NEW, _OPENING, _CLOSED):
                self._state = _CLOSED
                return
            self._state = _CLOSING
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                stuck = WalUnavailable(f"the WAL writer did not stop within {timeout_s}s")
                self._settle_all(self._fail(stuck), self._unavailable())
                raise stuck
        # Loop mode: a flush that took the last batch just before the thread saw nothing pending
        # may still be writing it (the commit lock is held per write). Its waiters are settled by
        # that write, and the descriptors close only after it.
        flushed = self._commit_lock.acquire(timeout=timeout_s)
        if flushed:
            self._commit_lock.release()
        with self._cond:
            self._state = _CLOSED
            leftover, self._waiters = self._waiters, []
        self._settle_all(leftover, WalUnavailable("WAL writer closed"))
        if not flushed:
            # Closing the segment under a write could hand its descriptor number to another
            # open(): leak the descriptors instead, and fail the writer for good.
            stuck = WalUnavailable(f"a WAL write on the event loop did not finish within {timeout_s}s")
            self._settle_all(self._fail(stuck), self._unavailable())
            raise stuck
        self._release()
        unregister_writer(self._dir, self)

    def _release(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                try:
                    self._fs.close(fd)
                except OSError:
                    log.warning("closing a WAL descriptor failed", exc_info=True)
        self._fd = self._lock_fd = None

    def _start_segment(self, first_sequence: int, *, sync: bool) -> bytes:
        """Create ``wal-<first_sequence>.seg`` and return its header, which the caller writes.

        With ``sync`` the header is written and fdatasync'd and the directory entry fsync'd here
        (at open, so a read-only or full volume fails ``open`` rather than the first request).
        """
        fs = self._fs
        name = segment_name(first_sequence)
        fd = fs.open(self._dir / name, "create")
        self._fd, self._active_name = fd, name
        header = encode_header(uuid.uuid4(), self._instance_id, int(time.time() * 1000))
        self._active_size = 0
        if sync:
            write_all(fs, fd, header)
            self._active_size = len(header)
            fs.fdatasync(fd)
            fs.fsync_dir(self._dir)
            self._fsyncs += 1
        return header

    def write_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write batches from ``loop`` instead of waking the writer thread (``durable=False`` only).

        Call it from the loop's own thread. The first append after a write then arms one
        ``call_later`` of ``async_write_delay_s`` that writes what is pending to the OS on the loop
        itself: no thread wake-up, no GIL hand-off, no context switch per batch. Measured at 500
        RPS with 2 workers, that took 0.25 to 0.4 ms of CPU off each request (``docs/benchmarks.md``).
        The delay is the trade between the crash-loss window and the loop's wake-ups: each timer
        that fires on an idle loop is an epoll wake-up and a write, and at 10 ms against 1 ms the
        gateway used about 0.15 ms less CPU per request (*Audit trail: what got it within the targets*). A batch that
        starts a new segment still goes to the writer thread (sealing a segment fdatasyncs it),
        and so does everything at close. While the loop is blocked nothing is written, so the
        loss window (records not yet written) grows with the loop's lag.
        """
        if self._durable:
            raise ValueError("write_on_loop is for durable=False: a durable commit must not block the loop")
        with self._cond:
            self._loop = loop
            self._loop_thread = threading.get_ident()
            if self._pending and not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush_on_loop)

    # -- the request path -------------------------------------------------------------------------

    def append(self, payload: bytes) -> int:
        """Queue one record and return its sequence; the writer thread writes it.

        Raises ``ValueError`` for a payload over ``max_record_bytes``, :class:`WalFull` when it would
        take the WAL past ``max_bytes`` (retry after the shipper acknowledges), and
        :class:`WalUnavailable` when the writer is not open or has failed.
        """
        size = len(payload) + RECORD_OVERHEAD
        limits = self._limits
        if size - RECORD_OVERHEAD > limits.max_record_bytes:
            raise ValueError(f"audit record of {size - RECORD_OVERHEAD} bytes exceeds {limits.max_record_bytes}")
        dead: list[_Waiter] | None = None
        with self._cond:
            if self._state is not _OPEN or self._failure is not None:
                raise self._unavailable()
            if self._thread is not None and not self._thread.is_alive():
                dead = self._fail_locked(WalUnavailable("the WAL writer thread died"))
            else:
                rolls = self._tail_has_records and self._tail + size > limits.segment_bytes
                cost = size + self._header_len if rolls else size
                if self._projected + cost > limits.max_bytes:
                    self._full_rejections += 1
                    self._refresh_wanted = True
                    self._cond.notify()
                    raise WalFull(f"the audit WAL holds {self._projected} of {limits.max_bytes} bytes")
                seq = self._appended = self._appended + 1
                self._projected += cost
                self._tail = self._header_len + size if rolls else self._tail + size
                self._tail_has_records = True
                pending = self._pending
                pending.append((seq, payload, time.perf_counter(), rolls))
                self._pending_bytes += size
                if self._loop is not None:
                    if self._handoff:
                        self._cond.notify()  # the thread has the records until nothing is pending
                    elif not self._flush_scheduled:
                        self._schedule_flush_locked()
                    return seq
                if (
                    len(pending) == 1
                    or len(pending) >= limits.max_batch_records
                    or self._pending_bytes >= limits.max_batch_bytes
                ):
                    self._cond.notify()
                return seq
        self._settle_all(dead, self._unavailable())
        raise self._unavailable()

    def _schedule_flush_locked(self) -> None:
        """Loop mode: arm the loop's flush (from any thread); the writer thread takes over if the loop is gone."""
        loop = self._loop
        assert loop is not None
        self._flush_scheduled = True
        delay = self._limits.async_write_delay_s
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_later(delay, self._flush_on_loop)
            else:
                loop.call_soon_threadsafe(loop.call_later, delay, self._flush_on_loop)
        except RuntimeError:  # the loop is closed: back to the writer thread for good
            self._loop = None
            self._flush_scheduled = False
            self._cond.notify()

    def _flush_on_loop(self) -> None:
        """Loop mode: write what is pending, up to the first record that starts a new segment."""
        with self._cond:
            self._flush_scheduled = False
            if self._handoff or not self._pending or self._failure is not None or self._state is not _OPEN:
                return  # the writer thread has it (a hand-off, or close), or nothing is left
        if not self._commit_lock.acquire(blocking=False):
            with self._cond:  # the thread holds it (a rollover, a disk refresh): it takes the rest as well
                self._handoff = True
                self._cond.notify()
            return
        try:
            with self._cond:
                batch = self._take_batch_locked(before_rollover=True)
                pending = self._pending
                if pending and pending[0][3]:
                    self._handoff = True  # a new segment: sealing the current one fdatasyncs it
                    self._cond.notify()
                elif pending:  # more than one batch (the loop was busy): the rest next turn
                    self._flush_scheduled = True
                    assert self._loop is not None
                    self._loop.call_soon(self._flush_on_loop)
            if batch:
                self._commit(batch)
        except Exception as exc:  # an I/O error: the same end as in the writer thread
            self._settle_all(self._fail(exc), self._unavailable())
        finally:
            self._commit_lock.release()

    async def wait_durable(self, seq: int, timeout_s: float | None = None) -> None:
        """Return once ``durable_watermark >= seq``; never blocks the event loop.

        ``timeout_s`` defaults to ``commit_timeout_s``. Raises :class:`WalCommitTimeout` when it
        passes (the writer may still catch up), :class:`WalUnavailable` when the writer failed or
        closed before ``seq`` was committed, ``ValueError`` for a sequence never handed out.
        """
        if seq <= self._durable_seq:
            return
        loop = asyncio.get_running_loop()
        with self._cond:
            if seq <= self._durable_seq:
                return
            if seq > self._appended:
                raise ValueError(f"sequence {seq} was never appended (last is {self._appended})")
            if self._failure is not None or self._state not in (_OPEN, _CLOSING):
                raise self._unavailable()
            fut: asyncio.Future[None] = loop.create_future()
            heapq.heappush(self._waiters, (seq, next(self._tiebreak), loop, fut))
        timeout = self._limits.commit_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            thread = self._thread
            if thread is not None and not thread.is_alive() and self._state is _OPEN:
                self._settle_all(self._fail(WalUnavailable("the WAL writer thread died")), self._unavailable())
            if self._failure is not None:
                raise self._unavailable() from None
            raise WalCommitTimeout(f"record {seq} not committed within {timeout}s") from None

    def stats(self) -> dict[str, int | float]:
        """Counters for metrics.

        ``pending_*`` are records appended but not yet at the watermark. ``loss_window_*`` are the
        same numbers under the name the ``bounded-async`` documentation uses: what a process crash
        would lose right now (records not yet handed to the OS; with ``durable=True``, not yet
        fdatasync'd). ``write_delay_ms`` is how long a batch's first record waits before it is
        written (the loop's ``async_write_delay_s`` in loop mode, else ``max_commit_delay_s``).
        ``commit_wait_le_<s>s`` is the cumulative append → watermark histogram.
        """
        with self._cond:
            out: dict[str, int | float] = {
                "durable": int(self._durable),
                "writes_on_loop": int(self._loop is not None),
                "write_delay_ms": (
                    self._limits.async_write_delay_s if self._loop is not None else self._limits.max_commit_delay_s
                )
                * 1000,
                "available": int(self._failure is None and self._state is _OPEN),
                "bytes_on_disk": self._disk,
                "bytes_reserved": self._projected,
                "max_bytes": self._limits.max_bytes,
                "segments": self._segments,
                "appended": self._appended,
                "durable_watermark": self._durable_seq,
                "pending_records": self._appended - self._durable_seq,
                "pending_bytes": self._pending_bytes,
                "loss_window_records": self._appended - self._durable_seq,
                "loss_window_bytes": self._pending_bytes,
                "commits": self._commits,
                "fsyncs": self._fsyncs,
                "records_written": self._records_written,
                "bytes_written": self._bytes_written,
                "rollovers": self._rollovers,
                "full_rejections": self._full_rejections,
                "commit_wait_count": sum(self._wait_counts),
                "commit_wait_sum_s": self._wait_sum,
            }
            running = 0
            for bound, n in zip(COMMIT_WAIT_BUCKETS_S, self._wait_counts, strict=False):
                running += n
                out[f"commit_wait_le_{bound:g}s"] = running
            out["commit_wait_le_inf"] = running + self._wait_counts[-1]
        return out

    def request_refresh(self) -> None:
        """Ask the writer thread to re-measure the segments on disk (a reader deleted some)."""
        with self._cond:
            self._refresh_wanted = True
            self._last_refresh = 0.0
            self._cond.notify()

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                step = self._next_step()
                if step is None:
                    break
                with self._commit_lock:
                    with self._cond:
                        batch = self._take_batch_locked() if step else []
                    if batch:
                        self._commit(batch)
                    with self._cond:
                        if not self._pending:
                            self._handoff = False
                    if self._refresh_wanted and time.monotonic() - self._last_refresh >= _REFRESH_INTERVAL_S:
                        self._refresh_disk()
        except BaseException as exc:  # an I/O error, or anything that kills the thread mid-batch
            self._settle_all(self._fail(exc), self._unavailable())

    def _next_step(self) -> bool | None:
        """Wait for work: ``True`` when a batch is due (full by records or bytes, or
        ``max_commit_delay_s`` after its first append), ``False`` when only a refresh is, ``None``
        once closing with nothing pending. In loop mode the pending records are the loop's,
        unless it handed them over or the writer is closing."""
        limits, pending = self._limits, self._pending
        with self._cond:
            while True:
                if self._failure is not None or self._state is _CLOSED:
                    return None
                if pending and (self._loop is None or self._handoff or self._state is _CLOSING):
                    if (
                        self._state is _CLOSING
                        or self._handoff
                        or len(pending) >= limits.max_batch_records
                        or self._pending_bytes >= limits.max_batch_bytes
                    ):
                        return True
                    delay = pending[0][2] + limits.max_commit_delay_s - time.perf_counter()
                    if delay <= 0:
                        return True
                    self._cond.wait(delay)
                elif self._state is _CLOSING:
                    return None
                elif self._refresh_wanted and time.monotonic() - self._last_refresh >= _REFRESH_INTERVAL_S:
                    return False
                else:
                    self._cond.wait(_IDLE_WAIT_S if not self._refresh_wanted else _REFRESH_INTERVAL_S)

    def _take_batch_locked(self, *, before_rollover: bool = False) -> list[_Pending]:
        """Take the next batch from ``_pending`` (with the commit lock and ``_cond`` held): at most
        ``max_batch_records`` and ``max_batch_bytes``, and with ``before_rollover`` (the loop) none
        from the first record that starts a new segment on. Empty if the loop took everything
        meanwhile, or if a rollover is next."""
        limits, pending = self._limits, self._pending
        batch: list[_Pending] = []
        nbytes = 0
        while pending and len(batch) < limits.max_batch_records:
            if before_rollover and pending[0][3]:
                break
            size = len(pending[0][1]) + RECORD_OVERHEAD
            if batch and nbytes + size > limits.max_batch_bytes:
                break
            batch.append(pending.popleft())
            nbytes += size
        return batch

    def _commit(self, batch: list[_Pending]) -> None:
        """Write one batch (rolling over where append decided), fdatasync if durable, then advance."""
        fs = self._fs
        chunks: list[bytes] = []
        written = fsyncs = rollovers = 0
        for seq, payload, _, rolls in batch:
            if rolls:
                if chunks:
                    data = b"".join(chunks)
                    write_all(fs, self._require_fd(), data)
                    self._active_size += len(data)
                    written += len(data)
                chunks = [self._roll(seq)]
                fsyncs += 2 if self._durable else 1
                rollovers += 1
            chunks.append(encode_record(seq, payload))
        data = b"".join(chunks)
        write_all(fs, self._require_fd(), data)
        self._active_size += len(data)
        written += len(data)
        if self._durable:
            fs.fdatasync(self._require_fd())
            fsyncs += 1
        now = time.perf_counter()
        buckets = [bisect_left(COMMIT_WAIT_BUCKETS_S, now - appended_at) for _, _, appended_at, _ in batch]
        wait_sum = sum(now - appended_at for _, _, appended_at, _ in batch)
        committed_bytes = sum(len(p) + RECORD_OVERHEAD for _, p, _, _ in batch)
        with self._cond:
            for i in buckets:
                self._wait_counts[i] += 1
            self._durable_seq = batch[-1][0]
            self._pending_bytes -= committed_bytes
            self._disk += written
            self._segments += rollovers
            self._rollovers += rollovers
            self._commits += 1
            self._fsyncs += fsyncs
            self._records_written += len(batch)
            self._bytes_written += written
            self._wait_sum += wait_sum
            ready: list[_Waiter] = []
            waiters = self._waiters
            while waiters and waiters[0][0] <= self._durable_seq:
                ready.append(heapq.heappop(waiters))
        self._settle_all(ready, None)

    def _roll(self, first_sequence: int) -> bytes:
        """Seal the active segment (always fdatasync'd, so only the newest can be torn), start the next."""
        fs, fd = self._fs, self._require_fd()
        fs.fdatasync(fd)
        fs.close(fd)
        self._fd = None
        header = self._start_segment(first_sequence, sync=False)
        if self._durable:
            fs.fsync_dir(self._dir)
        return header

    def _require_fd(self) -> int:
        if self._fd is None:
            raise WalUnavailable("no active WAL segment")
        return self._fd

    def _refresh_disk(self) -> None:
        """Re-measure the segments: a reader (maybe in another process) deletes acknowledged ones."""
        total = count = 0
        for _, name in list_segments(self._fs, self._dir):
            if name == self._active_name:
                size = self._active_size
            else:
                try:
                    size = self._fs.stat_size(self._dir / name)
                except FileNotFoundError:
                    continue
            total += size
            count += 1
        with self._cond:
            self._refresh_wanted = False
            self._last_refresh = time.monotonic()
            self._projected += total - self._disk
            self._disk = total
            self._segments = count

    # -- failure ----------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> list[_Waiter]:
        with self._cond:
            return self._fail_locked(exc)

    def _fail_locked(self, exc: BaseException) -> list[_Waiter]:
        """Make the writer unavailable for good; returns the waiters to settle (outside the lock)."""
        if self._failure is None:
            self._failure = exc
            log.error("audit WAL writer for %s failed with %d records pending: %r", self._dir, len(self._pending), exc)
        waiters, self._waiters = self._waiters, []
        return waiters

    def _unavailable(self) -> WalUnavailable:
        if self._failure is not None:
            err = WalUnavailable(f"the audit WAL writer failed: {self._failure!r}")
            err.__cause__ = self._failure
            return err
        return WalUnavailable(f"the audit WAL writer is {self._state}")

    @staticmethod
    def _settle_all(waiters: list[_Waiter] | None, exc: WalUnavailable | None) -> None:
        """Wake waiters on their own loops (one call per loop), never blocking either side."""
        if not waiters:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for _, _, loop, fut in waiters:
            by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, futs, exc)
            except RuntimeError:
                continue  # that loop is closed: nobody is waiting on it any more


def _settle(futs: list[asyncio.Future[None]], exc: WalUnavailable | None) -> None:
    for fut in futs:
        if fut.done():
            continue  # the waiter timed out or was cancelled
        if exc is None:
            fut.set_result(None)
        else:
            err = WalUnavailable(str(exc))
            err.__cause__ = exc.__cause__
            fut.set_exception(err)
