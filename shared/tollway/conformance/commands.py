"""What ``tollway conformance run`` and ``show`` do once the CLI has loaded the configuration.

The CLI (``tollway.cli``) parses arguments and loads the configuration; publication is a layer
above this package, so the CLI hands in its ``Publisher`` (``None`` for ``show``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tollway.conformance.policy import pair_capabilities
from tollway.conformance.result import ConformanceResult, report_lines
from tollway.conformance.runner import NotServed, Publishes, chat_targets, run_deployment
from tollway.conformance.store import ResultStore

if TYPE_CHECKING:
    from tollway.config.schema import RouterConfig

__all__ = ["UsageProblem", "run_or_show"]

UsageProblem = NotServed
"""The command names a deployment or model the configuration does not serve (exit status 2)."""


def run_or_show(
    cfg: RouterConfig,
    deployment: str,
    models: Sequence[str],
    store: ResultStore,
    publisher: Publishes | None,
    *,
    timeout_s: float = 60.0,
    out: Callable[[str], None] = print,
) -> int:
    """Run the suite (with a ``publisher``) and store the results, or show the stored ones; print
    one line per case and a summary per model. 0 when every capability the deployment's routes
    declare passed for every model, 1 otherwise (a model without a result included)."""
    if deployment not in cfg.providers:
        raise UsageProblem(f"--deployment {deployment!r} is not a provider; known: {', '.join(cfg.providers)}")
    served = chat_targets(cfg, deployment)
    chosen = list(models) or served
    if not served or any(m not in served for m in chosen):
        raise UsageProblem(f"--model: {deployment!r} serves {', '.join(served) or 'no chat route'}")
    results: list[ConformanceResult] = []
    if publisher is not None:
        results = asyncio.run(run_deployment(cfg, deployment, publisher, models=chosen, timeout_s=timeout_s))
        written = [store.write(r) for r in results]
    else:
        written = []
        for model in chosen:
            found = store.read(deployment, model)
            if found is None:
                out(f"{deployment} {model}: no result in {store.location}")
            else:
                results.append(found)
    ok = len(results) == len(chosen)
    for result in results:
        need = pair_capabilities(cfg, result.deployment, result.model)
        for line in report_lines(result, need):
            out(line)
        ok = ok and all(result.capabilities.get(c) == "pass" for c in need)
    for where in written:
        out(f"written: {where}")
    return 0 if ok else 1
