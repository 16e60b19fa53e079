"""Server mode: the ASGI app, the SSE response, and the per-process runtime."""

from tollway.server.app import create_app

__all__ = ["create_app"]
