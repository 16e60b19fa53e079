"""The audit-writer handler fed a real SQS event (``tests/events/sqs_audit_batch.json``), store injected.

The fixture holds three messages as the WAL shipper sends them: a complete request (4 events), a
malformed message (its one event lacks ``eventId``), and an incomplete request whose last event is
of a kind the writer does not know. Other malformed shapes are derived by changing one body.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from functions.audit_writer import handler as handler_module
from functions.audit_writer.handler import build_handler
from tollway.audit.store import AuditStoreError, MemoryAuditStore
from tollway.audit.store.plan import ItemWrite, WriteOutcome
from tollway.cloud.runner import LambdaContext

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "events" / "sqs_audit_batch.json"
COMPLETE_ID = "0193a6f2-9d40-7c11-8a2b-3e4f5a6b7c01"
INCOMPLETE_ID = "0193a6f2-a1b8-7d22-9c3d-4e5f6a7b8c02"
LOGGER = "tollway.audit_writer"


def sqs_event() -> dict[str, Any]:
    event: dict[str, Any] = json.loads(FIXTURE.read_text())
    return event


def context() -> LambdaContext:
    return LambdaContext(
        aws_request_id="2d1f6a0c-1b7e-4c55-9d0e-8e1f2a3b4c5d",
        function_name="tollway-audit-writer",
        memory_limit_in_mb="512",
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:tollway-audit-writer",
        log_group_name="/aws/lambda/tollway-audit-writer",
        log_stream_name="2025/11/29/[$LATEST]2d1f6a0c1b7e4c559d0e8e1f2a3b4c5d",
        _deadline=time.monotonic() + 20,
    )


def with_body(record: dict[str, Any], body: str) -> dict[str, Any]:
    changed = copy.deepcopy(record)
    changed["body"] = body
    changed["md5OfBody"] = hashlib.md5(body.encode()).hexdigest()
    return changed


def failures(response: Any) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def test_the_fixture_batch_fails_exactly_the_malformed_message(caplog: pytest.LogCaptureFixture) -> None:
    event = sqs_event()
    good_first, bad, good_last = (r["messageId"] for r in event["Records"])
    store = MemoryAuditStore()

    with caplog.at_level(logging.DEBUG):
        response = build_handler(lambda: store)(event, context())

    assert response == {"batchItemFailures": [{"itemIdentifier": bad}]}
    complete = store.get_request(COMPLETE_ID)
    assert complete is not None and not complete.incomplete
    assert (complete.request.status, complete.request.principal_id, complete.request.usage_evidence) == (
        200,
        "principal-ada",
        "provider-reported",
    )
    assert [(a.number, a.outcome, a.upstream_status) for a in complete.attempts] == [(1, "ok", 200)]
    partial = store.get_request(INCOMPLETE_ID)
    assert partial is not None and partial.request.incomplete
    assert [(a.number, a.incomplete) for a in partial.attempts] == [(1, True)]
    assert len(store.items) == 4  # two requests, one attempt each; the heartbeat kind made nothing

    ours = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(good_first in m and "4 event(s) applied" in m for m in ours)
    assert any(good_last in m and "2 event(s) applied" in m and "1 of unknown kind" in m for m in ours)
    assert any(bad in m and "MalformedMessage" in m for m in ours)
    assert any("batch of 3 message(s): 1 failed" in m for m in ours)
    for record in event["Records"]:  # no body, and no field of one, in any log line (ours or Powertools')
        assert record["body"] not in caplog.text
    for value in ("principal-ada", "chat-default", "gpt-4o-mini", "tenant-acme", "sha256:", "routeId"):
        assert value not in caplog.text


def test_redelivering_the_batch_changes_nothing() -> None:
    store = MemoryAuditStore()
    handle = build_handler(lambda: store)
    handle(sqs_event(), context())
    before = copy.deepcopy(store.items)

    again = handle(sqs_event(), context())

    assert failures(again) == [sqs_event()["Records"][1]["messageId"]]
    assert store.items == before


def _body(events: Sequence[Any], v: Any = 1) -> str:
    return json.dumps({"v": v, "events": list(events)})


def _good_events() -> list[dict[str, Any]]:
    return list(json.loads(sqs_event()["Records"][0]["body"])["events"])


def _malformed_bodies() -> dict[str, str]:
    good = [{**e, "requestId": "r-bad"} for e in _good_events()]
    started = next(e for e in good if e["kind"] == "attempt_started")
    return {
        "not-json": "{'v': 1}",
        "not-an-object": json.dumps([good[0]]),
        "version-2": _body(good, v=2),
        "version-true": _body(good, v=True),
        "version-missing": json.dumps({"events": good}),
        "no-events": _body([]),
        "too-many-events": _body([good[0]] * 65),
        "event-not-object": _body([good[0], "CANARY"]),
        "event-schema-2": _body([{**good[0], "schemaVersion": 2}]),
        "event-ts-string": _body([{**good[0], "ts": "CANARY"}]),
        "attempt-missing": _body([{**started, "attempt": None}]),
        "principal-not-string": _body([{**good[0], "body": {**good[0]["body"], "principalId": ["CANARY"]}}]),
    }


@pytest.mark.parametrize("case", sorted(_malformed_bodies()))
def test_a_malformed_message_fails_alone_and_writes_nothing(case: str, caplog: pytest.LogCaptureFixture) -> None:
    event = sqs_event()
    records = event["Records"]
    bad_body = _malformed_bodies()[case]
    records[1] = with_body(records[1], bad_body)
    store = MemoryAuditStore()

    with caplog.at_level(logging.DEBUG):
        response = build_handler(lambda: store)(event, context())

    assert failures(response) == [records[1]["messageId"]]
    assert {pk for pk, _ in store.items} == {f"REQ#{COMPLETE_ID}", f"REQ#{INCOMPLETE_ID}"}  # nothing of r-bad
    assert "CANARY" not in caplog.text and bad_body not in caplog.text


def test_a_message_at_the_64_event_bound_is_applied() -> None:
    first = _good_events()[0]
    events = [{**first, "eventId": f"019acfe9-d700-704c-8281-{i:012x}", "requestId": f"r-{i}"} for i in range(64)]
    event = {"Records": [with_body(sqs_event()["Records"][0], _body(events))]}
    store = MemoryAuditStore()

    response = build_handler(lambda: store)(event, context())

    assert failures(response) == []
    assert len(store.items) == 64


class FlakyStore(MemoryAuditStore):
    """The fake store, failing every item write for one request as DynamoDB would when throttled."""

    def __init__(self, failing_request: str) -> None:
        super().__init__()
        self.failing_request = failing_request

    def write_item(self, w: ItemWrite) -> WriteOutcome:
        if w.pk == f"REQ#{self.failing_request}":
            raise AuditStoreError("audit table t: UpdateItem failed: ProvisionedThroughputExceededException")
        return super().write_item(w)


def test_a_store_failure_fails_only_its_message(caplog: pytest.LogCaptureFixture) -> None:
    event = sqs_event()
    store = FlakyStore(INCOMPLETE_ID)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        response = build_handler(lambda: store)(event, context())

    _, bad, last = (r["messageId"] for r in event["Records"])
    assert failures(response) == [bad, last]
    assert store.get_request(COMPLETE_ID) is not None and store.get_request(INCOMPLETE_ID) is None
    assert any(last in r.getMessage() and "ProvisionedThroughputExceeded" in r.getMessage() for r in caplog.records)


def test_a_batch_in_which_every_message_fails_is_reported_item_by_item() -> None:
    event = sqs_event()
    event["Records"] = [with_body(r, "not json") for r in event["Records"]]

    response = build_handler(MemoryAuditStore)(event, context())

    assert failures(response) == [r["messageId"] for r in event["Records"]]


def test_the_deployed_handler_builds_its_store_from_the_environment_on_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without TOLLWAY_TABLE_AUDIT the store cannot be built: each message fails, the invocation does not."""
    monkeypatch.delenv("TOLLWAY_TABLE_AUDIT", raising=False)
    event = sqs_event()

    response = handler_module.handler(event, context())

    assert failures(response) == [r["messageId"] for r in event["Records"]]


def test_importing_the_handler_needs_no_environment_and_creates_no_client() -> None:
    code = (
        "import sys; import functions.audit_writer.handler as h; "
        "assert callable(h.handler); assert 'boto3' not in sys.modules, 'boto3 imported at init'"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
