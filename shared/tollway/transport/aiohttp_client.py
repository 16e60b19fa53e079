"""The aiohttp transport: one pooled ``ClientSession`` per deployment.

The session is created on first use inside the running event loop (aiohttp binds a session to
its loop), and keeps no cookies: one session serves every tenant. A streamed response that was
read to its end goes back to the pool; one abandoned midway (client disconnect, error) closes
its connection, which is what cancels the upstream call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import SimpleNamespace

import aiohttp

from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.providers.base import UpstreamRequest
from tollway.transport.base import MAX_ERROR_BODY, ConnectTiming, TransportSettings

__all__ = ["AiohttpStream", "AiohttpTransport", "map_aiohttp_error"]

_DRAIN_BYTES = 64 * 1024
_DRAIN_TIMEOUT_S = 0.05


def _connect_trace() -> aiohttp.TraceConfig:
    """Connection set-up timing into the request's ``trace_request_ctx`` (a ``ConnectTiming``)."""

    async def started(session: object, ctx: SimpleNamespace, params: object) -> None:
        ctx.started = asyncio.get_running_loop().time()

    async def created(session: object, ctx: SimpleNamespace, params: object) -> None:
        timing = ctx.trace_request_ctx
        if timing is not None:
            timing.connect_s = asyncio.get_running_loop().time() - ctx.started

    async def reused(session: object, ctx: SimpleNamespace, params: object) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx.connect_s = 0.0

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(started)
    trace.on_connection_create_end.append(created)
    trace.on_connection_reuseconn.append(reused)
    return trace


def map_aiohttp_error(exc: BaseException) -> UpstreamError:
    """The most specific ``UpstreamError`` for an aiohttp failure (never includes the URL)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamError(UpstreamCategory.CONNECT, detail="connect timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError(UpstreamCategory.CONNECT, detail="connect failed")
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return UpstreamError(UpstreamCategory.TIMEOUT, detail=type(exc).__name__)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        return UpstreamError(UpstreamCategory.SERVER, detail=f"connection lost ({type(exc).__name__})")
    return UpstreamError(UpstreamCategory.SERVER, detail=type(exc).__name__)


class AiohttpStream:
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None

    async def read_bounded(self, limit: int = MAX_ERROR_BODY) -> bytes:
        try:
            return await self._response.content.read(limit)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None


class AiohttpTransport:
    def __init__(self, settings: TransportSettings, auth_headers: Mapping[str, str]) -> None:
        self.settings = settings
        self._base = settings.base_url.rstrip("/") + "/"
        self._urls: dict[str, str] = {}
        self._auth = dict(auth_headers)
        self._session: aiohttp.ClientSession | None = None
        self._buffered_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.request_timeout_s
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_s,
            sock_read=min(settings.stream_idle_timeout_s, settings.request_timeout_s),
        )

    def __repr__(self) -> str:
        return f"AiohttpTransport(max_connections={self.settings.max_connections})"

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.settings.max_connections, keepalive_timeout=30.0, ttl_dns_cache=300
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                trace_configs=[_connect_trace()] if self.settings.trace_connect else None,
            )
            self._session = session
        return session

    def _url(self, path: str) -> str:
        url = self._urls.get(path)
        if url is None:
            url = self._base + path.lstrip("/")
            self._urls[path] = url
        return url

    def _headers(self, req: UpstreamRequest) -> dict[str, str]:
        headers = dict(req.headers)
        headers.update(self._auth)
        return headers

    async def send(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        try:
            async with self._client().post(
                self._url(req.path),
                data=req.body,
                headers=self._headers(req),
                timeout=self._buffered_timeout,
                allow_redirects=False,
                trace_request_ctx=timing,
            ) as resp:
                body = await resp.content.read(self.settings.max_response_bytes + 1)
                status, headers = resp.status, resp.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None
        if len(body) > self.settings.max_response_bytes:
            raise UpstreamError(UpstreamCategory.MALFORMED, status=status, detail="response too large")
        return status, headers, body

    @asynccontextmanager
    async def stream(self, req: UpstreamRequest, timing: ConnectTiming | None = None) -> AsyncIterator[AiohttpStream]:
        try:
            response = await self._client().post(
                self._url(req.path),
                data=req.body,
                headers=self._headers(req),
                timeout=self._stream_timeout,
                allow_redirects=False,
                trace_request_ctx=timing,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None
        finished = False
        try:
            yield AiohttpStream(response)
            finished = True
        finally:
            if finished and not response.content.at_eof():
                finished = await self._drain(response)
            if finished and response.content.at_eof():
                response.release()
            else:
                response.close()

    @staticmethod
    async def _drain(response: aiohttp.ClientResponse) -> bool:
        """Read what is left after the terminal event (the chunked trailer), briefly, to reuse the
        connection; a provider that keeps sending is cut off instead."""
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                left = await response.content.read(_DRAIN_BYTES)
                return not left or response.content.at_eof()
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
