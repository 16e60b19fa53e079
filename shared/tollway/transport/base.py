"""The transport interface: what the gateway needs from an upstream HTTP client.

Three implementations sit behind it (``h1``, the default, on httptools; ``aiohttp``; ``httpx``);
which one a deployment uses is chosen at publication (``httpClient`` in ``llm-router.yml``), with
numbers in docs/benchmarks.md.

A deployment whose provider authenticates each request (Bedrock's SigV4) gives its transport a
``Signer``: called per request with the method, the exact URL sent and the headers sent, its
headers are added to that request alone, after the static credential headers.

Enterprise egress is a deployment's setting too, never a request's: an HTTPS proxy its
connections tunnel through with ``CONNECT`` (``ProxySettings``), and the CA certificates its TLS
is verified against (``TransportSettings.ssl_context``, built once at publication). No client
reads a proxy from the environment.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tollway.transport.sigv4 import Signer
from tollway.wire import UpstreamRequest

if TYPE_CHECKING:
    from tollway.transport import HttpClient

__all__ = [
    "MAX_ERROR_BODY",
    "ConnectTiming",
    "ProxySettings",
    "Signer",
    "Transport",
    "TransportFactory",
    "TransportSettings",
    "UpstreamStream",
    "basic_proxy_authorization",
    "read_prefix",
    "verify_context",
]

MAX_ERROR_BODY = 64 * 1024


async def read_prefix(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """At most ``limit`` bytes from the start of ``chunks``, reading no further than needed
    (``UpstreamStream.read_bounded`` for clients whose streams are plain byte iterators)."""
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) >= limit:
            break
    return bytes(out[:limit])


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """An HTTPS proxy a deployment's connections tunnel through with ``CONNECT``."""

    url: str
    """``http://host:port``, or ``https://host:port`` for TLS to the proxy itself; never user info."""
    authorization: str | None = field(default=None, repr=False)
    """The ``Proxy-Authorization`` value sent on ``CONNECT`` (``Basic ...``), and only there. Kept out
    of ``repr``: settings are logged and fingerprinted, and this is a credential."""


def basic_proxy_authorization(credentials: str) -> str:
    """The ``Proxy-Authorization`` value for ``user:password`` (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(credentials.encode("utf-8")).decode("ascii")


@dataclass(frozen=True, slots=True)
class TransportSettings:
    base_url: str
    connect_timeout_s: float
    request_timeout_s: float
    stream_idle_timeout_s: float
    max_connections: int = 256
    max_response_bytes: int = 16 * 1024 * 1024
    trace_connect: bool = False
    """Time each call's connection set-up (``ConnectTiming``); off, the client carries no tracing."""
    proxy: ProxySettings | None = None
    """Tunnel every connection through this proxy; ``None``: connect directly."""
    ca_bundle: str | None = None
    """A PEM file of the CA certificates the provider's TLS (and an ``https`` proxy's) is verified
    against, instead of the client's default trust store. Read once: see ``ssl_context``."""
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    """The verifying context built from ``ca_bundle`` at publication, so no request builds one. Left
    out of ``repr`` and equality: its identity says nothing about what it trusts."""


def verify_context(settings: TransportSettings) -> ssl.SSLContext | None:
    """The context verifying the provider's (and an ``https`` proxy's) certificates: the one built at
    publication, else one built now from ``ca_bundle`` (once per transport, when it is built), else
    ``None``: the client's default trust store."""
    if settings.ssl_context is not None:
        return settings.ssl_context
    if settings.ca_bundle is not None:
        return ssl.create_default_context(cafile=settings.ca_bundle)
    return None


class ConnectTiming(Protocol):
    """Where a call records how long getting its connection took: ``0.0`` for a pooled connection
    reused, the TCP (and TLS) set-up time for a new one; left ``None`` when neither happened."""

    connect_s: float | None


class UpstreamStream(Protocol):
    """An open streamed response. Iteration errors arrive as ``UpstreamError``."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def read_bounded(self, limit: int = MAX_ERROR_BODY) -> bytes: ...


class Transport(Protocol):
    """One pooled client for one deployment: owns the base URL and the credential headers."""

    async def send(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> tuple[int, Mapping[str, str], bytes]: ...

    def stream(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> AbstractAsyncContextManager[UpstreamStream]: ...

    async def aclose(self) -> None: ...


class TransportFactory(Protocol):
    """Builds a deployment's ``Transport`` at publication: ``tollway.transport.build_transport`` in
    production. A seam, so tests can publish real roots whose deployments answer from a script
    instead of a socket; the gateway cannot tell the difference, as it only sees ``Transport``."""

    def __call__(
        self,
        client: HttpClient,
        settings: TransportSettings,
        auth_headers: Mapping[str, str],
        /,
        *,
        signer: Signer | None = None,
    ) -> Transport:
        """``signer``, when given, signs every request (``tollway.transport.sigv4``); publication
        passes it only to deployments that sign, so a factory for unsigned providers may omit it."""
        ...
