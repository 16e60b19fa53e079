"""The aiohttp transport: one pooled ``ClientSession`` per deployment.

The session is created on first use inside the running event loop (aiohttp binds a session to
its loop), and keeps no cookies: one session serves every tenant. A streamed response that was
read to its end goes back to the pool; one abandoned midway (client disconnect, error) closes
its connection, which is what cancels the upstream call.

A deployment behind a proxy passes it with each request (``proxy=``, and its
``Proxy-Authorization`` as a proxy header, which aiohttp sends on ``CONNECT`` only); the
connector keys its pool by proxy, so a pooled connection is its tunnel. A plain ``http://``
provider is not tunnelled by aiohttp but sent to the proxy in absolute form, and aiohttp sends
proxy headers on ``CONNECT`` alone, so there ``Proxy-Authorization`` is one of the request's
headers. The CA bundle's context is the connector's, and verifies an ``https`` proxy too.
``trust_env`` stays off: no proxy comes from the environment.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar, Token
from typing import Any

import aiohttp
import yarl

from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.transport.base import MAX_ERROR_BODY, ConnectTiming, Signer, TransportSettings, verify_context
from tollway.wire import UpstreamRequest

__all__ = ["AiohttpStream", "AiohttpTransport", "map_aiohttp_error"]

_DRAIN_BYTES = 64 * 1024
_DRAIN_TIMEOUT_S = 0.05


_TIMING: ContextVar[ConnectTiming | None] = ContextVar("tollway_connect_timing", default=None)


class _TimedConnector(aiohttp.TCPConnector):
    """Times new connections into the calling request's ``ConnectTiming``.

    Measured: aiohttp's ``TraceConfig`` would do it, but with any trace configured every request
    builds and fires a dozen trace signals, which cost 0.36 ms of CPU per request at 500 RPS
    (docs/benchmarks.md). This wraps the one step that matters; the timing reaches it through a
    context variable set by the request's own task. (``_create_connection`` is aiohttp's internal
    hook, pinned with aiohttp; tests/functional/test_transports.py fails if it stops being called.)
    """

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        started = asyncio.get_running_loop().time()
        protocol = await super()._create_connection(req, traces, timeout)
        timing = _TIMING.get()
        if timing is not None:
            timing.connect_s = asyncio.get_running_loop().time() - started
        return protocol


def _start_timing(timing: ConnectTiming | None) -> Token[ConnectTiming | None] | None:
    """``0.0`` until the connector opens a new connection for this request (a pooled one costs none)."""
    if timing is None:
        return None
    timing.connect_s = 0.0
    return _TIMING.set(timing)


def map_aiohttp_error(exc: BaseException) -> UpstreamError:
    """The most specific ``UpstreamError`` for an aiohttp failure (never includes the URL)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamError(UpstreamCategory.CONNECT, detail="connect timeout")
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # its message and headers are the proxy's: not repeated
        if exc.status == 407:
            return UpstreamError(UpstreamCategory.CONNECT, detail="proxy authentication required (407)")
        return UpstreamError(UpstreamCategory.CONNECT, detail=f"proxy refused the tunnel ({exc.status})")
    if isinstance(exc, aiohttp.ClientSSLError):
        return UpstreamError(UpstreamCategory.CONNECT, detail="TLS handshake failed")
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
    def __init__(
        self, settings: TransportSettings, auth_headers: Mapping[str, str], *, signer: Signer | None = None
    ) -> None:
        self.settings = settings
        self._signer = signer
        self._ready: Callable[[], Awaitable[None]] | None = getattr(signer, "ready", None)
        """A signer's wait for what it signs with (a Vertex token), awaited before each request."""
        self._base = settings.base_url.rstrip("/") + "/"
        self._urls: dict[str, str] = {}
        self._encoded: dict[str, yarl.URL] = {}
        self._auth = dict(auth_headers)
        self._session: aiohttp.ClientSession | None = None
        self._ssl = verify_context(settings)
        proxy = settings.proxy
        self._proxy = proxy.url if proxy is not None else None
        self._proxy_headers: dict[str, str] | None = None
        if proxy is not None and proxy.authorization:
            if urllib.parse.urlsplit(settings.base_url).scheme == "https":
                self._proxy_headers = {"Proxy-Authorization": proxy.authorization}
            else:
                self._auth["Proxy-Authorization"] = proxy.authorization
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
            factory = _TimedConnector if self.settings.trace_connect else aiohttp.TCPConnector
            connector = factory(
                limit=self.settings.max_connections,
                keepalive_timeout=30.0,
                ttl_dns_cache=300,
                ssl=self._ssl if self._ssl is not None else True,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
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

    def _target(self, req: UpstreamRequest) -> tuple[str | yarl.URL, dict[str, str]]:
        """The URL and headers to send. A signed request's URL is passed as already encoded, so
        yarl sends exactly the path that was signed rather than re-quoting it."""
        url = self._url(req.path)
        headers = self._headers(req)
        if self._signer is None:
            return url, headers
        headers.update(self._signer("POST", url, headers, req.body))
        encoded = self._encoded.get(url)
        if encoded is None:
            encoded = self._encoded[url] = yarl.URL(url, encoded=True)
        return encoded, headers

    async def send(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        if self._ready is not None:
            await self._ready()
        token = _start_timing(timing if self.settings.trace_connect else None)
        url, sent = self._target(req)
        try:
            async with self._client().post(
                url,
                data=req.body,
                headers=sent,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
                timeout=self._buffered_timeout,
                allow_redirects=False,
            ) as resp:
                body = await resp.content.read(self.settings.max_response_bytes + 1)
                status, headers = resp.status, resp.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None
        finally:
            if token is not None:
                _TIMING.reset(token)
        if len(body) > self.settings.max_response_bytes:
            raise UpstreamError(UpstreamCategory.MALFORMED, status=status, detail="response too large")
        return status, headers, body

    @asynccontextmanager
    async def stream(self, req: UpstreamRequest, timing: ConnectTiming | None = None) -> AsyncIterator[AiohttpStream]:
        if self._ready is not None:
            await self._ready()
        token = _start_timing(timing if self.settings.trace_connect else None)
        url, headers = self._target(req)
        try:
            response = await self._client().post(
                url,
                data=req.body,
                headers=headers,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
                timeout=self._stream_timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_aiohttp_error(exc) from None
        finally:
            if token is not None:
                _TIMING.reset(token)
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
