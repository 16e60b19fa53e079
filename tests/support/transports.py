"""Transport settings for tests against a local server: its base URL plus ``/v1``, short timeouts."""

from __future__ import annotations

from tollway.transport import TransportSettings


def transport_settings(
    base: str,
    *,
    connect: float = 1.0,
    request: float = 5.0,
    idle: float = 5.0,
    max_connections: int = 256,
    max_response_bytes: int = 16 * 1024 * 1024,
) -> TransportSettings:
    return TransportSettings(
        base_url=base + "/v1",
        connect_timeout_s=connect,
        request_timeout_s=request,
        stream_idle_timeout_s=idle,
        max_connections=max_connections,
        max_response_bytes=max_response_bytes,
    )
