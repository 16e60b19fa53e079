"""The transport interface: what the gateway needs from an upstream HTTP client.

Three implementations sit behind it (``h1``, the default, on httptools; ``aiohttp``; ``httpx``);
which one a deployment uses is chosen at publication (``httpClient`` in ``llm-router.yml``), with
numbers in docs/benchmarks.md.

A deployment whose provider authenticates each request (Bedrock's SigV4) gives its transport a
``Signer``: called per request with the method, the exact URL sent and the headers sent, its
headers are added to that request alone, after the static credential headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tollway.transport.sigv4 import Signer
from tollway.wire import UpstreamRequest

if TYPE_CHECKING:
    from tollway.transport import HttpClient

__all__ = [
    "MAX_ERROR_BODY",
    "ConnectTiming",
    "Signer",
    "Transport",
    "TransportFactory",
    "TransportSettings",
    "UpstreamStream",
    "read_prefix",
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
class TransportSettings:
    base_url: str
    connect_timeout_s: float
    request_timeout_s: float
    stream_idle_timeout_s: float
    max_connections: int = 256
    max_response_bytes: int = 16 * 1024 * 1024
    trace_connect: bool = False
    """Time each call's connection set-up (``ConnectTiming``); off, the client carries no tracing."""


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
