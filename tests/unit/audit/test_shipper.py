"""The shipper against an in-memory WAL and sink: packing limits, ack-after-send, backoff, the server loop."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field

import pytest

from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import MAX_MESSAGE_BYTES, MAX_MESSAGE_EVENTS, SinkUnavailable


@dataclass(frozen=True)
class Record:
    sequence: int
    payload: bytes


@dataclass
class MemoryWal:
    """The ``WalReader`` surface over a list: sequences from 1, an ack checkpoint, bounded reads."""

    records: list[Record] = field(default_factory=list)
    acked: int = 0
    acks: list[int] = field(default_factory=list)
    caught_up: bool = True
    """Whether the last read returned every record there was (the ``WalReader`` property)."""

    def append(self, payload: bytes) -> int:
        seq = len(self.records) + 1
        self.records.append(Record(seq, payload))
        return seq

    def read(self, after_seq: int, max_records: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        size = 0
        for record in self.records[after_seq:]:
            if out and (len(out) == max_records or size + len(record.payload) > max_bytes):
                break
            out.append(record)
            size += len(record.payload)
        self.caught_up = after_seq + len(out) == len(self.records)
        return out

    def acknowledge(self, seq: int) -> None:
        assert seq > self.acked, "acknowledgements only move forward"
        self.acked = seq
        self.acks.append(seq)


@dataclass
class MemorySink:
    """Accepts whole batches, or fails whole batches while ``fail`` is positive (all-or-nothing)."""

    wal: MemoryWal | None = None
    fail: int = 0
    batches: list[list[bytes]] = field(default_factory=list)
    acked_at_send: list[int] = field(default_factory=list)
    calls: int = 0

    def send(self, batch: list[bytes]) -> None:
        self.calls += 1
        if self.wal is not None:
            self.acked_at_send.append(self.wal.acked)
        if self.fail > 0:
            self.fail -= 1
            raise SinkUnavailable("queue down")
        self.batches.append(list(batch))

    @property
    def messages(self) -> list[bytes]:
        return [m for batch in self.batches for m in batch]

    def events(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for message in self.messages:
            doc = json.loads(message)
            assert doc["v"] == 1
            assert 1 <= len(doc["events"]) <= MAX_MESSAGE_EVENTS
            out.extend(doc["events"])
        return out


def event(n: int, request: str = "req", pad: int = 0) -> bytes:
    return json.dumps({"eventId": f"e{n}", "requestId": request, "n": n, "pad": "x" * pad}).encode()


def shipper(wal: MemoryWal, sink: MemorySink, **kw: float) -> Shipper:
    opts: dict[str, float] = {"batch_records": 256, "batch_bytes": 1 << 20, "idle_s": 0.01, "max_backoff_s": 0.4}
    opts.update(kw)
    return Shipper(wal, sink, **opts)  # type: ignore[arg-type]


def test_messages_hold_at_most_64_events_in_sequence_order() -> None:
    wal, sink = MemoryWal(), MemorySink()
    for n in range(150):
        wal.append(event(n))
    assert shipper(wal, sink).drain_once() == 150
    assert [len(json.loads(m)["events"]) for m in sink.messages] == [64, 64, 22]
    assert [e["n"] for e in sink.events()] == list(range(150))
    assert wal.acked == 150


def test_messages_stay_within_200_kib_and_are_packed_tightly() -> None:
    wal, sink = MemoryWal(), MemorySink()
    for n in range(20):
        wal.append(event(n, pad=30_000 + n * 500))
    assert shipper(wal, sink).drain_once() == 20
    sizes = [len(m) for m in sink.messages]
    assert all(size <= MAX_MESSAGE_BYTES for size in sizes)
    counts = [len(json.loads(m)["events"]) for m in sink.messages]
    first = 0
    for message, count in zip(sink.messages[:-1], counts[:-1], strict=True):
        following = wal.records[first + count].payload
        assert len(message) + 1 + len(following) > MAX_MESSAGE_BYTES, "the next event would have fit"
        first += count
    assert [e["n"] for e in sink.events()] == list(range(20))


def test_an_event_of_exactly_the_limit_ships_alone_and_a_larger_one_is_skipped_not_stuck() -> None:
    wal, sink = MemoryWal(), MemorySink()
    envelope = len(b'{"v":1,"events":[]}')
    base = len(event(0, pad=0))
    wal.append(event(0))
    wal.append(event(1, pad=MAX_MESSAGE_BYTES - envelope - base))
    wal.append(event(2, pad=MAX_MESSAGE_BYTES - envelope - base + 1))
    wal.append(b"not json")
    wal.append(b"[1, 2]")
    wal.append('{"n": 6}'.encode("utf-16"))
    wal.append(event(7))
    s = shipper(wal, sink)
    assert s.drain_once() == 3
    assert [len(m) for m in sink.messages][1] == MAX_MESSAGE_BYTES
    assert [e["n"] for e in sink.events()] == [0, 1, 7]
    assert wal.acked == 7
    assert s.stats()["rejected_records"] == 4


def test_acknowledges_only_after_the_sink_accepted_the_batch() -> None:
    wal = MemoryWal()
    sink = MemorySink(wal=wal)
    for n in range(30):
        wal.append(event(n))
    shipper(wal, sink, batch_records=10).drain_once()
    assert sink.acked_at_send == [0, 10, 20]
    assert wal.acks == [10, 20, 30]


def test_a_failed_send_acknowledges_nothing() -> None:
    wal = MemoryWal()
    sink = MemorySink(wal=wal, fail=1)
    for n in range(5):
        wal.append(event(n))
    wal.append(b"junk")
    s = shipper(wal, sink)
    with pytest.raises(SinkUnavailable):
        s.drain_once()
    assert wal.acked == 0
    assert wal.acks == []
    stats = s.stats()
    assert stats["failures"] == 1
    assert stats["shipped_records"] == 0
    assert stats["rejected_records"] == 0
    assert stats["lag"] == 6
    assert "queue down" in stats["last_error"]
    assert s.drain_once() == 5
    assert s.stats()["rejected_records"] == 1
    assert s.stats()["last_error"] is None


def test_resuming_after_failures_ships_every_event_once_in_order() -> None:
    wal = MemoryWal()
    sink = MemorySink(wal=wal)
    s = shipper(wal, sink, batch_records=7)
    appended = 0
    for round_ in range(12):
        for _ in range(round_ * 3 + 1):
            wal.append(event(appended, request=f"r{appended % 4}"))
            appended += 1
        sink.fail = 2 if round_ % 3 == 0 else 0
        for _ in range(3):
            try:
                s.drain_once()
            except SinkUnavailable:
                continue
            break
    s.drain_once()
    assert [e["n"] for e in sink.events()] == list(range(appended))
    assert wal.acked == appended
    stats = s.stats()
    assert stats["shipped_records"] == appended
    assert stats["failures"] == 8
    assert stats["lag"] == 0


def test_one_drain_is_bounded_by_its_rounds_and_the_next_continues() -> None:
    wal, sink = MemoryWal(), MemorySink()
    for n in range(50):
        wal.append(event(n))
    s = shipper(wal, sink, batch_records=10, max_rounds=2)
    assert s.drain_once() == 20
    assert wal.acked == 20
    assert s.more, "a drain stopped by its rounds says records may be left"
    assert s.drain_once() == 20
    assert s.more
    assert s.drain_once() == 10
    assert not s.more, "the third drain caught up"
    assert s.drain_once() == 0
    assert not s.more
    assert [e["n"] for e in sink.events()] == list(range(50))


def test_a_drain_continues_past_full_reads_and_leaves_what_came_during_its_sends() -> None:
    """A read stopped at its bounds is followed at once; records appended while a drain sends
    (a writer that never pauses) wait for the next drain, so each call carries a full read."""
    wal = MemoryWal()

    class AppendingSink(MemorySink):
        def send(self, batch: list[bytes]) -> None:
            super().send(batch)
            for _ in range(2):
                wal.append(event(len(wal.records)))

    sink = AppendingSink()
    for n in range(15):
        wal.append(event(n))
    s = shipper(wal, sink, batch_records=10)
    assert s.drain_once() == 17  # a full read of 10, then 7 (5 + 2 appended during the first send)
    assert sink.calls == 2
    assert wal.acked == 17
    assert len(wal.records) == 19
    assert s.drain_once() == 2
    assert sink.calls == 3
    assert [e["n"] for e in sink.events()] == list(range(19))


def test_a_passed_deadline_ships_nothing() -> None:
    wal, sink = MemoryWal(), MemorySink()
    wal.append(event(0))
    s = shipper(wal, sink)
    assert s.drain_once(deadline=time.monotonic() - 1) == 0
    assert s.more
    assert sink.calls == 0
    assert wal.acked == 0


async def test_backoff_doubles_up_to_its_bound_and_resets_after_a_success() -> None:
    wal = MemoryWal()
    wal.append(event(0))
    seen: list[tuple[float, float]] = []
    done = threading.Event()

    class FlakySink(MemorySink):
        def send(self, batch: list[bytes]) -> None:
            seen.append((time.monotonic(), s.stats()["backoff_s"]))
            if len(seen) < 6:
                raise SinkUnavailable("queue down")
            super().send(batch)
            done.set()

    sink = FlakySink()
    s = shipper(wal, sink, max_backoff_s=0.4)
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    assert await asyncio.wait_for(asyncio.to_thread(done.wait, 20), 25), "the shipper gave up retrying"
    wal.append(event(1))
    stop.set()
    await asyncio.wait_for(task, 10)
    assert [b for _, b in seen[:6]] == [0.0, 0.1, 0.2, 0.4, 0.4, 0.4]
    for (t0, _), (t1, waited) in itertools.pairwise(seen[:6]):
        assert t1 - t0 >= waited * 0.9, "the loop retried before its backoff"
    assert s.stats()["backoff_s"] == 0.0
    assert s.stats()["failures"] == 5
    assert [e["n"] for e in sink.events()] == [0, 1]


async def test_the_server_loop_never_blocks_the_event_loop() -> None:
    wal = MemoryWal()

    class SlowSink(MemorySink):
        def send(self, batch: list[bytes]) -> None:
            time.sleep(0.3)
            super().send(batch)

    sink = SlowSink()
    for n in range(3):
        wal.append(event(n))
    s = shipper(wal, sink, batch_records=1)
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    worst = 0.0
    deadline = time.monotonic() + 0.9
    while time.monotonic() < deadline:
        before = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - before)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert worst < 0.15, f"the event loop stalled for {worst:.3f} s"
    assert [e["n"] for e in sink.events()] == [0, 1, 2]


async def test_stop_drains_once_more_without_waiting_for_the_idle_poll() -> None:
    wal, sink = MemoryWal(), MemorySink()
    s = shipper(wal, sink, idle_s=60)
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    for _ in range(100):
        if sink.calls or s.stats()["acked"] is not None:
            break
        await asyncio.sleep(0.01)
    for n in range(5):
        wal.append(event(n))
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - started < 5
    assert [e["n"] for e in sink.events()] == list(range(5))
    assert wal.acked == 5


async def test_an_unexpected_reader_error_is_retried_not_fatal() -> None:
    wal, sink = MemoryWal(), MemorySink()
    wal.append(event(0))
    broken = {"left": 2}
    real_read = wal.read

    def read(after_seq: int, max_records: int, max_bytes: int) -> list[Record]:
        if broken["left"]:
            broken["left"] -= 1
            raise OSError("disk hiccup")
        return real_read(after_seq, max_records, max_bytes)

    wal.read = read  # type: ignore[method-assign]
    s = shipper(wal, sink, max_backoff_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    for _ in range(200):
        if wal.acked == 1:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert wal.acked == 1
    assert s.stats()["failures"] == 2
    assert [e["n"] for e in sink.events()] == [0]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        shipper(MemoryWal(), MemorySink(), batch_records=0)
    with pytest.raises(ValueError):
        shipper(MemoryWal(), MemorySink(), max_backoff_s=0)
