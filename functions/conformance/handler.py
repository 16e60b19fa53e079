"""EventBridge schedule → the conformance suite against each configured deployment → results in S3.

The settings, the results store and the publisher come from factories, so tests hand
:func:`build_handler` fakes; the deployed :data:`handler` reads its settings and builds its S3
store on each invocation, never at import.

Each deployment is published from the bundled config cut down to it (``tollway.conformance.runner``)
and tested model by model; a deployment that cannot be published (a credential that does not
resolve) is reported in the outcome and the others still run. A results-store failure raises.
Logs carry deployment ids, models, capabilities and case ids: never prompt or completion text,
a provider's error body or a credential.

Each run prints one CloudWatch EMF document (namespace ``Tollway``, dimension ``environment``):
:data:`SUCCEEDED` and :data:`FAILED` (one of them 1: a run fails when it raises, or when a
deployment could not be tested or did not pass a capability its routes declare), and
:data:`FAILING_PAIRS`, the (deployment, model) pairs that did not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Final, cast

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from functions.conformance.settings import ConformanceSettings
from tollway.config.loader import load_config
from tollway.config.root import Publisher
from tollway.conformance import ResultStore, chat_targets, open_store, pair_capabilities, run_deployment
from tollway.conformance.runner import Publishes
from tollway.exceptions import ConfigError
from tollway.telemetry.emf import NAMESPACE, metrics_environment

__all__ = [
    "FAILED",
    "FAILING_PAIRS",
    "SERVICE",
    "SUCCEEDED",
    "PublisherFactory",
    "StoreFactory",
    "build_handler",
    "handler",
]

SERVICE: Final = "tollway.conformance"
SUCCEEDED: Final = "tollway_conformance_succeeded"
FAILED: Final = "tollway_conformance_failed"
FAILING_PAIRS: Final = "tollway_conformance_failing_pairs"

logger = Logger(service=SERVICE)
metrics = EphemeralMetrics(namespace=NAMESPACE, service="")
_NO_CONTEXT: Final = SimpleNamespace(
    function_name=SERVICE, memory_limit_in_mb=0, invoked_function_arn="", aws_request_id=""
)

StoreFactory = Callable[[str], ResultStore]
PublisherFactory = Callable[[ConformanceSettings], Publishes]
ScheduleHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def default_store(location: str) -> ResultStore:
    return open_store(location)


def default_publisher(settings: ConformanceSettings) -> Publishes:
    return Publisher(config_dir=settings.config.parent)


def _deployments(event: dict[str, Any], settings: ConformanceSettings, served: list[str]) -> list[str]:
    asked = event.get("deployments") if isinstance(event, dict) else None
    if isinstance(asked, list) and all(isinstance(d, str) for d in asked):
        return list(asked)
    return list(settings.deployments) or served


def build_handler(
    store: StoreFactory = default_store,
    *,
    settings: Callable[[], ConformanceSettings] = ConformanceSettings.from_env,
    publisher: PublisherFactory = default_publisher,
) -> ScheduleHandler:
    """A Lambda handler that runs the suite against ``settings()``'s deployments into ``store``."""

    def run_once(event: dict[str, Any]) -> dict[str, Any]:
        config = settings()
        cfg = load_config(config.config)
        results_store = store(config.results_for(cfg))
        served = [p for p in cfg.providers if chat_targets(cfg, p)]
        pairs: list[dict[str, Any]] = []
        errors: list[dict[str, str]] = []
        for deployment in _deployments(event, config, served):
            if deployment not in served:
                errors.append({"deployment": deployment, "error": "not a provider with chat routes"})
                continue
            try:
                results = asyncio.run(run_deployment(cfg, deployment, publisher(config), timeout_s=config.timeout_s))
            except ConfigError as exc:
                paths = ", ".join(sorted({i.path for i in exc.issues}))
                logger.error("conformance: %s could not be published (%s)", deployment, paths)
                errors.append({"deployment": deployment, "error": f"could not be published ({paths})"})
                continue
            for result in results:
                need = pair_capabilities(cfg, result.deployment, result.model)
                failing = [c for c in need if result.capabilities.get(c) != "pass"]
                key = results_store.write(result)
                pairs.append({"deployment": deployment, "model": result.model, "failing": failing, "result": key})
                failed_cases = [c.case for c in result.cases if c.outcome == "fail"]
                log = logger.warning if failing else logger.info
                log(
                    "conformance %s %s: %s; failed cases: %s",
                    deployment,
                    result.model,
                    f"failing {', '.join(failing)}" if failing else "every declared capability passed",
                    ", ".join(failed_cases) or "none",
                )
        failing_pairs = sum(1 for p in pairs if p["failing"])
        return {
            "status": "failed" if failing_pairs or errors else "passed",
            "location": results_store.location,
            "pairs": pairs,
            "errors": errors,
            "failingPairs": failing_pairs,
        }

    def run(event: dict[str, Any], context: Any) -> dict[str, Any]:
        metrics.clear_metrics()
        metrics.add_dimension("environment", metrics_environment())
        outcome: dict[str, Any] | None = None
        try:
            outcome = run_once(event)
            return outcome
        except Exception as exc:
            logger.error("conformance run failed: %s", type(exc).__name__)
            raise
        finally:
            succeeded = outcome is not None and outcome["status"] == "passed"
            metrics.add_metric(SUCCEEDED, MetricUnit.Count, int(succeeded))
            metrics.add_metric(FAILED, MetricUnit.Count, int(not succeeded))
            if outcome is not None:
                metrics.add_metric(FAILING_PAIRS, MetricUnit.Count, outcome["failingPairs"])

    instrumented = cast(
        ScheduleHandler, metrics.log_metrics(logger.inject_lambda_context(run), raise_on_empty_metrics=False)
    )

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return instrumented(event, context if context is not None else _NO_CONTEXT)

    return handler


handler = build_handler()
"""The conformance function, fired by its EventBridge schedule (when one is configured)."""
