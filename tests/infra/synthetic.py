"""Stand-ins the infra tests share: placeholder layer zips and a topology with one worker.

The real layers come from ``python -m layers.build`` (about 12 MB, built from the pinned
lock); the template and the deploy only need the zips to exist, so the tests write tiny ones.
``topology()`` has no worker functions yet; :func:`topology_with_worker` adds one so the
worker path (queue trigger, schedule, grants) is proven before a real worker exists.
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

from tollway.cloud.resources import FunctionSpec, Grant, QueueTrigger, ScheduleTrigger, Topology, topology

WORKER_KEY = "audit-writer"


def placeholder_layers(directory: Path) -> Path:
    """Write ``deps.zip``, ``core.zip`` and ``extension.zip`` (one small file each) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("deps", "core", "extension"):
        with zipfile.ZipFile(directory / f"{name}.zip", "w") as z:
            info = zipfile.ZipInfo(f"python/tollway_{name}_placeholder.txt", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, f"placeholder {name} layer for tests\n")
    return directory


def topology_with_worker(prefix: str) -> Topology:
    """``topology(prefix)`` plus an audit-writer-like worker: SQS trigger, schedule, two grants."""
    base = topology(prefix)
    worker = FunctionSpec(
        key=WORKER_KEY,
        name=f"{prefix}-audit-writer",
        handler="functions.gateway.handler.handler",
        source_dir="functions/gateway",
        memory_mb=256,
        timeout_s=15,
        triggers=(QueueTrigger("audit", batch_size=25, max_batching_window_s=2, max_concurrency=5),),
        schedules=(ScheduleTrigger("nightly", "rate(1 day)"),),
        grants=(Grant("table", "audit", "write"), Grant("queue", "usage", "send")),
        environment=(("TOLLWAY_WORKER_MODE", "test"),),
    )
    return dataclasses.replace(base, functions=(worker,))
