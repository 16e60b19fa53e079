"""The usage queue's share of each shipped batch: request_finished events only, all-or-nothing."""

from __future__ import annotations

import json

import pytest

from tollway.audit.ship import shipper
from tollway.audit.ship.sinks import SinkUnavailable, UsageFanOut, usage_messages
from tollway.audit.wal import WalRecord


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[bytes]] = []
        self.fail = fail

    def send(self, batch: list[bytes]) -> None:
        if self.fail:
            raise SinkUnavailable("queue down")
        self.batches.append(batch)


def message(*kinds: str) -> bytes:
    events = [{"kind": k, "eventId": f"e{i}", "requestId": f"r{i}"} for i, k in enumerate(kinds)]
    return json.dumps({"v": 1, "events": events}).encode()


def test_only_request_finished_events_go_to_the_usage_queue() -> None:
    audit, usage = Recorder(), Recorder()
    batch = [message("request_admitted", "attempt_started"), message("attempt_finished", "request_finished")]
    UsageFanOut(audit, usage).send(batch)
    assert audit.batches == [batch]
    [sent] = usage.batches
    [body] = sent
    assert [e["kind"] for e in json.loads(body)["events"]] == ["request_finished"]


def test_a_batch_without_terminal_events_sends_nothing_to_the_usage_queue() -> None:
    audit, usage = Recorder(), Recorder()
    UsageFanOut(audit, usage).send([message("request_admitted")])
    assert len(audit.batches) == 1
    assert usage.batches == []


def test_a_usage_queue_failure_fails_the_whole_batch_so_it_is_resent() -> None:
    with pytest.raises(SinkUnavailable):
        UsageFanOut(Recorder(), Recorder(fail=True)).send([message("request_finished")])


def test_bodies_that_are_not_envelopes_are_skipped() -> None:
    assert usage_messages([b"not json", b'{"v":1}', message("request_finished")]) == usage_messages(
        [message("request_finished")]
    )


class Records:
    """A WAL source holding events in memory (the shipper's reader interface)."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.records = [WalRecord(i + 1, p) for i, p in enumerate(payloads)]
        self.acked = 0
        self.caught_up = True

    def read(self, after_seq: int, max_records: int, max_bytes: int) -> list[WalRecord]:
        left = [r for r in self.records if r.sequence > after_seq]
        self.caught_up = len(left) <= max_records
        return left[:max_records]

    def acknowledge(self, seq: int) -> None:
        self.acked = seq


def event(kind: str, n: int) -> bytes:
    return json.dumps({"kind": kind, "eventId": f"e{n}", "requestId": f"r{n // 4}"}).encode()


@pytest.mark.parametrize("stdlib_only", [False, True], ids=["orjson", "stdlib"])
def test_the_shipper_splits_the_usage_share_while_packing(monkeypatch: pytest.MonkeyPatch, stdlib_only: bool) -> None:
    if stdlib_only:  # the Lambda extension's import path: no orjson
        monkeypatch.setattr(shipper, "_load_utf8", lambda payload: json.loads(payload.decode()))
        monkeypatch.setattr(shipper, "_DecodeError", ValueError)
    kinds = ["request_admitted", "attempt_started", "attempt_finished", "request_finished"]
    payloads = [event(kinds[n % 4], n) for n in range(200)]
    payloads.insert(7, b"\xff not an event")  # refused, never in a message
    payloads.insert(9, b"[1, 2]")
    audit, usage = Recorder(), Recorder()
    source = Records(payloads)
    shipped = shipper.Shipper(
        source, UsageFanOut(audit, usage), batch_records=500, batch_bytes=1 << 20, idle_s=0, max_backoff_s=1
    ).drain_once()

    assert shipped == 200 and source.acked == 202
    audited = [e for batch in audit.batches for body in batch for e in json.loads(body)["events"]]
    assert [e["eventId"] for e in audited] == [f"e{n}" for n in range(200)]
    finished = [e for batch in usage.batches for body in batch for e in json.loads(body)["events"]]
    assert [e["eventId"] for e in finished] == [f"e{n}" for n in range(3, 200, 4)]
    # The same share as splitting the sent messages afterwards (what UsageFanOut.send does alone).
    resplit = [e for batch in audit.batches for body in usage_messages(batch) for e in json.loads(body)["events"]]
    assert finished == resplit


def test_a_rejected_request_is_not_usage_for_the_queue_or_the_reconciler() -> None:
    """``request_rejected`` reached no provider: the fan-out leaves it out, and the ledger skips it if sent."""
    from functions.usage_reconciler.handler import build_handler
    from tests.unit.audit.test_store import rejected
    from tollway.metering import ApplyResult, MemoryUsageLedger, usage_record

    assert usage_messages([message("request_rejected", "request_rejected")]) == []
    event = rejected("r-429")
    assert usage_record(event) is None
    ledger = MemoryUsageLedger()
    assert ledger.apply(event) is ApplyResult.SKIPPED
    body = '{"v":1,"events":[' + event.encode().decode() + "]}"
    sqs = {"Records": [{"messageId": "m-1", "receiptHandle": "h", "body": body, "attributes": {}}]}
    assert build_handler(lambda: ledger)(sqs, None) == {"batchItemFailures": []}
