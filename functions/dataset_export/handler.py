"""SQS → dataset export: each message is one export request, run (or resumed) on its own.

A message's body is an export request (:func:`tollway.export.decode_message`); the handler runs
:func:`tollway.export.run_export` for it. Powertools' :class:`BatchProcessor` reports a failed
message in ``batchItemFailures`` (``ReportBatchItemFailures`` is on), so SQS redelivers it after
the visibility timeout and, past the queue's maxReceiveCount, dead-letters it. A redelivery
resumes: the shards already stored are found by key and digest and not written again, and an
identical manifest already stored is success (:mod:`tollway.export.job`). A malformed request, a
conflicting manifest or a content store that is down fail their message alone.

The dependencies come from a factory, so tests hand :func:`build_handler` fakes; the deployed
:data:`handler` builds the audit store, the exports sink and the audit queue sender from the
environment on first use, never at import, and a content store per run (its threads and key
caches live within the run's event loop, and are closed with it).

Logs carry message ids, export ids, counts, keys and error types only: never content or a row.
They are Powertools JSON lines with the Lambda context, service :data:`SERVICE`. Each invocation
prints one CloudWatch EMF document (namespace ``Tollway``, dimension ``environment``): the exports
it finished (:data:`EXPORTS_FINISHED`), the records they hold (:data:`RECORDS_EXPORTED`) and the
messages it reported as failed (:data:`BATCH_FAILURES`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Final, cast

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

from functions.dataset_export.settings import ExportSettings
from tollway.audit.ship.sinks import SqsSink
from tollway.audit.store import AuditStoreError, DynamoDBAuditStore, StoreSettings
from tollway.content import ContentError, ContentStore, ContentStoreSettings, S3ContentStore
from tollway.export import (
    AuditReader,
    ExportAudit,
    ExportError,
    ExportProgress,
    ExportResult,
    ExportSink,
    S3ExportSink,
    SinkSettings,
    SqsExportAudit,
    decode_message,
    run_export,
    status_publisher,
)
from tollway.sqs_batch import SqsHandler, sqs_batch_handler
from tollway.telemetry.emf import NAMESPACE, metrics_environment

__all__ = [
    "BATCH_FAILURES",
    "EXPORTS_FINISHED",
    "RECORDS_EXPORTED",
    "SERVICE",
    "DepsFactory",
    "ExportDeps",
    "SqsHandler",
    "build_handler",
    "default_deps",
    "handler",
    "logger",
    "metrics",
]

SERVICE: Final = "tollway.dataset_export"
EXPORTS_FINISHED: Final = "tollway_exports_finished"
RECORDS_EXPORTED: Final = "tollway_export_records"
BATCH_FAILURES: Final = "tollway_export_batch_failures"

logger = Logger(service=SERVICE)
log = logging.getLogger(SERVICE)
metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
"""This function's own metric set; ``service=""`` keeps Powertools' ``service`` dimension off."""

_NO_CONTEXT: Final = SimpleNamespace(
    function_name=SERVICE, memory_limit_in_mb=0, invoked_function_arn="", aws_request_id=""
)
_SAFE_TEXT = (ExportError, ContentError, AuditStoreError)
"""Errors whose text names fields, ids, keys and codes only, and so may be logged."""


@dataclass(frozen=True, slots=True)
class ExportDeps:
    reader: AuditReader
    content: Callable[[], ContentStore]
    """A new content store for one run; the run closes it."""
    sink: ExportSink
    audit: ExportAudit
    retention_days: Mapping[str, int] = field(default_factory=dict)
    fetch_concurrency: int = 8


DepsFactory = Callable[[], ExportDeps]


@functools.lru_cache(maxsize=4)
def _reader_for(settings: StoreSettings) -> DynamoDBAuditStore:
    return DynamoDBAuditStore(settings)


@functools.lru_cache(maxsize=4)
def _sink_for(settings: SinkSettings) -> S3ExportSink:
    return S3ExportSink(settings)


@functools.lru_cache(maxsize=4)
def _audit_for(queue: str, endpoint: str | None, region: str | None) -> SqsExportAudit:
    return SqsExportAudit(SqsSink(queue, endpoint, region or "", os.environ))


def default_deps() -> ExportDeps:
    """The environment's backends, built on first use and reused while the settings hold."""
    s = ExportSettings.from_env()
    content: ContentStoreSettings = s.content
    return ExportDeps(
        reader=_reader_for(s.audit_store),
        content=lambda: S3ContentStore(content),
        sink=_sink_for(s.sink),
        audit=_audit_for(s.audit_queue, s.sink.endpoint_url, s.sink.region),
        retention_days=dict(s.retention_days),
        fetch_concurrency=s.fetch_concurrency,
    )


def _progress(event: ExportProgress) -> None:
    log.info("export %s: %s (%d record(s), %d shard(s))", event.export_id, event.phase, event.records, event.shards)


def _both(*callbacks: Callable[[ExportProgress], None]) -> Callable[[ExportProgress], None]:
    """Log each step, and keep the run's status object current for ``tollway export create``."""

    def each(event: ExportProgress) -> None:
        for callback in callbacks:
            callback(event)

    return each


async def _run(deps: ExportDeps, body: str) -> ExportResult:
    request = decode_message(body)
    store = deps.content()
    try:
        return await run_export(
            request,
            deps.reader,
            store,
            deps.sink,
            audit=deps.audit,
            progress=_both(_progress, status_publisher(deps.sink)),
            retention_days=deps.retention_days,
            fetch_concurrency=deps.fetch_concurrency,
        )
    finally:
        await store.aclose()


def _describe(result: ExportResult) -> str:
    return (
        f"export {result.export_id}: {result.manifest['records']} record(s), "
        f"{result.shards_written} shard(s) written, {result.shards_reused} found, "
        f"manifest {'written' if result.manifest_written else 'already stored'} ({result.digest[:12]})"
    )


def build_handler(deps: DepsFactory) -> SqsHandler:
    """A Lambda handler that runs the export request of each SQS message against ``deps()``."""

    def invoke(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        metrics.clear_metrics()
        metrics.add_dimension("environment", metrics_environment())
        done: list[ExportResult] = []

        def apply(body: str) -> ExportResult:
            result = asyncio.run(_run(deps(), body))
            done.append(result)
            return result

        response: PartialItemFailureResponse | None = None
        try:
            response = sqs_batch_handler(apply, _describe, safe=_SAFE_TEXT, log=log)(event, context)
            return response
        finally:
            failed = len(response["batchItemFailures"]) if response is not None else len(event.get("Records", []))
            metrics.add_metric(EXPORTS_FINISHED, MetricUnit.Count, len(done))
            metrics.add_metric(RECORDS_EXPORTED, MetricUnit.Count, sum(int(r.manifest["records"]) for r in done))
            metrics.add_metric(BATCH_FAILURES, MetricUnit.Count, failed)

    instrumented = cast(
        SqsHandler, metrics.log_metrics(logger.inject_lambda_context(invoke), raise_on_empty_metrics=False)
    )

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        return instrumented(event, context if context is not None else _NO_CONTEXT)

    return handler


handler = build_handler(default_deps)
"""The dataset-export function, triggered by the export queue (batch size 1: one export per invocation)."""
