"""EventBridge schedule → the pricing refresh (:mod:`functions.pricing_refresh.refresh`) → an outcome dict.

The store, the settings, the source reader and the clock come from factories, so tests hand
:func:`build_handler` fakes; the deployed :data:`handler` builds the S3 store and reader from
the environment on its first invocation, never at import.

Logs carry the outcome's status, versions, counts, source URIs and issue paths: never a rate
value or an object body. A rejected source returns normally (the pointer is unchanged); a
pricing-bucket failure raises (:class:`~tollway.pricing.SnapshotStoreError`).

Logs are Powertools JSON lines with the Lambda context, service :data:`SERVICE`. Each run prints
one CloudWatch EMF document (namespace ``Tollway``, dimension ``environment``) with
:data:`SUCCEEDED` and :data:`FAILED`, one of them 1 and the other 0: a run fails when it raises or
when its sources are rejected, since either way the snapshot did not follow the sources. A run
that read valid sources adds the snapshot's price count (:data:`PRICES`) and whether it made a new
version current (:data:`PUBLISHED`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Final, cast

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from functions.pricing_refresh.reader import SourceReader, UriReader
from functions.pricing_refresh.refresh import refresh
from functions.pricing_refresh.settings import RefreshSettings
from tollway.pricing.store import S3SnapshotStore, SnapshotStore, StoreSettings, s3_client
from tollway.telemetry.emf import NAMESPACE, metrics_environment

__all__ = [
    "FAILED",
    "PRICES",
    "PUBLISHED",
    "SERVICE",
    "SUCCEEDED",
    "Clock",
    "ReaderFactory",
    "ScheduleHandler",
    "StoreFactory",
    "build_handler",
    "handler",
    "logger",
    "metrics",
]

SERVICE: Final = "tollway.pricing_refresh"
SUCCEEDED: Final = "tollway_pricing_refresh_succeeded"
FAILED: Final = "tollway_pricing_refresh_failed"
PRICES: Final = "tollway_pricing_snapshot_prices"
PUBLISHED: Final = "tollway_pricing_snapshot_published"

logger = Logger(service=SERVICE)
"""JSON log lines to stdout (the standard logger named :data:`SERVICE`, configured by Powertools)."""
metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
"""This function's own metric set (``Metrics`` would share one set with every function the local
runner imports into its process); ``service=""`` keeps Powertools' ``service`` dimension off."""

_NO_CONTEXT: Final = SimpleNamespace(
    function_name=SERVICE, memory_limit_in_mb=0, invoked_function_arn="", aws_request_id=""
)
"""What Powertools reads from a Lambda context, for a direct call (a script, a test) that passes none."""

StoreFactory = Callable[[RefreshSettings], SnapshotStore]
ReaderFactory = Callable[[RefreshSettings], SourceReader]
Clock = Callable[[], datetime]
ScheduleHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


@functools.lru_cache(maxsize=4)
def _store_for(settings: StoreSettings) -> S3SnapshotStore:
    return S3SnapshotStore.from_settings(settings)


def default_store(settings: RefreshSettings) -> SnapshotStore:
    """The S3 store of the configured bucket, built on first use and reused while the settings hold."""
    return _store_for(settings.store)


def default_reader(settings: RefreshSettings) -> SourceReader:
    return UriReader(s3_client(settings.store.endpoint, settings.store.region))


def _utc_now() -> datetime:
    return datetime.now(UTC)


def build_handler(
    store: StoreFactory = default_store,
    *,
    settings: Callable[[], RefreshSettings] = RefreshSettings.from_env,
    reader: ReaderFactory = default_reader,
    clock: Clock = _utc_now,
) -> ScheduleHandler:
    """A Lambda handler that refreshes the pricing snapshot from ``settings()``'s sources into ``store``."""

    def refresh_once() -> dict[str, Any]:
        config = settings()
        outcome = refresh(config, store(config), reader(config), clock())
        if outcome["status"] == "rejected":
            logger.warning(
                "pricing refresh rejected %s (%d issue(s)): %s; still current: %s",
                outcome["source"],
                outcome["issueCount"],
                "; ".join(outcome["issues"][:5]),
                outcome["current"],
            )
        else:
            logger.info(
                "pricing refresh %s: version %s (%d price(s), %d contract(s)); current %s, previous %s",
                outcome["status"],
                outcome["version"],
                outcome["prices"],
                outcome["contracts"],
                outcome["current"],
                outcome["previous"],
            )
        return outcome

    def run(event: dict[str, Any], context: Any) -> dict[str, Any]:
        # A flush clears the set; with POWERTOOLS_METRICS_DISABLED it does not, so clear here.
        metrics.clear_metrics()
        metrics.add_dimension("environment", metrics_environment())
        outcome: dict[str, Any] | None = None
        try:
            outcome = refresh_once()
            return outcome
        except Exception as exc:
            logger.error("pricing refresh failed: %s", type(exc).__name__)
            raise
        finally:
            succeeded = outcome is not None and outcome["status"] != "rejected"
            metrics.add_metric(SUCCEEDED, MetricUnit.Count, int(succeeded))
            metrics.add_metric(FAILED, MetricUnit.Count, int(not succeeded))
            if outcome is not None and succeeded:
                metrics.add_metric(PRICES, MetricUnit.Count, outcome["prices"])
                metrics.add_metric(PUBLISHED, MetricUnit.Count, int(outcome["status"] == "published"))

    # Powertools' decorators: the context's keys on every log line, the metrics printed at the end.
    instrumented = cast(
        ScheduleHandler, metrics.log_metrics(logger.inject_lambda_context(run), raise_on_empty_metrics=False)
    )

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return instrumented(event, context if context is not None else _NO_CONTEXT)

    return handler


handler = build_handler()
"""The pricing-refresh function, fired by its EventBridge schedule."""
