"""``GET /healthz``: liveness, the active root, in-flight counts and the audit trail's state."""

from __future__ import annotations

import os
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tollway.server.http import json_response, runtime_of

__all__ = ["healthz"]


async def healthz(request: Request) -> Response:
    runtime = runtime_of(request)
    root, admission, pipeline = runtime.holder.root, runtime.admission, runtime.pipeline
    assert pipeline is not None
    body: dict[str, Any] = {
        "status": "ok",
        "generation": root.generation,
        "digest": root.digest[:12],
        "pid": os.getpid(),
        "in_flight": {"requests": admission.requests, "streams": admission.streams},
        "loop_lag_ms": round(admission.loop_lag_s * 1000, 1),
        "shed_for_loop_lag": admission.shed_lag,
        "unauthenticated": pipeline.counters.unauthenticated,
    }
    if runtime.audit is not None:
        body["audit"] = runtime.audit.stats()
    return json_response(orjson.dumps(body))
