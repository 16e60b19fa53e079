"""Loop mode (``WalWriter.write_on_loop``): bounded-async batches written by the event loop itself.

The loop writes plain batches; a rollover (which fdatasyncs the sealed segment), close, and a
loop that cannot take the commit lock hand the work to the writer thread. Either way the
records reach the segments once each, in sequence order, and an I/O error on the loop ends the
writer as it would on the thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import threading
import time
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import (
    SMALL,
    Fault,
    FaultFs,
    async_wait_until,
    fill_until_full,
    open_writer,
    segment_files,
)
from tollway.audit.wal import WalFull, WalReader, WalUnavailable


class ThreadFs(FaultFs):
    """``FaultFs`` that also records which thread made each call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[tuple[str, str, int]] = []

    def _before(self, op: str, name: str) -> Fault | None:
        self.threads.append((op, name, threading.get_ident()))
        return super()._before(op, name)

    def by(self, op: str, thread: int, since: int = 0) -> list[str]:
        return [name for o, name, t in self.threads[since:] if o == op and t == thread]


def sequences(directory: Path) -> list[int]:
    reader = WalReader(directory)
    return [r.sequence for r in reader.read(0, 10_000, 1 << 30)]


async def test_the_loop_writes_the_batches_and_the_writer_thread_stays_asleep(tmp_path: Path) -> None:
    fs = ThreadFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)
    writer.write_on_loop(asyncio.get_running_loop())
    loop_thread = threading.get_ident()
    last = 0
    for _ in range(20):
        for n in range(5):
            last = writer.append(b"event-%d" % n)
        await asyncio.sleep(0.003)
    await async_wait_until(lambda: writer.durable_watermark == last)
    writes = [t for op, _, t in fs.threads if op == "write"]  # the first is open()'s header, on this thread too
    assert len(writes) > 1 and set(writes) == {loop_thread}
    assert writer.stats()["commits"] >= 2, "appends a few ms apart are separate batches"
    writer.close()
    assert sequences(tmp_path) == list(range(1, last + 1))


async def test_a_rollover_goes_to_the_writer_thread_and_the_order_holds(tmp_path: Path) -> None:
    fs = ThreadFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)  # 8 KiB segments
    opened = len(fs.threads)  # open() synced the first segment's header on this thread
    writer.write_on_loop(asyncio.get_running_loop())
    loop_thread = threading.get_ident()
    last = 0
    for _ in range(40):
        for _ in range(4):
            last = writer.append(b"x" * 300)
        await asyncio.sleep(0.002)
    await async_wait_until(lambda: writer.durable_watermark == last)
    assert writer.stats()["rollovers"] >= 2
    # Sealing a segment fdatasyncs it: never on the loop. Plain batches: on the loop.
    assert fs.by("fdatasync", loop_thread, since=opened) == []
    assert fs.by("write", loop_thread, since=opened), "the loop wrote no batch at all"
    writer.close()
    assert sequences(tmp_path) == list(range(1, last + 1))


async def test_close_writes_what_the_loop_had_not_written_yet(tmp_path: Path) -> None:
    slow = dataclasses.replace(SMALL, async_write_delay_s=30.0)  # the loop's flush would come much later
    writer = open_writer(tmp_path, durable=False, limits=slow)
    writer.write_on_loop(asyncio.get_running_loop())
    last = 0
    for n in range(10):
        last = writer.append(b"pending-%d" % n)
    assert writer.durable_watermark == 0
    await asyncio.to_thread(writer.close)
    assert sequences(tmp_path) == list(range(1, last + 1))
    await asyncio.sleep(0)  # the loop's pending flush finds the writer closed and does nothing


async def test_appends_from_another_thread_are_written_too(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    writer.write_on_loop(asyncio.get_running_loop())
    seqs: list[int] = []
    await asyncio.to_thread(lambda: seqs.extend(writer.append(b"from-a-thread") for _ in range(30)))
    await async_wait_until(lambda: writer.durable_watermark == max(seqs))
    writer.close()
    assert sequences(tmp_path) == sorted(seqs) == list(range(1, 31))


async def test_an_io_error_on_the_loop_makes_the_writer_unavailable(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)
    writer.write_on_loop(asyncio.get_running_loop())
    fs.add(Fault("write", error=OSError(errno.EIO, "disk gone")))
    writer.append(b"doomed")
    await async_wait_until(lambda: writer.stats()["available"] == 0)
    with pytest.raises(WalUnavailable):
        writer.append(b"after")
    writer.close()


async def test_a_durable_writer_refuses_loop_mode(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=True)
    try:
        with pytest.raises(ValueError, match="durable"):
            writer.write_on_loop(asyncio.get_running_loop())
    finally:
        writer.close()


async def test_close_waits_for_the_batch_the_loop_is_writing(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)
    writer.write_on_loop(asyncio.get_running_loop())
    gate = fs.add(Fault("write", gate=threading.Event()))  # holds the loop's batch write
    closed = threading.Event()

    def close_while_the_loop_writes() -> None:
        assert gate.entered.wait(5)
        closer = threading.Thread(target=lambda: (writer.close(), closed.set()))
        closer.start()
        # By now close() has seen nothing pending (the loop took it) and stopped the thread:
        # without waiting for the loop's write it would close the descriptors under it.
        time.sleep(0.2)
        assert gate.gate is not None
        gate.gate.set()
        closer.join(5)

    helper = threading.Thread(target=close_while_the_loop_writes)
    helper.start()
    writer.append(b"in flight")
    await asyncio.sleep(0.05)  # the loop's flush runs, and blocks in the write until the helper opens it
    helper.join(10)
    assert closed.is_set()
    assert sequences(tmp_path) == [1]


async def test_a_backlog_is_written_in_batches_of_at_most_max_batch_bytes(tmp_path: Path) -> None:
    limits = dataclasses.replace(
        SMALL, max_bytes=4 << 20, segment_bytes=1 << 20, max_record_bytes=2048, max_batch_bytes=16 << 10
    )
    fs = FaultFs()
    writer = open_writer(tmp_path, durable=False, limits=limits, fs=fs)
    writer.write_on_loop(asyncio.get_running_loop())
    writes_at_open = len(fs.ops("write"))
    last = 0
    for _ in range(100):  # ~100 KiB appended while the loop is busy with this coroutine
        last = writer.append(b"r" * 1000)
    await async_wait_until(lambda: writer.durable_watermark == last)
    batch_writes = len(fs.ops("write")) - writes_at_open
    assert batch_writes >= 100 * 1000 // (16 << 10), "one write per batch of at most max_batch_bytes"
    writer.close()
    assert sequences(tmp_path) == list(range(1, last + 1))


async def test_a_flush_that_finds_the_commit_lock_taken_hands_its_records_to_the_writer_thread(
    tmp_path: Path,
) -> None:
    """The writer thread holds the commit lock while it re-measures the disk; a loop flush that
    fires meanwhile must not wait for it on the loop: the thread writes those records after."""
    fs = ThreadFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)  # 8 KiB segments
    writer.write_on_loop(asyncio.get_running_loop())
    loop_thread = threading.get_ident()
    last = 0
    for _ in range(30):
        last = writer.append(b"s" * 1000)
    await async_wait_until(lambda: writer.durable_watermark == last)
    assert len(segment_files(tmp_path)) >= 3, "the refresh must have sealed segments to measure"
    gate = fs.add(Fault("stat_size", gate=threading.Event()))
    writer.request_refresh()
    assert await asyncio.to_thread(gate.entered.wait, 5), "the refresh never reached the gate"  # it holds the lock
    mark = len(fs.threads)
    first_held = writer.append(b"while the thread refreshes")
    held = [first_held] + [writer.append(b"and more") for _ in range(3)]
    await asyncio.sleep(0.05)  # the loop's flush has fired, found the lock taken, and returned
    assert writer.durable_watermark == last, "nothing may be written while the lock is held"
    assert fs.by("write", loop_thread, since=mark) == []
    assert gate.gate is not None
    gate.gate.set()
    await async_wait_until(lambda: writer.durable_watermark == held[-1])
    written_by = {t for op, _, t in fs.threads[mark:] if op == "write"}
    assert written_by and loop_thread not in written_by, "the writer thread wrote the handed-over records"
    after = 0
    for _ in range(20):  # the thread ends the hand-over just after its write: the loop's turn comes next
        mark = len(fs.threads)
        after = writer.append(b"the loop writes again")
        await async_wait_until(lambda seq=after: writer.durable_watermark == seq)
        if fs.by("write", loop_thread, since=mark):
            break
    else:
        raise AssertionError("the loop never took the writes back once nothing was pending")
    writer.close()
    assert sequences(tmp_path) == list(range(1, after + 1))


async def test_a_full_wal_in_loop_mode_refuses_appends_until_a_reader_frees_space(tmp_path: Path) -> None:
    """WalFull asks the writer thread to re-measure the disk; once another process (the ship
    process) has deleted acknowledged segments, appends on the loop are accepted and written."""
    writer = open_writer(tmp_path, durable=False)
    writer.write_on_loop(asyncio.get_running_loop())
    accepted = fill_until_full(writer)
    assert 40 < accepted < SMALL.max_bytes // 1000
    await async_wait_until(lambda: writer.durable_watermark == accepted)
    with pytest.raises(WalFull):
        writer.append(b"e" * 1000)  # nothing freed yet
    WalReader(tmp_path).acknowledge(accepted)  # deletes every sealed segment, as a shipper does
    seqs: list[int] = []

    def retry() -> bool:
        try:
            seqs.append(writer.append(b"after the shipper freed space"))
        except WalFull:
            return False
        return True

    await async_wait_until(retry)
    assert seqs == [accepted + 1]
    await async_wait_until(lambda: writer.durable_watermark == seqs[0])
    assert writer.stats()["full_rejections"] >= 2
    writer.close()
    assert [r.payload for r in WalReader(tmp_path).read(accepted, 10, 1 << 20)] == [b"after the shipper freed space"]


async def test_the_loop_writes_after_async_write_delay_not_the_threads_commit_delay(tmp_path: Path) -> None:
    limits = dataclasses.replace(SMALL, max_commit_delay_s=0.001, async_write_delay_s=0.3)
    writer = open_writer(tmp_path, durable=False, limits=limits)
    writer.write_on_loop(asyncio.get_running_loop())
    first = writer.append(b"first")
    await asyncio.sleep(0.05)  # 50 times the thread's commit delay, a sixth of the loop's
    second = writer.append(b"second")
    stats = writer.stats()
    assert writer.durable_watermark == 0, "nothing is written before async_write_delay_s"
    assert (stats["loss_window_records"], stats["write_delay_ms"]) == (2, 300)
    await async_wait_until(lambda: writer.durable_watermark == second)
    assert writer.stats()["commits"] == 1, "both records went out in the one write the first append armed"
    writer.close()
    assert sequences(tmp_path) == [first, second]


async def test_a_zero_async_write_delay_writes_on_the_next_loop_turn(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False, limits=dataclasses.replace(SMALL, async_write_delay_s=0.0))
    writer.write_on_loop(asyncio.get_running_loop())
    seq = writer.append(b"now")
    assert writer.durable_watermark == 0
    await async_wait_until(lambda: writer.durable_watermark == seq)
    assert writer.stats()["write_delay_ms"] == 0
    writer.close()


async def test_the_writer_thread_ignores_the_loops_write_delay(tmp_path: Path) -> None:
    limits = dataclasses.replace(SMALL, max_commit_delay_s=0.001, async_write_delay_s=60.0)
    writer = open_writer(tmp_path, durable=False, limits=limits)  # no write_on_loop: the thread writes
    seq = writer.append(b"threaded")
    await async_wait_until(lambda: writer.durable_watermark == seq)  # long before 60 s
    assert writer.stats()["write_delay_ms"] == 1
    writer.close()
