"""The worker functions' Powertools telemetry: one EMF document per invocation, JSON log lines.

The EMF documents are what CloudWatch turns into the metrics the stack's alarms and dashboard
read (``infra/constructs/observability.py`` names them; the last test here holds the two lists
together). Powertools prints them to ``sys.stdout``, which ``capsys`` captures; the log lines go
to the stream the Powertools handler was given at import, swapped here for a buffer.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger

from functions.audit_writer import handler as audit_writer
from functions.pricing_refresh import handler as pricing_refresh
from functions.pricing_refresh.settings import RefreshSettings
from functions.usage_reconciler import handler as usage_reconciler
from infra.constructs import observability
from tests.functional.test_audit_writer import context as audit_context
from tests.functional.test_audit_writer import sqs_event as audit_event
from tests.functional.test_usage_reconciler import context as usage_context
from tests.functional.test_usage_reconciler import sqs_event as usage_event
from tests.unit.metering.usage_events import finished, message
from tollway.audit.store import MemoryAuditStore
from tollway.metering import MemoryUsageLedger
from tollway.pricing import MemorySnapshotStore, SnapshotStoreError
from tollway.telemetry.emf import ENVIRONMENT_VARIABLE, NAMESPACE

DATA = Path(__file__).resolve().parents[1] / "unit" / "pricing" / "data"
SCHEDULED = {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


def emf_documents(text: str) -> list[dict[str, Any]]:
    """The EMF documents among the lines of ``text`` (every line must be JSON)."""
    docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [d for d in docs if "_aws" in d]


def metric_values(docs: list[dict[str, Any]]) -> dict[str, float]:
    """Metric name -> its value (Powertools writes a list of one), after checking each document's directive."""
    values: dict[str, float] = {}
    for doc in docs:
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == NAMESPACE
        assert isinstance(doc["_aws"]["Timestamp"], int)
        for dimension_set in directive["Dimensions"]:
            assert all(isinstance(doc[d], str) and doc[d] for d in dimension_set)
        for metric in directive["Metrics"]:
            value = doc[metric["Name"]]
            (values[metric["Name"]],) = value if isinstance(value, list) else [value]
    return values


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "stage-under-test")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    return "stage-under-test"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every worker's Powertools log handler writes into one buffer for the test."""
    buffer = io.StringIO()
    loggers: list[Logger] = [audit_writer.logger, usage_reconciler.logger, pricing_refresh.logger]
    saved = [lg.logger_handler.setStream(buffer) for lg in loggers]  # type: ignore[attr-defined]
    try:
        yield buffer
    finally:
        for lg, stream in zip(loggers, saved, strict=True):
            lg.logger_handler.setStream(stream)  # type: ignore[attr-defined]


def test_the_audit_writer_prints_its_counts_and_write_time_with_the_environment(
    environment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    event = audit_event()
    audit_writer.build_handler(MemoryAuditStore)(event, audit_context())

    docs = emf_documents(capsys.readouterr().out)
    assert len(docs) == 1
    (directive,) = docs[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] == [["environment"]], "no service dimension: alarms match on environment alone"
    assert docs[0]["environment"] == environment
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units == {
        audit_writer.EVENTS_WRITTEN: "Count",
        audit_writer.BATCH_FAILURES: "Count",
        audit_writer.WRITE_SECONDS: "Seconds",
    }
    values = metric_values(docs)
    assert values[audit_writer.EVENTS_WRITTEN] == 6.0  # 4 + 2 events of the two good messages
    assert values[audit_writer.BATCH_FAILURES] == 1.0  # the malformed one
    assert values[audit_writer.WRITE_SECONDS] >= 0


def test_a_redelivered_audit_batch_writes_nothing_and_says_so(
    environment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryAuditStore()
    handle = audit_writer.build_handler(lambda: store)
    handle(audit_event(), audit_context())
    capsys.readouterr()
    handle(audit_event(), audit_context())
    assert metric_values(emf_documents(capsys.readouterr().out))[audit_writer.EVENTS_WRITTEN] == 0.0


def test_without_the_variable_the_environment_is_local(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    audit_writer.build_handler(MemoryAuditStore)(audit_event(), audit_context())
    (doc,) = emf_documents(capsys.readouterr().out)
    assert doc["environment"] == "local"


def test_powertools_metrics_disabled_prints_nothing_and_keeps_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    handle = audit_writer.build_handler(MemoryAuditStore)
    for _ in range(120):  # past Powertools' 100-value flush, which would print even when disabled
        handle(audit_event(), audit_context())
    assert emf_documents(capsys.readouterr().out) == []
    assert len(audit_writer.metrics.metric_set[audit_writer.EVENTS_WRITTEN]["Value"]) == 1


def test_the_usage_reconciler_prints_records_and_the_reconciled_cost_once(
    environment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = MemoryUsageLedger()
    handle = usage_reconciler.build_handler(lambda: ledger)
    event = usage_event(
        message([finished("req-a", cost=1500), finished("req-b", cost=None)]),
        message([finished("req-c", cost=250)]),
        "not json",
    )
    handle(event, usage_context())

    docs = emf_documents(capsys.readouterr().out)
    counts = next(d for d in docs if usage_reconciler.RECORDS_RECONCILED in d)
    assert counts["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["environment"]]
    assert counts["environment"] == environment
    values = metric_values([counts])
    assert values[usage_reconciler.RECORDS_RECONCILED] == 3.0
    assert values[usage_reconciler.BATCH_FAILURES] == 1.0
    cost = next(d for d in docs if usage_reconciler.COST in d)
    (directive,) = cost["_aws"]["CloudWatchMetrics"]
    assert sorted(directive["Dimensions"][0]) == ["environment", "kind"]
    assert (cost["environment"], cost["kind"]) == (environment, "reconciled")
    # 1500 + 250 micro-USD; req-b's cost is unknown
    assert metric_values([cost])[usage_reconciler.COST] == pytest.approx(0.00175)

    handle(event, usage_context())  # redelivered: duplicates, nothing newly reconciled
    again = emf_documents(capsys.readouterr().out)
    assert [metric_values([d])[usage_reconciler.RECORDS_RECONCILED] for d in again] == [0.0]
    assert not any(usage_reconciler.COST in d for d in again)


def _refresh(store: MemorySnapshotStore, catalog: Path) -> dict[str, Any]:
    settings = RefreshSettings.from_env(
        {"TOLLWAY_BUCKET_PRICING": "pricing-bucket", "TOLLWAY_PRICING_SOURCES": f"file://{catalog}"}
    )
    handle = pricing_refresh.build_handler(lambda _: store, settings=lambda: settings)
    return handle(SCHEDULED, None)


def test_a_pricing_refresh_counts_one_success_or_one_failure_per_run(
    environment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemorySnapshotStore()
    assert _refresh(store, DATA / "models_dev.json")["status"] == "published"
    (doc,) = emf_documents(capsys.readouterr().out)
    assert doc["environment"] == environment
    values = metric_values([doc])
    assert (values[pricing_refresh.SUCCEEDED], values[pricing_refresh.FAILED]) == (1.0, 0.0)
    assert (values[pricing_refresh.PRICES], values[pricing_refresh.PUBLISHED]) == (3.0, 1.0)

    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert _refresh(store, bad)["status"] == "rejected"
    values = metric_values(emf_documents(capsys.readouterr().out))
    assert (values[pricing_refresh.SUCCEEDED], values[pricing_refresh.FAILED]) == (0.0, 1.0)
    assert pricing_refresh.PRICES not in values


class _BrokenStore(MemorySnapshotStore):
    def put(self, key: str, body: bytes) -> None:
        raise SnapshotStoreError(f"s3://pricing-bucket/{key}: PutObject failed: ServiceUnavailable")


def test_a_raising_pricing_refresh_still_prints_its_failure(
    environment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SnapshotStoreError):
        _refresh(_BrokenStore(), DATA / "models_dev.json")
    values = metric_values(emf_documents(capsys.readouterr().out))
    assert (values[pricing_refresh.SUCCEEDED], values[pricing_refresh.FAILED]) == (0.0, 1.0)


def test_worker_logs_are_json_with_the_lambda_context_and_no_message_content(
    environment: str, log_lines: io.StringIO
) -> None:
    event = audit_event()
    audit_writer.build_handler(MemoryAuditStore)(event, audit_context())
    usage_reconciler.build_handler(MemoryUsageLedger)(usage_event(message([finished("req-z")])), usage_context())
    _refresh(MemorySnapshotStore(), DATA / "models_dev.json")

    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    by_service = {line["service"] for line in lines}
    assert by_service == {audit_writer.SERVICE, usage_reconciler.SERVICE, pricing_refresh.SERVICE}
    for line in lines:
        assert {"level", "message", "timestamp", "function_request_id", "cold_start"} <= set(line)
        assert "_aws" not in line
    audit = [line for line in lines if line["service"] == audit_writer.SERVICE]
    assert {line["function_request_id"] for line in audit} == {audit_context().aws_request_id}
    assert any("batch of 3 message(s): 1 failed" in line["message"] for line in audit)
    text = log_lines.getvalue()
    for record in event["Records"]:
        assert record["body"] not in text
    for value in ("principal-ada", "gpt-4o-mini", "tenant-acme", "sha256:"):
        assert value not in text
    pricing = [line for line in lines if line["service"] == pricing_refresh.SERVICE]
    assert pricing and all(line["function_name"] == pricing_refresh.SERVICE for line in pricing)


def test_the_worker_loggers_are_the_standard_loggers_the_batch_helpers_write_to() -> None:
    for module in (audit_writer, usage_reconciler):
        assert module.log is logging.getLogger(module.SERVICE)
        assert module.logger.logger_handler in module.log.handlers


def test_the_stack_reads_the_metric_names_the_workers_print() -> None:
    assert observability.AUDIT_EVENTS_WRITTEN == audit_writer.EVENTS_WRITTEN
    assert observability.AUDIT_BATCH_FAILURES == audit_writer.BATCH_FAILURES
    assert observability.USAGE_RECORDS_RECONCILED == usage_reconciler.RECORDS_RECONCILED
    assert observability.RECONCILED_COST == usage_reconciler.COST
    assert observability.PRICING_REFRESH_FAILED == pricing_refresh.FAILED
    assert observability.PRICING_REFRESH_SUCCEEDED == pricing_refresh.SUCCEEDED
    assert observability.NAMESPACE == NAMESPACE
