"""The shipper's side: ordered reads up to the watermark, the durable checkpoint, segment deletion, replay."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import (
    SMALL,
    Fault,
    FaultFs,
    async_wait_until,
    open_writer,
    segment_files,
)
from tollway.audit.wal import WalReader, WalWriter
from tollway.audit.wal.format import segment_first_sequence


def first_sequence(path: Path) -> int:
    first = segment_first_sequence(path.name)
    assert first is not None
    return first


def fill(directory: Path, count: int, size: int = 1000) -> list[bytes]:
    """``count`` records over several segments (8 KiB each), closed, the writer gone."""
    writer = open_writer(directory, durable=False)
    payloads = [bytes([65 + n % 26]) * size + b"#%d" % n for n in range(count)]
    for p in payloads:
        writer.append(p)
    writer.close()
    return payloads


def test_reads_are_ordered_and_bounded_by_records_and_bytes(tmp_path: Path) -> None:
    payloads = fill(tmp_path, 30)
    reader = WalReader(tmp_path)
    assert [r.sequence for r in reader.read(0, 5, 1 << 20)] == [1, 2, 3, 4, 5]
    assert not reader.caught_up  # stopped at max_records with more to read
    by_bytes = reader.read(5, 100, 3 * 1010)
    assert [r.sequence for r in by_bytes] == [6, 7, 8]
    assert [r.payload for r in by_bytes] == payloads[5:8]
    assert not reader.caught_up  # stopped at max_bytes
    assert [r.sequence for r in reader.read(27, 100, 1 << 20)] == [28, 29, 30]
    assert reader.caught_up
    assert [r.sequence for r in reader.read(26, 4, 1 << 20)] == [27, 28, 29, 30]
    assert reader.caught_up  # exactly max_records, and nothing after them
    assert reader.read(30, 100, 1 << 20) == []
    assert reader.caught_up


def test_a_read_that_ends_where_a_sealed_segment_ends_is_not_caught_up(tmp_path: Path) -> None:
    fill(tmp_path, 30)
    firsts = [first_sequence(p) for p in segment_files(tmp_path)]
    assert len(firsts) >= 3
    reader = WalReader(tmp_path)
    whole_first = firsts[1] - 1
    assert [r.sequence for r in reader.read(0, whole_first, 1 << 20)] == list(range(1, firsts[1]))
    assert not reader.caught_up  # the next segment is readable now
    spanning = reader.read(whole_first - 1, 3, 1 << 20)  # across the boundary
    assert [r.sequence for r in spanning] == [whole_first, whole_first + 1, whole_first + 2]
    assert not reader.caught_up
    last = reader.read(firsts[-1] - 1, 1000, 1 << 20)
    assert [r.sequence for r in last] == list(range(firsts[-1], 31))
    assert reader.caught_up


def test_one_record_is_returned_even_when_larger_than_max_bytes(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    records = WalReader(tmp_path).read(0, 10, 10)
    assert [r.sequence for r in records] == [1]


def test_reading_forward_in_small_steps_crosses_segments_without_gaps(tmp_path: Path) -> None:
    payloads = fill(tmp_path, 40)
    assert len(segment_files(tmp_path)) >= 4
    reader = WalReader(tmp_path)
    seen: list[bytes] = []
    after = 0
    for _ in range(100):
        batch = reader.read(after, 3, 1 << 20)
        if not batch:
            break
        assert [r.sequence for r in batch] == list(range(after + 1, after + 1 + len(batch)))
        seen += [r.payload for r in batch]
        after = batch[-1].sequence
    assert seen == payloads
    assert [r.sequence for r in reader.read(10, 2, 1 << 20)] == [11, 12]  # and backwards again


def test_an_empty_or_missing_directory_reads_nothing(tmp_path: Path) -> None:
    reader = WalReader(tmp_path / "never-created")
    assert reader.read(0, 10, 100) == []
    assert reader.acked == 0
    with pytest.raises(ValueError):
        reader.read(0, 0, 100)


async def test_in_process_reads_stop_at_the_durable_watermark(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    first = writer.append(b"durable")
    await writer.wait_durable(first)
    gate = fs.add(Fault("fdatasync", gate=threading.Event()))
    second = writer.append(b"written, not yet synced")
    await async_wait_until(gate.entered.is_set)
    assert b"written, not yet synced" in segment_files(tmp_path)[-1].read_bytes()
    reader = WalReader(tmp_path)
    assert [r.sequence for r in reader.read(0, 10, 1 << 20)] == [first]
    assert reader.caught_up  # what follows is not durable yet: nothing more to read now
    assert reader.read(first, 10, 1 << 20) == []
    assert reader.caught_up
    assert gate.gate is not None
    gate.gate.set()
    await writer.wait_durable(second)
    assert [r.sequence for r in reader.read(first, 10, 1 << 20)] == [second]
    writer.close()


def test_another_process_reads_only_complete_records(tmp_path: Path) -> None:
    """With no writer in this process, a record still being written (a partial tail) is not returned yet."""
    fill(tmp_path, 3)
    newest = segment_files(tmp_path)[-1]
    complete = newest.read_bytes()
    with newest.open("ab") as f:
        f.write(b"\x10\x00\x00\x00partial")
    reader = WalReader(tmp_path)
    assert [r.sequence for r in reader.read(0, 10, 1 << 20)] == [1, 2, 3]
    assert newest.read_bytes() != complete, "reading never repairs"


def test_acknowledge_checkpoints_durably_before_deleting_any_segment(tmp_path: Path) -> None:
    fill(tmp_path, 40)
    before = segment_files(tmp_path)
    firsts = [first_sequence(p) for p in before]
    fs = FaultFs()
    reader = WalReader(tmp_path, fs=fs)
    ack = firsts[2] - 1 + 2  # every record of the first two segments, and two of the third
    reader.acknowledge(ack)
    assert reader.acked == ack == WalReader(tmp_path).acked
    ops = [op for op, _ in fs.calls if op not in ("fdatasync:done", "open:read")]
    assert ops[:5] == ["open:replace", "write", "fdatasync", "rename", "fsync_dir"]
    assert fs.ops("unlink") == [p.name for p in before[:2]]
    assert ops[5:] == ["unlink", "unlink", "fsync_dir"]
    assert segment_files(tmp_path) == before[2:]
    assert [r.sequence for r in reader.read(ack, 3, 1 << 20)] == [ack + 1, ack + 2, ack + 3]


def test_the_newest_segment_is_kept_even_when_fully_acknowledged(tmp_path: Path) -> None:
    fill(tmp_path, 40)
    newest = segment_files(tmp_path)[-1]
    reader = WalReader(tmp_path)
    reader.acknowledge(40)
    assert segment_files(tmp_path) == [newest]
    assert reader.read(40, 10, 1 << 20) == []
    reader.acknowledge(12)  # lower than the checkpoint: no effect
    assert WalReader(tmp_path).acked == 40


def test_restart_replays_exactly_the_unacknowledged_records(tmp_path: Path) -> None:
    payloads = fill(tmp_path, 30)
    reader = WalReader(tmp_path)
    shipped = reader.read(0, 17, 1 << 20)
    reader.acknowledge(shipped[-1].sequence)

    oldest_kept = first_sequence(segment_files(tmp_path)[0])
    assert 1 < oldest_kept <= 18

    writer = WalWriter(tmp_path, instance_id="gw-restarted", limits=SMALL, durable=True)
    report = writer.open()
    assert (report.unacked_records, report.last_sequence) == (13, 30)
    assert report.records == 30 - (oldest_kept - 1)
    after_restart = WalReader(tmp_path)
    assert after_restart.acked == 17
    replay = after_restart.read(after_restart.acked, 100, 1 << 20)
    assert [(r.sequence, r.payload) for r in replay] == list(enumerate(payloads, start=1))[17:]
    assert writer.append(b"new") == 31
    writer.close()


async def test_a_live_writer_and_reader_in_one_process_ship_everything_once(tmp_path: Path) -> None:
    """The server-mode shape: appends, a shipper task reading and acknowledging, segments freed as it goes."""
    writer = open_writer(tmp_path)
    reader = WalReader(tmp_path)
    shipped: list[int] = []

    async def ship() -> None:
        for _ in range(2000):
            batch = reader.read(reader.acked, 7, 1 << 20)
            if batch:
                shipped.extend(r.sequence for r in batch)
                reader.acknowledge(batch[-1].sequence)
            elif len(shipped) == 120:
                return
            await asyncio.sleep(0.001)

    shipper = asyncio.ensure_future(ship())
    for _ in range(120):
        seq = writer.append(b"e" * 900)
        await writer.wait_durable(seq)
    await asyncio.wait_for(shipper, 10)
    assert shipped == list(range(1, 121))
    assert len(segment_files(tmp_path)) <= 2
    writer.close()


def test_a_reader_notices_that_a_restarted_writer_replaced_the_newest_segment(tmp_path: Path) -> None:
    """An empty newest segment is replaced at restart under the same name, with a different header length."""
    first = WalWriter(tmp_path, instance_id="a", limits=SMALL, durable=False)
    first.open()
    first.append(b"one")
    first.close()
    second = WalWriter(tmp_path, instance_id="b", limits=SMALL, durable=False)
    second.open()  # starts an empty wal-2
    second.close()
    reader = WalReader(tmp_path)
    assert [r.sequence for r in reader.read(0, 10, 1 << 20)] == [1]  # the cursor now sits in the empty wal-2
    replacement = WalWriter(tmp_path, instance_id="a-much-longer-instance-id", limits=SMALL, durable=False)
    replacement.open()
    replacement.append(b"two")
    replacement.close()
    assert [(r.sequence, r.payload) for r in reader.read(1, 10, 1 << 20)] == [(2, b"two")]
