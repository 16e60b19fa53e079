"""SQS → usage ledger: each message of the batch is applied alone and fails alone.

Powertools' :class:`BatchProcessor` reports the failed messages in ``batchItemFailures`` (the event
source mapping has ``ReportBatchItemFailures`` on), so SQS redelivers only those and, past the
queue's maxReceiveCount, dead-letters them. Every event of a message is checked against the usage
contract before any is written, so a malformed message writes nothing. Each ``request_finished``
is then one ledger transaction; a redelivered message (or one that failed half-way) is harmless,
because a request already accounted is a duplicate, a no-op. Events of other kinds are skipped.

The ledger comes from a factory, so tests hand :func:`build_handler` a fake; the deployed
:data:`handler` builds the DynamoDB ledger the environment names on its first invocation, never at
import. Logs carry message ids, counts and error types only: never a body or an event field.

Logs are Powertools JSON lines with the Lambda context, service :data:`SERVICE`. Each invocation
prints one CloudWatch EMF document (namespace ``Tollway``, dimension ``environment``): the
requests it newly accounted (:data:`RECORDS_RECONCILED`) and the messages it reported as failed
(:data:`BATCH_FAILURES`). When those requests carried a cost, a second document adds it in USD to
:data:`COST`, the metric the gateway's estimates go to, with the extra dimension ``kind=reconciled``
(the gateway's are ``kind=estimated``): only newly accounted requests count, so a redelivered
batch adds nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Final, cast

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

from tollway.audit.messages import MalformedMessage, decode_message
from tollway.metering import (
    ApplyResult,
    DynamoDBUsageLedger,
    LedgerSettings,
    MalformedUsageEvent,
    UsageLedger,
    UsageLedgerUnavailable,
    usage_record,
)
from tollway.sqs_batch import SqsHandler, sqs_batch_handler
from tollway.telemetry.emf import NAMESPACE, metrics_environment

__all__ = [
    "BATCH_FAILURES",
    "COST",
    "RECORDS_RECONCILED",
    "SERVICE",
    "LedgerFactory",
    "MessageResult",
    "SqsHandler",
    "build_handler",
    "cost_metrics",
    "default_ledger",
    "handler",
    "logger",
    "metrics",
]

SERVICE: Final = "tollway.usage_reconciler"
RECORDS_RECONCILED: Final = "tollway_usage_records_reconciled"
BATCH_FAILURES: Final = "tollway_usage_batch_failures"
COST: Final = "tollway_cost_usd_total"
"""The gateway's cost counter (``kind=estimated``): one CloudWatch metric, split by ``kind``."""

logger = Logger(service=SERVICE)
"""JSON log lines to stdout. Powertools configures the standard logger named :data:`SERVICE`,
which is what :mod:`tollway.sqs_batch` (typed for a ``logging.Logger``) is handed as ``log``."""
log = logging.getLogger(SERVICE)
metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
"""This function's own metric set (``Metrics`` would share one set with every function the local
runner imports into its process); ``service=""`` keeps Powertools' ``service`` dimension off. One
invocation at a time uses it, as Lambda and the local runner (one poller per mapping) invoke."""
cost_metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
"""The reconciled cost: a document of its own, since it has one dimension more (``kind``)."""

_NO_CONTEXT: Final = SimpleNamespace(
    function_name=SERVICE, memory_limit_in_mb=0, invoked_function_arn="", aws_request_id=""
)
"""What Powertools reads from a Lambda context, for a direct call (a script, a test) that passes none."""

LedgerFactory = Callable[[], UsageLedger]

_SAFE_TEXT = (MalformedMessage, MalformedUsageEvent, UsageLedgerUnavailable)
"""Errors whose text names positions, fields, tables and codes only, and so may be logged."""


@dataclass(frozen=True, slots=True)
class MessageResult:
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0
    cost_micro_usd: int = 0
    """The known cost of the requests this message newly accounted (the applied ones)."""


@functools.lru_cache(maxsize=4)
def _ledger_for(settings: LedgerSettings) -> DynamoDBUsageLedger:
    return DynamoDBUsageLedger(settings)


def default_ledger() -> UsageLedger:
    """The DynamoDB ledger the environment names, built on first use and reused while the settings hold."""
    return _ledger_for(LedgerSettings.from_env())


def _apply(ledger: UsageLedger, body: str) -> MessageResult:
    events = decode_message(body)
    records = [usage_record(event) for event in events]  # the whole message is checked before anything is written
    results = [ledger.apply(event) for event in events]
    cost = sum(
        r.cost_micro_usd or 0 for r, res in zip(records, results, strict=True) if r and res == ApplyResult.APPLIED
    )
    applied, duplicates = results.count(ApplyResult.APPLIED), results.count(ApplyResult.DUPLICATE)
    return MessageResult(applied, duplicates, results.count(ApplyResult.SKIPPED), cost)


def _describe(result: MessageResult) -> str:
    return f"{result.applied} request(s) applied, {result.duplicates} duplicate(s), {result.skipped} event(s) skipped"


@dataclass(slots=True)
class _Tally:
    """What one invocation accounted, for its metrics."""

    applied: int = 0
    cost_micro_usd: int = 0

    def apply(self, ledger: LedgerFactory, body: str) -> MessageResult:
        result = _apply(ledger(), body)
        self.applied += result.applied
        self.cost_micro_usd += result.cost_micro_usd
        return result


def build_handler(ledger: LedgerFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS message's events to ``ledger()``."""

    def invoke(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        environment = metrics_environment()
        # A flush clears a set; with POWERTOOLS_METRICS_DISABLED it does not, so clear here.
        metrics.clear_metrics()
        cost_metrics.clear_metrics()
        metrics.add_dimension("environment", environment)
        tally = _Tally()
        process = sqs_batch_handler(lambda body: tally.apply(ledger, body), _describe, safe=_SAFE_TEXT, log=log)
        response: PartialItemFailureResponse | None = None
        try:
            response = process(event, context)
            return response
        finally:
            failed = len(response["batchItemFailures"]) if response is not None else len(event.get("Records", []))
            metrics.add_metric(RECORDS_RECONCILED, MetricUnit.Count, tally.applied)
            metrics.add_metric(BATCH_FAILURES, MetricUnit.Count, failed)
            if tally.cost_micro_usd:
                cost_metrics.add_dimension("environment", environment)
                cost_metrics.add_dimension("kind", "reconciled")
                cost_metrics.add_metric(COST, MetricUnit.NoUnit, tally.cost_micro_usd / 1e6)
                cost_metrics.flush_metrics()

    # Powertools' decorators: the context's keys on every log line, the metrics printed at the end.
    instrumented = cast(
        SqsHandler, metrics.log_metrics(logger.inject_lambda_context(invoke), raise_on_empty_metrics=False)
    )

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        return instrumented(event, context if context is not None else _NO_CONTEXT)

    return handler


handler = build_handler(default_ledger)
