"""``requireConformance``: which routes may be published, judged from stored conformance results.

A route requires conformance when its own ``requireConformance`` says so, else when
``conformance.requireConformance`` does. Such a route needs a result for its (provider, model)
pair that is no older than ``conformance.maxAgeHours``, was measured with this suite (version and
digest) over the route's provider format, and passed every capability the route needs: ``chat``,
``usage`` and ``errors`` always, and each of ``streaming``, ``tools``, ``vision``, ``json_object``
and ``json_schema`` the route declares (its ``capabilities``, else its alias's). Embeddings aliases
are not judged: the suite is a chat suite.

:func:`check_routes` is pure; :func:`check_config` reads the results first. Both return every
problem as a :class:`~tollway.exceptions.ConfigIssue` at ``models[i].routes[j]``, so publication
and ``tollway config validate`` report them the way they report any configuration problem.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tollway.conformance.result import ConformanceResult
from tollway.conformance.store import ConformanceStoreError, ResultKey, ResultStore, open_store, results_location
from tollway.conformance.suite import ALWAYS_REQUIRED, ROUTE_CAPABILITIES, SUITE_VERSION, suite_digest
from tollway.exceptions import ConfigIssue

if TYPE_CHECKING:
    from tollway.config.schema import ModelConfig, RouteConfig, RouterConfig

__all__ = [
    "check_config",
    "check_routes",
    "gated_routes",
    "load_results",
    "pair_capabilities",
    "required_capabilities",
]


def required_capabilities(model: ModelConfig, route: RouteConfig) -> tuple[str, ...]:
    """The suite capabilities a route needs to pass, in the suite's order."""
    declared = route.capabilities if route.capabilities is not None else model.capabilities
    return (*ALWAYS_REQUIRED, *(c for c in ROUTE_CAPABILITIES if c in declared))


def pair_capabilities(cfg: RouterConfig, deployment: str, model: str) -> tuple[str, ...]:
    """What the chat routes on (``deployment``, ``model``) need, together: what ``tollway
    conformance run`` judges its exit status by."""
    need = {
        c
        for m in cfg.models
        if "embeddings" not in m.operations
        for r in m.routes
        if r.provider == deployment and r.model == model
        for c in required_capabilities(m, r)
    }
    return tuple(c for c in (*ALWAYS_REQUIRED, *ROUTE_CAPABILITIES) if c in need)


def gated_routes(cfg: RouterConfig) -> list[tuple[int, int]]:
    """``(model index, route index)`` of every chat route that requires conformance."""
    default = cfg.conformance.requireConformance
    return [
        (i, j)
        for i, model in enumerate(cfg.models)
        if "embeddings" not in model.operations
        for j, route in enumerate(model.routes)
        if (default if route.requireConformance is None else route.requireConformance)
    ]


def _pair(route: RouteConfig) -> str:
    return f"deployment {route.provider!r} model {route.model!r}"


def _route_issues(
    model: ModelConfig, route: RouteConfig, result: ConformanceResult | None, now: float, max_age_hours: int
) -> list[str]:
    pair = _pair(route)
    if result is None:
        return [
            f"requires conformance, but {pair} has no conformance result "
            f"(tollway conformance run --deployment {route.provider})"
        ]
    if result.suite_version != SUITE_VERSION or result.suite_digest != suite_digest():
        return [
            f"the conformance result of {pair} is of suite version {result.suite_version} "
            f"({result.suite_digest[:12]}), not version {SUITE_VERSION} ({suite_digest()[:12]}): run it again"
        ]
    age_h = (now - result.finished_at) / 3600
    if age_h > max_age_hours:
        return [
            f"the conformance result of {pair} is {age_h:.0f} h old, older than conformance.maxAgeHours "
            f"({max_age_hours} h): run it again"
        ]
    if result.provider_format != route.providerFormat:
        return [
            f"the conformance result of {pair} was measured over {result.provider_format}, "
            f"the route uses {route.providerFormat}: run it again"
        ]
    problems = []
    verdicts = result.capabilities
    for capability in required_capabilities(model, route):
        verdict = verdicts.get(capability, "skipped")
        if verdict == "fail":
            failed = result.failed_cases(capability)
            cases = "; ".join(f"case {c.case} failed: {c.reason}" for c in failed)
            problems.append(f"{pair} failed conformance for capability {capability!r} ({cases})")
        elif verdict != "pass":
            problems.append(f"{pair} was not tested for capability {capability!r} (its cases were skipped)")
    return problems


def check_routes(cfg: RouterConfig, results: Mapping[ResultKey, ConformanceResult], now: float) -> list[ConfigIssue]:
    """Every problem of every route that requires conformance, given the latest result of each
    (provider, model) pair and the time ``now`` (seconds since the epoch)."""
    issues = []
    for i, j in gated_routes(cfg):
        model = cfg.models[i]
        route = model.routes[j]
        result = results.get((route.provider, route.model))
        for message in _route_issues(model, route, result, now, cfg.conformance.maxAgeHours):
            issues.append(ConfigIssue(f"models[{i}].routes[{j}]", message))
    return issues


def load_results(
    cfg: RouterConfig, base: Path | None = None, environ: Mapping[str, str] | None = None
) -> dict[ResultKey, ConformanceResult]:
    """Every latest result at the configured location (``conformance.results``, see
    :mod:`tollway.conformance.store`); :class:`ConformanceStoreError` when it cannot be read."""
    return open_store(results_location(cfg.conformance.results, environ), base).read_all()


def check_config(
    cfg: RouterConfig,
    base: Path | None = None,
    *,
    now: float | None = None,
    environ: Mapping[str, str] | None = None,
    store: ResultStore | None = None,
) -> list[ConfigIssue]:
    """:func:`check_routes` over the results at the configured location, read only when some
    route requires conformance; a location that cannot be read is one issue at ``conformance.results``.
    ``base`` is the configuration file's folder; ``store`` replaces the configured one (tests)."""
    if not gated_routes(cfg):
        return []
    env = os.environ if environ is None else environ
    try:
        results = store.read_all() if store is not None else load_results(cfg, base, env)
    except ConformanceStoreError as exc:
        return [ConfigIssue("conformance.results", str(exc))]
    return check_routes(cfg, results, time.time() if now is None else now)
