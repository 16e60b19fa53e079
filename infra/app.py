"""The CDK app: ``python -m infra.app`` from the repository root (``cdk synth`` in ``infra/`` runs it).

Context keys (``cdk synth -c key=value``), each optional:

- ``stage``: the resource prefix and stack name (default ``tollway``);
- ``config``: the ``llm-router.yml`` bundled into the gateway (default the embedded example);
- ``layersDir``: where ``python -m layers.build`` wrote ``deps.zip``, ``core.zip`` and ``extension.zip``
  (default ``layers/dist``);
- ``conformanceSchedule``: an EventBridge ``rate(...)`` or ``cron(...)`` expression that adds the
  scheduled provider conformance function (docs/conformance.md); default none, no such function.

Relative paths are taken from the repository root, wherever ``cdk`` was started.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aws_cdk import App

from infra.assets import DEFAULT_CONFIG, DEFAULT_LAYERS_DIR, REPO_ROOT, MissingAssetError, layer_zips
from infra.stacks.tollway import StackInputs, TollwayStack
from tollway.cloud.resources import DEFAULT_PREFIX, Topology, topology

__all__ = ["AppContext", "build_stack", "main", "new_app"]

STRICT_VALIDATION: Final = "@aws-cdk/core:validateAgainstDefaultRules"
"""Turns the synth-time template validation's findings into errors: a template that would
fail (or misbehave) at deploy time fails synth instead."""


def new_app(context: Mapping[str, Any] | None = None, *, outdir: Path | None = None) -> App:
    """An :class:`App` with strict validation; ``context`` and then CLI context (``-c``) override.

    ``outdir`` is where :meth:`App.synth` writes the cloud assembly (the CLI's ``--output``
    otherwise, or a temporary folder).
    """
    return App(context={STRICT_VALIDATION: True, **(context or {})}, outdir=str(outdir) if outdir else None)


@dataclass(frozen=True, slots=True)
class AppContext:
    stage: str = DEFAULT_PREFIX
    config: Path = REPO_ROOT / DEFAULT_CONFIG
    layers_dir: Path = REPO_ROOT / DEFAULT_LAYERS_DIR
    conformance_schedule: str | None = None

    @classmethod
    def from_app(cls, app: App) -> AppContext:
        def get(key: str, default: str) -> str:
            value = app.node.try_get_context(key)
            return default if value is None or value == "" else str(value)

        return cls(
            stage=get("stage", DEFAULT_PREFIX),
            config=REPO_ROOT / get("config", DEFAULT_CONFIG),
            layers_dir=REPO_ROOT / get("layersDir", DEFAULT_LAYERS_DIR),
            conformance_schedule=get("conformanceSchedule", "") or None,
        )


def build_stack(app: App, context: AppContext, staging_dir: Path, topo: Topology | None = None) -> TollwayStack:
    """The stage's stack in ``app``; ``topo`` replaces ``topology(stage)`` (tests use a synthetic one)."""
    topo = topo or topology(context.stage, conformance_schedule=context.conformance_schedule)
    inputs = StackInputs(
        topology=topo, config=context.config, layers=layer_zips(context.layers_dir), staging_dir=staging_dir
    )
    return TollwayStack(
        app, topo.prefix, inputs=inputs, description=f"Tollway LLM gateway, stage {topo.prefix} (infra/app.py)"
    )


def main() -> int:
    """Synthesize the stage; a missing layer zip or config is one line naming the fix, not a traceback."""
    app = new_app()
    try:
        with tempfile.TemporaryDirectory(prefix="tollway-cdk-") as staging:
            build_stack(app, AppContext.from_app(app), Path(staging))
            app.synth()
    except MissingAssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
