"""The content writer: a bounded queue that drops (and says why) rather than wait, one retry for a
store that is down, and a drain and close that account for every record.

The fake store holds each put at a gate (an ``asyncio.Event``) that the test opens, so "in flight",
"queued" and "done" are states the test sets up, never timings it hopes for. Waiting is always on
a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.content_store_contract import RETENTION, record
from tollway.content import ContentError, ContentRecord, ContentRef, ContentUnavailable, ContentWriter

DEADLINE_S = 5.0


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)


class FakeStore:
    def __init__(self, *, open_gate: bool = True) -> None:
        self.gate = asyncio.Event()
        if open_gate:
            self.gate.set()
        self.failures: list[BaseException] = []
        self.calls: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.closed = False

    async def put(self, record: ContentRecord, retention_class: str) -> ContentRef:
        self.calls.append(record.request_id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if self.failures:
                raise self.failures.pop(0)
        finally:
            self.in_flight -= 1
        return ContentRef(
            bucket="fake",
            key=f"content/{retention_class}/{record.tenant}/2025/12/31/{record.request_id}.json.enc",
            digest=record.digest(),
            size=len(record.to_json()),
            key_ref="fake",
            retention_class=retention_class,
            mode=record.mode,
        )

    async def get(self, ref: ContentRef) -> ContentRecord | None:
        raise NotImplementedError

    async def delete(self, ref: ContentRef) -> bool:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.closed = True


class Calls:
    def __init__(self) -> None:
        self.stored: list[tuple[ContentRecord, ContentRef]] = []
        self.dropped: list[tuple[str, str]] = []

    def on_stored(self, record: ContentRecord, ref: ContentRef) -> None:
        self.stored.append((record, ref))

    def on_dropped(self, record: ContentRecord, reason: str) -> None:
        self.dropped.append((record.request_id, reason))


def writer(store: FakeStore, calls: Calls, **options: object) -> ContentWriter:
    options.setdefault("retry_delay_s", 0)
    return ContentWriter(store, on_stored=calls.on_stored, on_dropped=calls.on_dropped, **options)  # type: ignore[arg-type]


async def test_a_submitted_record_is_stored_in_the_background_and_reported() -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls)
    assert w.submit(record("req_1"), RETENTION) is True
    assert store.calls == [], "submit only queues: the put runs later, on a worker"
    assert await w.drain(DEADLINE_S) is True
    assert w.stored == 1 and w.pending == 0 and w.pending_bytes == 0 and not w.dropped
    ((stored, ref),) = calls.stored
    assert stored == record("req_1") and ref.digest == stored.digest() and ref.retention_class == RETENTION
    await w.aclose()
    assert not store.closed, "the writer does not own the store"


async def test_a_queue_full_by_count_drops_with_the_reason_and_counts_it() -> None:
    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls, max_pending=2, workers=1)
    assert [w.submit(record(f"req_{i}"), RETENTION) for i in range(4)] == [True, True, False, False]
    assert calls.dropped == [("req_2", "queue_full"), ("req_3", "queue_full")]
    assert w.dropped == {"queue_full": 2} and w.pending == 2
    await until(lambda: store.in_flight == 1, "the first put is in flight")
    assert w.submit(record("req_4"), RETENTION) is False, "a record in flight is still pending"
    store.gate.set()
    assert await w.drain(DEADLINE_S) is True
    assert store.calls == ["req_0", "req_1"] and w.stored == 2
    assert w.submit(record("req_5"), RETENTION) is True, "room again once written"
    await w.aclose()


async def test_a_queue_full_by_bytes_drops_and_a_record_too_large_to_ever_fit_says_so() -> None:
    size = len(record("req_0").to_json())
    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls, max_pending_bytes=2 * size + size // 2)
    assert [w.submit(record(f"req_{i}"), RETENTION) for i in range(3)] == [True, True, False]
    assert w.pending_bytes == 2 * size
    huge = record("req_huge", request={"messages": [{"role": "user", "content": "x" * (3 * size)}]})
    assert w.submit(huge, RETENTION) is False
    assert calls.dropped == [("req_2", "queue_full"), ("req_huge", "too_large")]
    store.gate.set()
    assert await w.drain(DEADLINE_S) is True and w.pending_bytes == 0
    await w.aclose()


async def test_submit_never_blocks_while_the_store_hangs() -> None:
    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls, max_pending=100, workers=2)
    w.submit(record("req_first"), RETENTION)
    await until(lambda: store.in_flight == 1, "a put hangs")
    accepted = [w.submit(record(f"req_{i}"), RETENTION) for i in range(500)]
    assert store.gate.is_set() is False, "every submit above returned while the store hung"
    assert accepted.count(True) == 99 and w.dropped == {"queue_full": 401}
    await w.aclose(timeout_s=0)
    assert w.dropped["closed"] == 100 and w.pending == 0


async def test_a_store_that_is_down_is_tried_once_more_then_the_record_is_dropped() -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls, workers=1)
    store.failures = [ContentUnavailable("content store s3: PutObject failed: SlowDown")]
    w.submit(record("req_retried"), RETENTION)
    assert await w.drain(DEADLINE_S)
    assert store.calls == ["req_retried", "req_retried"] and w.stored == 1 and w.retried == 1

    store.failures = [ContentUnavailable("down"), ContentUnavailable("still down"), ContentUnavailable("spare")]
    w.submit(record("req_lost"), RETENTION)
    assert await w.drain(DEADLINE_S)
    assert store.calls[2:] == ["req_lost", "req_lost"], "once more, never twice"
    assert calls.dropped == [("req_lost", "store_unavailable")] and w.dropped == {"store_unavailable": 1}
    await w.aclose()


@pytest.mark.parametrize("failure", [ContentError("a key segment is not URL-safe"), RuntimeError("a bug")])
async def test_a_record_the_store_refuses_is_rejected_at_once_and_the_worker_goes_on(failure: Exception) -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls, workers=1)
    store.failures = [failure]
    w.submit(record("req_refused"), RETENTION)
    w.submit(record("req_next"), RETENTION)
    assert await w.drain(DEADLINE_S)
    assert store.calls == ["req_refused", "req_next"], "not retried"
    assert calls.dropped == [("req_refused", "rejected")] and w.stored == 1
    await w.aclose()


async def test_submit_never_raises_even_when_a_callback_or_the_record_does() -> None:
    store = FakeStore()

    def explode(*_: object) -> None:
        raise RuntimeError("callback bug")

    w = ContentWriter(store, max_pending=1, on_stored=explode, on_dropped=explode, retry_delay_s=0)
    assert w.submit(record("req_ok"), RETENTION) is True
    assert w.submit(record("req_full"), RETENTION) is False  # on_dropped raises inside
    assert w.submit(record("req_bad", request={1: "not a JSON key"}), RETENTION) is False
    assert w.submit(None, RETENTION) is False  # type: ignore[arg-type]
    assert await w.drain(DEADLINE_S)
    assert w.stored == 1, "on_stored raised, the record is stored all the same"
    assert w.dropped == {"queue_full": 1, "rejected": 2}
    assert w.submit(record("req_after"), RETENTION) is True and await w.drain(DEADLINE_S)
    assert w.stored == 2, "the worker survived the callbacks"
    await w.aclose()


async def test_workers_put_concurrently_up_to_their_number() -> None:
    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls, workers=3)
    for i in range(10):
        w.submit(record(f"req_{i}"), RETENTION)
    await until(lambda: store.in_flight == 3, "three puts are in flight")
    store.gate.set()
    assert await w.drain(DEADLINE_S)
    assert store.most_in_flight == 3 and w.stored == 10
    assert sorted(store.calls) == sorted(f"req_{i}" for i in range(10))
    await w.aclose()


async def test_drain_reports_whether_everything_was_written_by_its_deadline() -> None:
    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls)
    assert await w.drain(0) is True, "nothing pending"
    w.submit(record("req_1"), RETENTION)
    assert await w.drain(0.01) is False
    assert w.pending == 1 and not calls.dropped, "a drain that times out drops nothing"
    store.gate.set()
    assert await w.drain(DEADLINE_S) is True
    await w.aclose()


async def test_aclose_drains_what_it_can_then_drops_the_rest_as_closed() -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls, workers=1)
    for i in range(5):
        w.submit(record(f"req_{i}"), RETENTION)
    await w.aclose(timeout_s=DEADLINE_S)
    assert w.stored == 5 and not w.dropped

    store, calls = FakeStore(open_gate=False), Calls()
    w = writer(store, calls, workers=1)
    for i in range(3):
        w.submit(record(f"req_{i}"), RETENTION)
    await until(lambda: store.in_flight == 1, "the first put is in flight")
    await w.aclose(timeout_s=0.01)
    assert sorted(calls.dropped) == [("req_0", "closed"), ("req_1", "closed"), ("req_2", "closed")]
    assert w.pending == 0 and w.pending_bytes == 0 and w.stored == 0
    assert w.submit(record("req_late"), RETENTION) is False
    assert calls.dropped[-1] == ("req_late", "closed") and w.dropped == {"closed": 4}
    assert await w.drain(0) is True


async def test_aclose_during_the_retry_delay_drops_the_record_as_closed() -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls, workers=1, retry_delay_s=60)
    store.failures = [ContentUnavailable("down")]
    w.submit(record("req_1"), RETENTION)
    await until(lambda: w.retried == 1, "the first attempt failed")
    await w.aclose(timeout_s=0.01)
    assert calls.dropped == [("req_1", "closed")] and store.calls == ["req_1"]


def test_a_writer_needs_no_running_loop_until_it_drains() -> None:
    store, calls = FakeStore(), Calls()
    w = writer(store, calls)
    assert w.submit(record("req_early"), RETENTION) is True, "queued; no worker can start without a loop"

    async def later() -> None:
        assert await w.drain(DEADLINE_S) is True
        await w.aclose()

    asyncio.run(later())
    assert w.stored == 1 and calls.stored[0][0].request_id == "req_early"


@pytest.mark.parametrize(
    "options", [{"max_pending": 0}, {"max_pending_bytes": 0}, {"workers": 0}, {"retry_delay_s": -1}]
)
def test_bounds_that_cannot_work_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        writer(FakeStore(), Calls(), **options)
