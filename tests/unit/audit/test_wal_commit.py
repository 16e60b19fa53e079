"""Group commit and the durable watermark: when ``wait_durable`` may return, and what one fdatasync covers."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import SMALL, Fault, FaultFs, async_wait_until, open_writer, wait_until
from tollway.audit.wal import WalLimits, WalReader


async def test_wait_durable_returns_only_after_the_fdatasync_of_its_batch(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    segment = fs.ops("fdatasync")[-1]  # the new segment's header sync at open
    gate = fs.add(Fault("fdatasync", match=segment, gate=threading.Event()))
    seq = writer.append(b"attempt_started")
    waiter = asyncio.ensure_future(writer.wait_durable(seq))
    await async_wait_until(gate.entered.is_set)
    assert fs.ops("write", segment), "the batch is written to the OS before its fdatasync"
    await asyncio.sleep(0.05)
    assert not waiter.done()
    assert writer.durable_watermark == seq - 1
    fs.mark("released")
    assert gate.gate is not None
    gate.gate.set()
    await asyncio.wait_for(waiter, 5)
    fs.mark("durable", str(seq))
    order = fs.calls
    released, durable = order.index(("released", "")), order.index(("durable", str(seq)))
    assert order[released + 1 : durable] == [("fdatasync:done", segment)]
    assert writer.durable_watermark == seq
    writer.close()


async def test_group_commit_covers_many_appends_with_one_fdatasync(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    segment = fs.ops("fdatasync")[-1]
    syncs_at_open = len(fs.ops("fdatasync", segment))
    gate = fs.add(Fault("fdatasync", match=segment, gate=threading.Event()))
    first = writer.append(b"first")
    await async_wait_until(gate.entered.is_set)  # the writer is inside the first batch's fdatasync
    rest = [writer.append(b"event-%d" % i) for i in range(50)]
    assert gate.gate is not None
    gate.gate.set()
    await asyncio.gather(*(writer.wait_durable(s) for s in [first, *rest]))
    assert len(fs.ops("fdatasync", segment)) - syncs_at_open == 2
    assert writer.stats()["commits"] == 2
    assert writer.stats()["records_written"] == 51
    writer.close()


async def test_a_batch_is_bounded_by_max_batch_records(tmp_path: Path) -> None:
    limits = dataclasses.replace(SMALL, max_batch_records=8, max_commit_delay_s=0.05)
    writer = open_writer(tmp_path, limits=limits)
    seqs = [writer.append(b"x") for _ in range(40)]
    await writer.wait_durable(seqs[-1])
    stats = writer.stats()
    assert stats["commits"] >= 5
    assert stats["records_written"] == 40
    writer.close()


async def test_the_watermark_never_moves_backwards(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        for _ in range(200_000):
            if stop.is_set():
                return
            samples.append(writer.durable_watermark)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for _ in range(20):
        seqs = [writer.append(b"e" * 100) for _ in range(10)]
        await writer.wait_durable(seqs[-1])
        assert writer.durable_watermark >= seqs[-1]
    stop.set()
    sampler.join(5)
    assert samples == sorted(samples)
    assert samples[-1] <= writer.appended == 200
    writer.close()


async def test_bounded_async_advances_once_written_without_fdatasync(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)
    segment = fs.ops("fdatasync")[-1]
    syncs_at_open = len(fs.ops("fdatasync"))
    gate = fs.add(Fault("write", match=segment, gate=threading.Event()))
    seqs = [writer.append(b"e" * 100) for _ in range(5)]
    await async_wait_until(gate.entered.is_set)
    stats = writer.stats()
    assert stats["durable"] == 0
    assert (stats["loss_window_records"], stats["loss_window_bytes"]) == (5, 5 * 116)
    assert gate.gate is not None
    gate.gate.set()
    await writer.wait_durable(seqs[-1])
    assert writer.stats()["loss_window_records"] == 0
    assert len(fs.ops("fdatasync")) == syncs_at_open, "bounded-async never fsyncs on the commit path"
    writer.close()
    assert len(fs.ops("fdatasync")) == syncs_at_open


def test_appends_from_many_threads_get_increasing_sequences_without_gaps(tmp_path: Path) -> None:
    limits = WalLimits(max_bytes=8 * 1024 * 1024, segment_bytes=256 * 1024, max_record_bytes=1024)
    writer = open_writer(tmp_path, limits=limits)
    results: dict[int, list[tuple[int, bytes]]] = {}
    start = threading.Barrier(4)

    def produce(worker: int) -> None:
        start.wait(5)
        mine = []
        for i in range(500):
            payload = b"w%d-%d" % (worker, i)
            mine.append((writer.append(payload), payload))
        results[worker] = mine

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    writer.close()
    for mine in results.values():
        seqs = [s for s, _ in mine]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    by_seq = dict(pair for mine in results.values() for pair in mine)
    assert sorted(by_seq) == list(range(1, 2001))
    records = WalReader(tmp_path).read(0, 5000, 1 << 30)
    assert [(r.sequence, r.payload) for r in records] == sorted(by_seq.items())


def test_waiters_on_several_event_loops_are_each_woken_on_their_own_loop(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    woken: dict[int, bool] = {}

    def wait_in_own_loop(n: int) -> None:
        async def main() -> None:
            seq = writer.append(b"loop-%d" % n)
            await writer.wait_durable(seq, timeout_s=5)
            woken[n] = seq <= writer.durable_watermark

        asyncio.run(main())

    threads = [threading.Thread(target=wait_in_own_loop, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    writer.close()
    assert woken == {0: True, 1: True, 2: True}


async def test_wait_durable_rejects_a_sequence_never_appended(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    writer.append(b"one")
    with pytest.raises(ValueError, match="never appended"):
        await writer.wait_durable(2)
    await writer.wait_durable(1)
    await writer.wait_durable(0)
    writer.close()


def test_close_writes_everything_pending(tmp_path: Path) -> None:
    limits = dataclasses.replace(SMALL, max_commit_delay_s=1.0)
    writer = open_writer(tmp_path, durable=False, limits=limits)
    for i in range(100):
        writer.append(b"e%d" % i)
    writer.close()
    assert writer.durable_watermark == 100
    assert [r.payload for r in WalReader(tmp_path).read(0, 1000, 1 << 20)] == [b"e%d" % i for i in range(100)]


def test_stats_count_commits_fsyncs_and_the_commit_wait_histogram(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    for _ in range(10):
        writer.append(b"e" * 600)
    wait_until(lambda: writer.durable_watermark == 10)
    stats = writer.stats()
    writer.close()
    assert stats["appended"] == stats["durable_watermark"] == stats["records_written"] == 10
    assert stats["fsyncs"] >= stats["commits"] + 1 >= 2
    assert stats["commit_wait_count"] == stats["commit_wait_le_inf"] == 10
    buckets = [v for k, v in stats.items() if k.startswith("commit_wait_le_")]
    assert buckets == sorted(buckets)
    assert stats["commit_wait_sum_s"] > 0
    assert stats["bytes_on_disk"] == sum(p.stat().st_size for p in tmp_path.glob("wal-*.seg"))
