"""Pooled upstream HTTP clients behind one interface, and the mapping of their failures to typed errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from tollway.transport.base import (
    ProxySettings,
    Signer,
    Transport,
    TransportSettings,
    UpstreamStream,
    basic_proxy_authorization,
)

__all__ = [
    "HttpClient",
    "ProxySettings",
    "Signer",
    "Transport",
    "TransportSettings",
    "UpstreamStream",
    "basic_proxy_authorization",
    "build_transport",
]

HttpClient = Literal["h1", "aiohttp", "httpx"]


def build_transport(
    client: HttpClient,
    settings: TransportSettings,
    auth_headers: Mapping[str, str],
    *,
    signer: Signer | None = None,
) -> Transport:
    """Build the deployment's client at publication; the library is imported only when chosen.
    ``signer`` signs each request, when the provider authenticates requests one by one (SigV4)."""
    if client == "h1":
        from tollway.transport.h1 import H1Transport

        return H1Transport(settings, auth_headers, signer=signer)
    if client == "aiohttp":
        from tollway.transport.aiohttp_client import AiohttpTransport

        return AiohttpTransport(settings, auth_headers, signer=signer)
    from tollway.transport.http import ProviderTransport

    return ProviderTransport(settings, auth_headers, signer=signer)
