"""The usage-reconciler handler fed real SQS events, the memory ledger injected.

Records are shaped from the SQS record of ``tests/events/sqs_audit_batch.json`` (as Lambda delivers
it), with a usage-queue message as the body.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from functions.usage_reconciler import handler as handler_module
from functions.usage_reconciler.handler import build_handler
from tests.unit.metering.usage_events import finished, message
from tollway.audit import events as ev
from tollway.audit.events import AuditEvent
from tollway.cloud.runner import LambdaContext
from tollway.metering import (
    ApplyResult,
    MemoryUsageLedger,
    UsageLedgerUnavailable,
    UsageQuery,
    UsageRow,
    UsageScope,
    UsageTotals,
)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests" / "events" / "sqs_audit_batch.json"
LOGGER = "tollway.usage_reconciler"
DAY = date(2026, 11, 29)
TENANT_DAY = ("agg#tenant:acme#total", "day#2026-11-29")


def record(body: str) -> dict[str, Any]:
    """One SQS record of Lambda's event, on the usage queue, carrying ``body``."""
    template = json.loads(TEMPLATE.read_text())["Records"][0]
    shaped: dict[str, Any] = copy.deepcopy(template)
    shaped["messageId"] = str(uuid.uuid4())
    shaped["body"] = body
    shaped["md5OfBody"] = hashlib.md5(body.encode()).hexdigest()
    shaped["eventSourceARN"] = "arn:aws:sqs:us-east-1:123456789012:tollway-usage-events"
    return shaped


def sqs_event(*bodies: str) -> dict[str, Any]:
    return {"Records": [record(b) for b in bodies]}


def context() -> LambdaContext:
    return LambdaContext(
        aws_request_id="5b0e1c2d-3f4a-4b5c-8d6e-7f8091a2b3c4",
        function_name="tollway-usage-reconciler",
        memory_limit_in_mb="512",
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:tollway-usage-reconciler",
        log_group_name="/aws/lambda/tollway-usage-reconciler",
        log_stream_name="2026/11/29/[$LATEST]5b0e1c2d3f4a4b5c8d6e7f8091a2b3c4",
        _deadline=time.monotonic() + 20,
    )


def failures(response: Any) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def admitted(request_id: str) -> AuditEvent:
    return ev.request_admitted(
        request_id=request_id,
        root_digest="d",
        principal_id="svc-a",
        tenant="acme",
        team=None,
        key_id="key-1",
        alias="chat",
        stream=False,
        content_mode="metadata-only",
        max_attempts=1,
    )


def tenant_totals(ledger: MemoryUsageLedger) -> UsageTotals:
    return UsageTotals.from_item(ledger.items[TENANT_DAY])


def test_a_batch_fails_exactly_its_malformed_message(caplog: pytest.LogCaptureFixture) -> None:
    good = message([finished("r1", cost=100), finished("r2", cost=250, principal="svc-b")])
    bad = message([finished("r3", principal="CANARY-PRINCIPAL", omit=("tenantId",))])
    mixed = message([admitted("r4"), finished("r4", cost=50)])
    event = sqs_event(good, bad, mixed)
    good_id, bad_id, mixed_id = (r["messageId"] for r in event["Records"])
    ledger = MemoryUsageLedger()

    with caplog.at_level(logging.DEBUG):
        response = build_handler(lambda: ledger)(event, context())

    assert response == {"batchItemFailures": [{"itemIdentifier": bad_id}]}
    assert tenant_totals(ledger).requests == 3 and tenant_totals(ledger).cost_micro_usd == 400
    assert ("req#r3", "usage") not in ledger.items
    ours = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f"message {good_id}: 2 request(s) applied, 0 duplicate(s), 0 event(s) skipped" in ours
    assert f"message {mixed_id}: 1 request(s) applied, 0 duplicate(s), 1 event(s) skipped" in ours
    assert any(bad_id in m and "MalformedUsageEvent" in m and "'tenantId'" in m for m in ours)
    assert "batch of 3 message(s): 1 failed" in ours
    for body in (good, bad, mixed):  # no body, nor a field of one, in any log line (ours or Powertools')
        assert body not in caplog.text
    for value in ("CANARY-PRINCIPAL", "svc-a", "svc-b", "acme", "chat"):
        assert value not in caplog.text


def test_redelivering_the_batch_changes_no_aggregate(caplog: pytest.LogCaptureFixture) -> None:
    bodies = (message([finished("r1"), finished("r2", alias="embed")]), message([finished("r3", status=503)]))
    ledger = MemoryUsageLedger()
    handle = build_handler(lambda: ledger)
    assert failures(handle(sqs_event(*bodies), context())) == []
    before = copy.deepcopy(ledger.items)

    again = sqs_event(*bodies[::-1])
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert failures(handle(again, context())) == []

    assert ledger.items == before
    assert tenant_totals(ledger).requests == 3
    ours = {r.getMessage() for r in caplog.records if r.name == LOGGER}
    first, second = (r["messageId"] for r in again["Records"])
    assert f"message {first}: 0 request(s) applied, 1 duplicate(s), 0 event(s) skipped" in ours
    assert f"message {second}: 0 request(s) applied, 2 duplicate(s), 0 event(s) skipped" in ours


def test_a_message_with_one_malformed_event_writes_none_of_its_events() -> None:
    ledger = MemoryUsageLedger()
    event = sqs_event(message([finished("r1"), finished("r2", evidence="guessed")]))

    response = build_handler(lambda: ledger)(event, context())

    assert failures(response) == [event["Records"][0]["messageId"]]
    assert ledger.items == {}


@pytest.mark.parametrize(
    "body",
    ["not json", json.dumps({"v": 2, "events": []}), json.dumps({"v": 1, "events": [{"kind": "request_finished"}]})],
    ids=["not-json", "version-2", "event-without-envelope"],
)
def test_a_malformed_envelope_fails_alone(body: str) -> None:
    ledger = MemoryUsageLedger()
    event = sqs_event(body, message([finished("r1")]))

    response = build_handler(lambda: ledger)(event, context())

    assert failures(response) == [event["Records"][0]["messageId"]]
    assert tenant_totals(ledger).requests == 1


class FlakyLedger:
    """The memory ledger, unavailable for one request as DynamoDB is under a transaction conflict."""

    def __init__(self, failing_request: str) -> None:
        self.inner = MemoryUsageLedger()
        self.failing_request = failing_request

    def apply(self, event: AuditEvent) -> ApplyResult:
        if event.request_id == self.failing_request:
            raise UsageLedgerUnavailable(
                "usage-ledger table t: TransactWriteItems failed: TransactionCanceledException"
            )
        return self.inner.apply(event)

    def query(self, query: UsageQuery) -> list[UsageRow]:
        return self.inner.query(query)


def test_a_ledger_failure_fails_its_message_and_the_retry_completes_it_once(caplog: pytest.LogCaptureFixture) -> None:
    ledger = FlakyLedger("r2")
    bodies: Sequence[str] = (message([finished("r1"), finished("r2")]), message([finished("r3")]))
    event = sqs_event(*bodies)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        response = build_handler(lambda: ledger)(event, context())

    flaky_id = event["Records"][0]["messageId"]
    assert failures(response) == [flaky_id]
    assert any(flaky_id in r.getMessage() and "UsageLedgerUnavailable" in r.getMessage() for r in caplog.records)
    assert tenant_totals(ledger.inner).requests == 2  # r1 landed before r2 failed; r3 in its own message

    ledger.failing_request = ""
    assert failures(build_handler(lambda: ledger)(sqs_event(bodies[0]), context())) == []

    assert tenant_totals(ledger.inner).requests == 3  # r1 was a duplicate, r2 applied once
    rows = ledger.query(UsageQuery(UsageScope("acme"), DAY, DAY))
    assert [(r.key, r.totals.requests) for r in rows] == [("2026-11-29", 3)]


def test_the_deployed_handler_builds_its_ledger_from_the_environment_on_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without TOLLWAY_TABLE_USAGE_LEDGER no ledger can be built: each message fails, the invocation does not."""
    monkeypatch.delenv("TOLLWAY_TABLE_USAGE_LEDGER", raising=False)
    event = sqs_event(message([finished("r1")]), message([finished("r2")]))

    response = handler_module.handler(event, context())

    assert failures(response) == [r["messageId"] for r in event["Records"]]


def test_importing_the_handler_needs_no_environment_and_creates_no_client() -> None:
    code = (
        "import sys; import functions.usage_reconciler.handler as h; from tollway import aws; "
        "assert callable(h.handler); assert 'boto3' not in sys.modules, 'boto3 imported at init'; "
        "assert aws.cache_size() == 0, 'a client was built at import'"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
