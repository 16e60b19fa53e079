"""The gateway's ASGI app, as the Lambda Web Adapter (or any ASGI server) runs it.

The config comes from ``$TOLLWAY_CONFIG``; the app itself is ``tollway.server.create_app``, so
server mode and the function serve exactly the same code.
"""

from __future__ import annotations

from typing import Any

from tollway.server.app import create_app

__all__ = ["app"]

app: Any = create_app()
