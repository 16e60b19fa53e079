"""Buffered deployment: the gateway app behind Mangum, for Function-URL and API-Gateway events.

Streaming clients use the other deployment (``run.sh`` under the Lambda Web Adapter in
RESPONSE_STREAM mode); here a ``stream: true`` request is answered with the whole SSE body at
once, because Mangum returns one buffered response.

The app is built once per execution environment, at import (the init phase). Lifespan is off:
Mangum would otherwise run startup and shutdown around every invocation and close the upstream
connection pools after each one. Pools live as long as the environment; the file watch and the
loop-lag monitor are server-mode features and do not run here. What the init phase built is
frozen out of the garbage collector's way, as server mode does at start-up.

Metrics: nothing scrapes a Lambda function, so after each invocation what the app's metrics
recorded during it is printed as CloudWatch EMF documents (:class:`tollway.telemetry.emf.EmfFlusher`),
before Lambda freezes the environment. The runtime's ``metrics`` is read with ``getattr`` on each
invocation: it is ``None`` (or absent) when the config turns metrics off, and then nothing is
printed. A failed flush is logged and never fails the invocation.
"""

from __future__ import annotations

import logging
from typing import Any

from mangum import Mangum

from functions.gateway.app import app
from tollway.server.app import freeze_startup_heap
from tollway.telemetry.emf import EmfFlusher

__all__ = ["handler"]

log = logging.getLogger("tollway.telemetry")

_mangum = Mangum(app, lifespan="off", api_gateway_base_path="/")


class _Flush:
    """The flusher of the runtime's current metrics object, built on first use."""

    flusher: EmfFlusher | None = None

    @classmethod
    def after_invocation(cls) -> None:
        metrics = getattr(app.state.runtime, "metrics", None)
        if metrics is None:
            return
        try:
            if cls.flusher is None or cls.flusher.metrics is not metrics:
                cls.flusher = EmfFlusher(metrics)
            cls.flusher.flush()
        except Exception:
            log.exception("EMF metrics flush failed")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Mangum's answer to ``event``; the invocation's metrics are printed before it returns."""
    try:
        return _mangum(event, context)
    finally:
        _Flush.after_invocation()


freeze_startup_heap(collect=False)
