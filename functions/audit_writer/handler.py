"""SQS → audit store: the batch's events are written together, and each message fails alone.

Every message is decoded first; the store then writes the events of all the well-formed ones at
once, merged per item (the events of one item in one batch, whichever messages hold them, are one
conditional write) and several items in flight (:meth:`tollway.audit.store.AuditStore.apply_batch`). Powertools'
:class:`BatchProcessor` reports the failed messages in ``batchItemFailures`` (the event source
mapping has ``ReportBatchItemFailures`` on): a malformed message, and a message whose events
share an item write that failed; the others are deleted. SQS redelivers only those and, past the
queue's maxReceiveCount, moves them to the dead-letter queue. A redelivered message is harmless:
the store is idempotent by ``eventId``. Even a batch in which every message fails is reported item
by item rather than raised, so the invocation never errors on message content.

The store comes from a factory, so tests hand :func:`build_handler` a fake; the deployed
:data:`handler` builds the DynamoDB store the environment names on its first invocation, never
at import.

Logs carry message ids, counts and error types only: never a message body or an event field.
They are Powertools JSON lines with the Lambda context (``function_request_id``, ``cold_start``),
service :data:`SERVICE`. Each invocation also prints one CloudWatch EMF document (namespace
``Tollway``, dimension ``environment``): the events it wrote (:data:`EVENTS_WRITTEN`), the messages
it reported as failed (:data:`BATCH_FAILURES`) and the time its store writes took
(:data:`WRITE_SECONDS`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Final, cast

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

from tollway.audit.events import AuditEvent
from tollway.audit.messages import MalformedMessage, decode_message
from tollway.audit.store import (
    ApplyResult,
    AuditStore,
    AuditStoreError,
    DynamoDBAuditStore,
    MalformedEvent,
    StoreSettings,
)
from tollway.sqs_batch import SqsHandler, sqs_merged_batch_handler
from tollway.telemetry.emf import NAMESPACE, metrics_environment

__all__ = [
    "BATCH_FAILURES",
    "EVENTS_WRITTEN",
    "SERVICE",
    "WRITE_SECONDS",
    "SqsHandler",
    "StoreFactory",
    "build_handler",
    "default_store",
    "handler",
    "logger",
    "metrics",
]

SERVICE: Final = "tollway.audit_writer"
EVENTS_WRITTEN: Final = "tollway_audit_events_written"
BATCH_FAILURES: Final = "tollway_audit_batch_failures"
WRITE_SECONDS: Final = "tollway_audit_write_seconds"

logger = Logger(service=SERVICE)
"""JSON log lines to stdout. Powertools configures the standard logger named :data:`SERVICE`,
which is what :mod:`tollway.sqs_batch` (typed for a ``logging.Logger``) is handed as ``log``."""
log = logging.getLogger(SERVICE)
metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
"""This function's own metric set (``Metrics`` would share one set with every function the local
runner imports into its process); ``service=""`` keeps Powertools' ``service`` dimension off, so
the only dimension is ``environment``. One invocation at a time uses it, as Lambda and the local
runner (one poller per mapping) invoke."""

_NO_CONTEXT: Final = SimpleNamespace(
    function_name=SERVICE, memory_limit_in_mb=0, invoked_function_arn="", aws_request_id=""
)
"""What Powertools reads from a Lambda context, for a direct call (a script, a test) that passes none."""

StoreFactory = Callable[[], AuditStore]

_SAFE_TEXT = (MalformedMessage, MalformedEvent, AuditStoreError)
"""Errors whose text names positions, fields and codes only, and so may be logged."""


@functools.lru_cache(maxsize=4)
def _store_for(settings: StoreSettings) -> DynamoDBAuditStore:
    return DynamoDBAuditStore(settings)


def default_store() -> AuditStore:
    """The DynamoDB store the environment names, built on first use and then reused.

    Cached per settings rather than once: the local event-source runner calls handlers inside
    one long-lived process, whose environment may be pointed at another stage's table.
    """
    return _store_for(StoreSettings.from_env())


def _describe(result: ApplyResult) -> str:
    return f"{result.applied} event(s) applied, {result.duplicates} duplicate(s), {result.unknown} of unknown kind"


def _apply_all(store: StoreFactory, bodies: Sequence[str]) -> list[ApplyResult | Exception]:
    """Each message's result, or why it failed: its own decoding, or the store's writes."""
    decoded: list[list[AuditEvent] | MalformedMessage] = []
    for body in bodies:
        try:
            decoded.append(decode_message(body))
        except MalformedMessage as exc:
            decoded.append(exc)
    good = [d for d in decoded if not isinstance(d, MalformedMessage)]
    results = iter(store().apply_batch(good) if good else [])
    return [d if isinstance(d, MalformedMessage) else next(results) for d in decoded]


@dataclass(slots=True)
class _Tally:
    """What one invocation wrote, for its metrics."""

    written: int = 0
    seconds: float = 0.0

    def apply_all(self, store: StoreFactory, bodies: Sequence[str]) -> list[ApplyResult | Exception]:
        started = time.perf_counter()
        try:
            outcomes = _apply_all(store, bodies)
        finally:
            self.seconds += time.perf_counter() - started
        self.written += sum(o.applied for o in outcomes if isinstance(o, ApplyResult))
        return outcomes


def build_handler(store: StoreFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS batch's messages to ``store()``, all at once."""

    def invoke(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        # A flush clears the set; with POWERTOOLS_METRICS_DISABLED it does not, so clear here.
        metrics.clear_metrics()
        metrics.add_dimension("environment", metrics_environment())
        tally = _Tally()
        process = sqs_merged_batch_handler(
            lambda bodies: tally.apply_all(store, bodies), _describe, safe=_SAFE_TEXT, log=log
        )
        response: PartialItemFailureResponse | None = None
        try:
            response = process(event, context)
            return response
        finally:
            failed = len(response["batchItemFailures"]) if response is not None else len(event.get("Records", []))
            metrics.add_metric(EVENTS_WRITTEN, MetricUnit.Count, tally.written)
            metrics.add_metric(BATCH_FAILURES, MetricUnit.Count, failed)
            metrics.add_metric(WRITE_SECONDS, MetricUnit.Seconds, tally.seconds)

    # Powertools' decorators: the context's keys on every log line, the metrics printed at the end.
    instrumented = cast(
        SqsHandler, metrics.log_metrics(logger.inject_lambda_context(invoke), raise_on_empty_metrics=False)
    )

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        return instrumented(event, context if context is not None else _NO_CONTEXT)

    return handler


handler = build_handler(default_store)
