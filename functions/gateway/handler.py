"""Buffered deployment: the gateway app behind Mangum, for Function-URL and API-Gateway events.

Streaming clients use the other deployment (``run.sh`` under the Lambda Web Adapter in
RESPONSE_STREAM mode); here a ``stream: true`` request is answered with the whole SSE body at
once, because Mangum returns one buffered response.

The app is built once per execution environment, at import (the init phase). Lifespan is off:
Mangum would otherwise run startup and shutdown around every invocation and close the upstream
connection pools after each one. Pools live as long as the environment; the file watch and the
loop-lag monitor are server-mode features and do not run here. What the init phase built is
frozen out of the garbage collector's way, as server mode does at start-up.
"""

from __future__ import annotations

from typing import Any

from mangum import Mangum

from functions.gateway.app import app
from tollway.server.app import freeze_startup_heap

__all__ = ["handler"]

handler: Any = Mangum(app, lifespan="off", api_gateway_base_path="/")
freeze_startup_heap(collect=False)
