"""The httpx transport: one pooled client per deployment, and the httpx → ``UpstreamError`` boundary.

A ``ProviderTransport`` is built when a root is published and reused by every request that
routes to its deployment. It owns the base URL and the credential headers; codecs only ever
see relative paths, and nothing the client sends can change either.

Behind a proxy the client's transport is an ``httpx.AsyncHTTPTransport`` with ``proxy=``: httpcore
tunnels ``https://`` providers with ``CONNECT`` (``Proxy-Authorization`` on it only) and reuses a
tunnel as a pooled connection; a plain ``http://`` provider is sent to the proxy in absolute form,
with the header on each request. The CA bundle's context verifies the provider and an ``https``
proxy. ``trust_env`` stays off: no proxy comes from the environment.
"""

from __future__ import annotations

import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.transport.base import (
    MAX_ERROR_BODY,
    ConnectTiming,
    ProxySettings,
    Signer,
    TransportSettings,
    read_prefix,
    verify_context,
)
from tollway.wire import UpstreamRequest

__all__ = ["ProviderTransport", "UpstreamResponse", "map_http_error"]


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: httpx.Headers
    _response: httpx.Response

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            raise map_http_error(exc) from None

    async def read_bounded(self, limit: int = MAX_ERROR_BODY) -> bytes:
        return await read_prefix(self._response.aiter_bytes(), limit)


_CONNECTED = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete", "proxy.start_tls.complete"})
"""The last step of a connection's set-up: TCP, TLS, or TLS to the provider through a proxy's tunnel."""


class _ConnectTrace:
    """httpcore's ``trace`` extension: connection set-up time into a ``ConnectTiming``."""

    __slots__ = ("_started", "_timing")

    def __init__(self, timing: ConnectTiming) -> None:
        self._timing = timing
        self._started = 0.0

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        if name == "connection.connect_tcp.started":
            self._started = time.monotonic()
        elif name in _CONNECTED and self._started:
            self._timing.connect_s = time.monotonic() - self._started
        elif name.endswith("send_request_headers.started") and self._timing.connect_s is None:
            self._timing.connect_s = 0.0  # a pooled connection, reused


def _from_tls(exc: BaseException) -> bool:
    """The failure was TLS's (httpx wraps httpcore's error, which wraps the ``ssl`` one)."""
    cause: BaseException | None = exc
    for _ in range(4):
        if cause is None:
            return False
        if isinstance(cause, ssl.SSLError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def map_http_error(exc: BaseException) -> UpstreamError:
    """The most specific ``UpstreamError`` for an httpx failure (never includes the URL)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return UpstreamError(UpstreamCategory.CONNECT, detail="connect timeout")
    if isinstance(exc, httpx.PoolTimeout):
        return UpstreamError(UpstreamCategory.OVERLOADED, detail="connection pool exhausted")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(UpstreamCategory.TIMEOUT, detail=type(exc).__name__)
    if isinstance(exc, httpx.ConnectError):
        if _from_tls(exc):
            return UpstreamError(UpstreamCategory.CONNECT, detail="TLS handshake failed")
        return UpstreamError(UpstreamCategory.CONNECT, detail="connect failed")
    if isinstance(exc, httpx.ProxyError):  # httpcore's message is the proxy's status line: only the code is kept
        code = str(exc).split(" ", 1)[0]
        if code == "407":
            return UpstreamError(UpstreamCategory.CONNECT, detail="proxy authentication required (407)")
        status = code if code.isdigit() and len(code) == 3 else "no status"
        return UpstreamError(UpstreamCategory.CONNECT, detail=f"proxy refused the tunnel ({status})")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamError(UpstreamCategory.SERVER, detail=f"connection lost ({type(exc).__name__})")
    if isinstance(exc, TimeoutError):
        return UpstreamError(UpstreamCategory.TIMEOUT, detail="request deadline")
    return UpstreamError(UpstreamCategory.SERVER, detail=type(exc).__name__)


def _pool(settings: TransportSettings, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """The connection pool: direct, or through the deployment's proxy; verified by its CA bundle."""
    tls = verify_context(settings)
    return httpx.AsyncHTTPTransport(
        verify=tls if tls is not None else True,
        limits=limits,
        trust_env=False,
        proxy=_proxy(settings.proxy, tls),
    )


def _proxy(proxy: ProxySettings | None, tls: ssl.SSLContext | None) -> httpx.Proxy | None:
    if proxy is None:
        return None
    headers = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
    # httpcore takes a context for the proxy's own TLS only when it speaks TLS
    proxy_tls = tls if urllib.parse.urlsplit(proxy.url).scheme == "https" else None
    return httpx.Proxy(proxy.url, ssl_context=proxy_tls, headers=headers)


class ProviderTransport:
    def __init__(
        self, settings: TransportSettings, auth_headers: Mapping[str, str], *, signer: Signer | None = None
    ) -> None:
        self.settings = settings
        self._signer = signer
        self._ready: Callable[[], Awaitable[None]] | None = getattr(signer, "ready", None)
        """A signer's wait for what it signs with (a Vertex token), awaited before each request."""
        base = settings.base_url.rstrip("/") + "/"
        self._base = base
        self._urls: dict[str, str] = {}
        self._auth = dict(auth_headers)
        limits = httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
            keepalive_expiry=30.0,
        )
        # One client serves every tenant: a provider's Set-Cookie must never be stored and replayed.
        no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        self._client = httpx.AsyncClient(
            transport=_pool(settings, limits),
            follow_redirects=False,
            trust_env=False,
            cookies=no_cookies,
        )
        self._buffered_timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=settings.request_timeout_s,
            write=settings.request_timeout_s,
            pool=settings.connect_timeout_s,
        )
        self._stream_timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=min(settings.stream_idle_timeout_s, settings.request_timeout_s),
            write=settings.request_timeout_s,
            pool=settings.connect_timeout_s,
        )

    def __repr__(self) -> str:
        return f"ProviderTransport(max_connections={self.settings.max_connections})"

    def _url(self, path: str) -> str:
        url = self._urls.get(path)
        if url is None:
            url = self._base + path.lstrip("/")
            self._urls[path] = url
        return url

    def _headers(self, req: UpstreamRequest, url: str) -> dict[str, str]:
        headers = dict(req.headers)
        headers.update(self._auth)
        if self._signer is not None:
            headers.update(self._signer("POST", url, headers, req.body))
        return headers

    def _build(self, req: UpstreamRequest, timeout: httpx.Timeout, timing: ConnectTiming | None) -> httpx.Request:
        """httpx keeps a URL's percent-escapes as given, so the path sent is the path signed."""
        url = self._url(req.path)
        return self._client.build_request(
            "POST",
            url,
            content=req.body,
            headers=self._headers(req, url),
            timeout=timeout,
            extensions=self._extensions(timing),
        )

    def _extensions(self, timing: ConnectTiming | None) -> dict[str, Any] | None:
        if timing is None or not self.settings.trace_connect:
            return None
        return {"trace": _ConnectTrace(timing)}

    async def send(self, req: UpstreamRequest, timing: ConnectTiming | None = None) -> tuple[int, httpx.Headers, bytes]:
        """POST a buffered request; the caller bounds the whole call by its deadline."""
        if self._ready is not None:
            await self._ready()
        try:
            request = self._build(req, self._buffered_timeout, timing)
            resp = await self._client.send(request)
        except httpx.HTTPError as exc:
            raise map_http_error(exc) from None
        if len(resp.content) > self.settings.max_response_bytes:
            raise UpstreamError(UpstreamCategory.MALFORMED, status=resp.status_code, detail="response too large")
        return resp.status_code, resp.headers, resp.content

    @asynccontextmanager
    async def stream(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> AsyncIterator[UpstreamResponse]:
        """Open a streamed POST; leaving the context closes (and so cancels) the upstream call."""
        if self._ready is not None:
            await self._ready()
        request = self._build(req, self._stream_timeout, timing)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise map_http_error(exc) from None
        try:
            yield UpstreamResponse(response.status_code, response.headers, response)
        except httpx.HTTPError as exc:
            raise map_http_error(exc) from None
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
