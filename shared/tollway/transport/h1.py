"""The ``h1`` transport: a lean HTTP/1.1 client on httptools (llhttp) and asyncio protocols.

Every request a deployment sends has the same shape: a POST of a JSON body to one host, with
the codec's constant headers and the deployment's credential. A general client (aiohttp,
httpx) builds header multidicts, URL objects, timers, trace hooks and stream readers for each
one; measured in one process against the mock (medians of 3), this client costs about 99 µs
of CPU per buffered call and aiohttp about 243 µs (docs/benchmarks.md, *Decision: the h1 upstream client*).

What it does, and nothing more:

- **Pool.** Keep-alive connections to the base URL's host, reused last-in first-out; at most
  ``max_connections`` open (a request beyond waits for one, bounded by the caller's deadline, as
  with aiohttp). A connection idle for 30 s, one the server closed or marked ``Connection:
  close``, one whose response was not read to its end, one with bytes after its response, one
  left paused, and one that failed is closed, never reused.
- **Requests.** The request head is rendered once per (path, header mapping) and cached; a
  request adds only its ``content-length``. Header names and values are checked once, when
  rendered: a CR, LF or NUL is refused (no header injection). The credential headers are the
  deployment's; nothing in a request can change the host, the path's base or the credential.
  A deployment with a ``Signer`` (SigV4, a Vertex token) signs each request: the signer sees the
  URL and the headers exactly as the cached head sends them, and its headers follow
  ``content-length``. A signer with an async ``ready()`` (Vertex's token) is awaited first, so
  waiting for what it signs with never blocks the loop (all three transports do this).
  ``accept-encoding: identity``; a ``gzip`` or ``deflate`` body is decoded all the same, any
  other content encoding fails as ``MALFORMED``.
- **Responses.** httptools parses status, headers and body (content-length, chunked, or until
  close). Header names are lower-cased into a plain dict (the last value of a repeated header);
  chunked trailers are ignored. Failures of the connection (timeouts, a dropped connection, a
  malformed response) carry no status, as aiohttp's do, so the gateway's retry rules treat them
  alike.
  A buffered response over ``max_response_bytes`` fails as ``MALFORMED``. A stream's chunks are
  queued as they arrive; above 256 KiB queued (a slow client) the socket stops being read until
  the consumer catches up, so memory stays bounded.
- **Timeouts.** Connect: ``connect_timeout_s`` for TCP (and TLS), through the proxy's tunnel
  when there is one. Buffered: the whole response within ``request_timeout_s``. Streamed:
  headers, then each chunk, within ``min(stream_idle_timeout_s, request_timeout_s)`` of the last
  one, checked by one timer per period, not one per chunk; time the consumer spends not reading
  does not count.
- **Cancellation.** A cancelled call aborts its connection: that is what cancels the upstream
  call. A stream left without an error before its end (after its last event, say) first gets
  50 ms to deliver the rest, so a connection whose chunked terminator was in flight is reused;
  then it is aborted.
- **TLS.** ``https://`` base URLs verify the host name against the system's default trust
  store, or against the deployment's CA bundle (``TransportSettings.ssl_context``) when it has
  one, offering only ``http/1.1`` in ALPN. No proxies from the environment, no cookies, no
  redirects.
- **Proxy.** With ``TransportSettings.proxy`` every connection is a tunnel: TCP to the proxy (TLS
  for an ``https`` proxy, verified like the provider), ``CONNECT host:port`` with ``Host`` and, when
  configured, ``Proxy-Authorization``; the proxy's answer is read within the connect timeout and
  at most 16 KiB of it. A non-2xx answer fails the connection as a connect failure (so routing may
  fall back), never quoting the credential; a 2xx one is followed by TLS to the provider over the
  tunnel, with the provider's host name for SNI and verification. A plain ``http://`` provider
  is tunnelled with ``CONNECT`` as well rather than sent to the proxy in absolute form: one path
  for both, and the request head stays the provider's. A pooled connection is its tunnel, so
  reusing one sends no second ``CONNECT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import urllib.parse
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import httptools

from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.transport.base import (
    MAX_ERROR_BODY,
    ConnectTiming,
    Signer,
    TransportSettings,
    read_prefix,
    verify_context,
)
from tollway.wire import UpstreamRequest

__all__ = ["H1Stream", "H1Transport"]

KEEPALIVE_S: Final = 30.0
"""How long an idle pooled connection may be reused (servers commonly keep them 60 s or more)."""
PAUSE_BYTES: Final = 256 * 1024
"""Queued stream bytes above which the socket stops being read."""
_HEAD_CACHE_MAX: Final = 64
_DRAIN_S: Final = 0.05
"""How long a stream left right after its last event may take to deliver its end (the chunked
trailer) so its connection can be reused; after that it is closed instead."""
_FORBIDDEN: Final = frozenset("\r\n\0")
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (RFC 9110 token)."""
_CONNECTION_LOST: Final = "connection lost"
_PROXY_HEAD_MAX: Final = 16 * 1024
"""The most bytes of a proxy's answer to ``CONNECT`` read before it is refused."""
_PROXY_STATUS: Final = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?:[ \r]|$)")


class _Extra(Exception):
    """A response began after this connection's response was complete: stop parsing."""


class _Failure(Exception):
    """A connection-level failure, mapped to an ``UpstreamError`` at the transport's boundary."""

    def __init__(self, category: UpstreamCategory, detail: str, *, with_status: bool = False) -> None:
        super().__init__(detail)
        self.category = category
        self.detail = detail
        self.with_status = with_status
        """The response's status belongs in the error (a body too large, an unknown encoding)."""


def _error(exc: BaseException, status: int | None = None) -> UpstreamError:
    """The ``UpstreamError`` for a failure inside this client (never the URL or a header)."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, _Failure):
        return UpstreamError(exc.category, status=status if exc.with_status else None, detail=exc.detail)
    if isinstance(exc, TimeoutError):
        return UpstreamError(UpstreamCategory.TIMEOUT, detail="read timeout")
    if isinstance(exc, httptools.HttpParserError):
        return UpstreamError(UpstreamCategory.SERVER, detail=f"{_CONNECTION_LOST} (malformed response)")
    return UpstreamError(UpstreamCategory.SERVER, detail=f"{_CONNECTION_LOST} ({type(exc).__name__})")


class _ProxyAnswer(asyncio.Protocol):
    """A proxy connection until the head of its answer to ``CONNECT``; then the tunnel is handed on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: asyncio.Future[bytes] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end >= 0:
            if self.transport is not None:
                self.transport.pause_reading()  # the tunnel's next reader resumes it
            self.head.set_result(bytes(self.buffer[: end + 4]))
        elif len(self.buffer) > _PROXY_HEAD_MAX:
            self.head.set_exception(_Failure(UpstreamCategory.CONNECT, "proxy answer to CONNECT too large"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(_Failure(UpstreamCategory.CONNECT, "proxy closed the connection"))


def _proxy_refusal(answer: bytes, buffered: int) -> _Failure | None:
    """Why a proxy's answer to ``CONNECT`` opened no tunnel, or ``None`` when it did. Only its
    status is used: the rest of a proxy's answer is not ours to repeat."""
    match = _PROXY_STATUS.match(answer)
    if match is None:
        return _Failure(UpstreamCategory.CONNECT, "proxy answered CONNECT with a malformed response")
    status = int(match.group(1))
    if status == 407:
        return _Failure(UpstreamCategory.CONNECT, "proxy authentication required (407)")
    if not 200 <= status < 300:
        return _Failure(UpstreamCategory.CONNECT, f"proxy refused the tunnel ({status})")
    if buffered > len(answer):  # the provider cannot have spoken yet: not a tunnel we understand
        return _Failure(UpstreamCategory.CONNECT, "proxy sent data after its answer to CONNECT")
    return None


class _Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: deque[bytes] = deque()
        self.queued = 0
        self.received = 0
        self.limit: int | None = None
        """Buffered: the most body bytes accepted; more fails the response."""
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.head_waiter: asyncio.Future[None] | None = None
        self.body_waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.last_data = 0.0
        self.decoder: Any = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.head_waiter is None:
            # Bytes on an idle pooled connection (a server's 408 before it closes, say) answer
            # no request of ours: the connection is not reused, nor its bytes taken for an answer.
            self._fail(_Failure(UpstreamCategory.SERVER, f"{_CONNECTION_LOST} (unsolicited data)"))
            return
        if self.complete:
            self._discard()  # bytes after our whole answer: keep the answer, drop the connection
            return
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_Failure(UpstreamCategory.SERVER, f"{_CONNECTION_LOST} (unexpected upgrade)"))
        except httptools.HttpParserCallbackError as exc:  # a callback raised: a limit, or zlib.error
            cause = exc.__context__
            if isinstance(cause, _Extra):
                self._discard()
            else:
                self._fail(cause if isinstance(cause, _Failure) else exc)
        except Exception as exc:  # HttpParserError: not HTTP/1.1
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete or self.error is not None:
            return
        delimited = "transfer-encoding" in self.headers or "content-length" in self.headers
        if exc is None and self.status and not delimited:  # the head was parsed
            self._flush_decoder()  # a body delimited by the end of the connection: it is whole
            self._complete()
            return
        self._fail(exc or _Failure(UpstreamCategory.SERVER, f"{_CONNECTION_LOST} (closed by the server)"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            raise _Extra  # a second response in the same read: never parsed into ours

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status:
            return  # the head is parsed, so this is a chunked trailer: it must not overwrite a header
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            self.headers = {}  # an interim 1xx answer: the real one follows
            return
        self.status = status  # non-zero from here on: the head is parsed
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self.decoder = zlib.decompressobj()
        elif encoding not in ("identity", ""):
            raise _Failure(UpstreamCategory.MALFORMED, "unsupported content encoding", with_status=True)
        waiter = self.head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.decoder is not None:
            # Buffered: never inflate past the limit (a small compressed body may expand a thousandfold).
            room = 0 if self.limit is None else self.limit - self.received + 1
            body = self.decoder.decompress(body, room)
            if not body:
                return
        self.received += len(body)
        if self.limit is not None and self.received > self.limit:
            raise _Failure(UpstreamCategory.MALFORMED, "response too large", with_status=True)
        self.chunks.append(body)
        self.queued += len(body)
        if self.limit is None and self.queued > PAUSE_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status == 0:
            return  # the end of an interim 1xx answer
        self._flush_decoder()
        self.keep_alive = self.parser.should_keep_alive()
        self._complete()

    def _flush_decoder(self) -> None:
        if self.decoder is not None:
            rest = self.decoder.flush()
            if rest:
                self.chunks.append(rest)
                self.queued += len(rest)

    def _complete(self) -> None:
        self.complete = True
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_result(None)
        self._wake()

    def _wake(self) -> None:
        waiter = self.body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _discard(self) -> None:
        """Keep the complete answer, but close the connection: what followed it is not ours."""
        self.keep_alive = False
        self.abort()

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        for waiter in (self.head_waiter, self.body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self.abort()

    def take(self) -> bytes:
        """Everything queued, as one ``bytes``; resumes reading if it was paused."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.queued = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_data = self.loop.time()  # the pause was ours, not the server's
            self.transport.resume_reading()
        return data

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        # A paused socket would never be read again by the next request: close it instead.
        return self.complete and self.keep_alive and not self.closed and self.error is None and not self.paused


def _check_header(name: str, value: str) -> tuple[str, str]:
    if _TOKEN.fullmatch(name) is None or _FORBIDDEN.intersection(value):
        raise ValueError(f"header {name!r} has a character HTTP/1.1 does not allow")
    return name, value


class _Head:
    """A rendered request head up to ``content-length: ``, and what a signer must see of it."""

    __slots__ = ("headers", "path", "prefix", "sent", "url")

    def __init__(self, headers: Mapping[str, str], path: str, prefix: bytes, url: str, sent: dict[str, str]) -> None:
        self.headers = headers
        """The request's header mapping, held so that its ``id`` stays unique while cached."""
        self.path = path
        self.prefix = prefix
        self.url = url
        self.sent = sent
        """The headers the head carries besides ``host`` and the transport's own."""


class H1Transport:
    def __init__(
        self, settings: TransportSettings, auth_headers: Mapping[str, str], *, signer: Signer | None = None
    ) -> None:
        self.settings = settings
        self._signer = signer
        self._ready: Callable[[], Awaitable[None]] | None = getattr(signer, "ready", None)
        """A signer's wait for what it signs with (a Vertex token), awaited before each request."""
        parts = urllib.parse.urlsplit(settings.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the h1 transport needs an http:// or https:// base URL with a host")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._authority = host if default_port else f"{host}:{self._port}"
        self._base_path = parts.path.rstrip("/") + "/"
        self._origin = f"{parts.scheme}://{self._authority}"
        self._auth = [_check_header(k, v) for k, v in auth_headers.items()]
        self._heads: dict[int, _Head] = {}
        self._ssl: ssl.SSLContext | None = verify_context(settings)
        if self._ssl is not None:
            self._ssl.set_alpn_protocols(["http/1.1"])
        self._proxy: tuple[str, int, bool] | None = None
        """The proxy's host, port and whether it speaks TLS."""
        self._connect_head = b""
        if settings.proxy is not None:
            proxy = urllib.parse.urlsplit(settings.proxy.url)
            if proxy.scheme not in ("http", "https") or not proxy.hostname:
                raise ValueError("the h1 transport needs an http:// or https:// proxy URL with a host")
            proxy_tls = proxy.scheme == "https"
            self._proxy = (proxy.hostname, proxy.port or (443 if proxy_tls else 80), proxy_tls)
            target = f"{host}:{self._port}"
            lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
            if settings.proxy.authorization is not None:
                lines.append("{}: {}".format(*_check_header("Proxy-Authorization", settings.proxy.authorization)))
            self._connect_head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Connection] = []
        self._closed = False
        """``aclose`` was called: a connection in use is closed when its call ends, not pooled."""
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._buffered_s = settings.request_timeout_s
        self._stream_idle_s = min(settings.stream_idle_timeout_s, settings.request_timeout_s)

    def __repr__(self) -> str:
        return f"H1Transport(max_connections={self.settings.max_connections})"

    # request heads
    def _head(self, req: UpstreamRequest) -> bytes:
        headers = req.headers
        head = self._heads.get(id(headers))
        if head is None or head.headers is not headers or head.path != req.path:
            head = self._render(req.path, headers)
            if len(self._heads) >= _HEAD_CACHE_MAX:
                self._heads.clear()
            self._heads[id(headers)] = head
        if self._signer is None:
            return head.prefix + b"%d\r\n\r\n" % len(req.body)
        signed = self._signer("POST", head.url, head.sent, req.body)
        lines = "".join("{}: {}\r\n".format(*_check_header(name, value)) for name, value in signed.items())
        return head.prefix + b"%d\r\n" % len(req.body) + lines.encode("latin-1") + b"\r\n"

    def _render(self, path: str, headers: Mapping[str, str]) -> _Head:
        target = self._base_path + path.lstrip("/")
        if _FORBIDDEN.intersection(target) or " " in target:
            raise ValueError("the request path has a character HTTP/1.1 does not allow")
        fixed = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
        auth_names = {k.lower() for k, _ in self._auth}
        lines = [f"POST {target} HTTP/1.1", f"host: {self._authority}", "accept-encoding: identity"]
        sent: dict[str, str] = {}
        for name, value in headers.items():
            lower = name.lower()
            if lower in fixed or lower in auth_names:
                continue  # the transport's own, or the credential: a request cannot set them
            checked, text = _check_header(name, value)
            lines.append(f"{checked}: {text}")
            sent[checked] = text
        lines += [f"{name}: {value}" for name, value in self._auth]
        sent.update(self._auth)
        lines.append("content-length: ")
        return _Head(headers, path, "\r\n".join(lines).encode("latin-1"), self._origin + target, sent)

    # the pool
    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # First use, or a new event loop (connections and futures belong to the old one).
            for conn in self._idle:
                with contextlib.suppress(RuntimeError):  # its loop may be closed already
                    conn.abort()
            self._idle.clear()
            self._open = 0
            self._slot_waiters.clear()
            self._loop = loop
        return loop

    async def _acquire(self, timing: ConnectTiming | None) -> _Connection:
        loop = self._bind()
        self._closed = False  # used again after aclose (as aiohttp reopens its session)
        now = loop.time()
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                if timing is not None:
                    timing.connect_s = 0.0
                return conn
            conn.abort()
            self._open -= 1
        started = now
        if self._open >= self.settings.max_connections:
            await self._wait_for_slot(loop)
            if idle:  # released while we waited
                return await self._acquire(timing)
            started = loop.time()
        deadline = started + self.settings.connect_timeout_s
        self._open += 1
        try:
            conn = await self._connect(loop, deadline)
        except BaseException:
            self._open -= 1
            self._wake_slot()
            raise
        if timing is not None:
            timing.connect_s = loop.time() - started
        return conn

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a connection to be released or closed; the caller's deadline bounds the wait."""
        while self._open >= self.settings.max_connections and not self._idle:
            waiter: asyncio.Future[None] = loop.create_future()
            self._slot_waiters.append(waiter)
            woken = False
            try:
                await waiter
                woken = True
            finally:
                if not woken:
                    if waiter in self._slot_waiters:
                        self._slot_waiters.remove(waiter)
                    elif waiter.done() and not waiter.cancelled():
                        self._wake_slot()  # woken, then cancelled before it ran: pass the slot on

    def _wake_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _context(self) -> ssl.SSLContext:
        """The verifying context: the deployment's CA bundle, else the system's trust store."""
        tls = self._ssl
        if tls is None:
            tls = self._ssl = ssl.create_default_context()
            tls.set_alpn_protocols(["http/1.1"])
        return tls

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        tls = self._context() if self._tls else None
        try:
            async with asyncio.timeout_at(deadline):
                if self._proxy is not None:
                    return await self._tunnel(loop, self._proxy, tls)
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    self._host,
                    self._port,
                    ssl=tls,
                    server_hostname=self._host if tls is not None else None,
                )
        except TimeoutError:
            raise _Failure(UpstreamCategory.CONNECT, "connect timeout") from None
        except ssl.SSLError:
            raise _Failure(UpstreamCategory.CONNECT, "TLS handshake failed") from None
        except OSError:
            raise _Failure(UpstreamCategory.CONNECT, "connect failed") from None
        return conn

    async def _tunnel(
        self, loop: asyncio.AbstractEventLoop, proxy: tuple[str, int, bool], tls: ssl.SSLContext | None
    ) -> _Connection:
        """A connection to the provider through the proxy: ``CONNECT``, then TLS over the tunnel."""
        host, port, proxy_tls = proxy
        transport, answer = await loop.create_connection(
            lambda: _ProxyAnswer(loop),
            host,
            port,
            ssl=self._context() if proxy_tls else None,
            server_hostname=host if proxy_tls else None,
        )
        try:
            transport.write(self._connect_head)
            head = await answer.head
            refusal = _proxy_refusal(head, len(answer.buffer))
            if refusal is not None:
                raise refusal
            conn = _Connection(loop)
            if tls is None:
                transport.set_protocol(conn)
                conn.connection_made(transport)
                transport.resume_reading()
            else:
                # start_tls does not call connection_made on the protocol it is given
                tunnelled = await loop.start_tls(transport, conn, tls, server_hostname=self._host)
                if tunnelled is None:
                    raise _Failure(UpstreamCategory.CONNECT, "TLS handshake failed")
                conn.connection_made(tunnelled)
        except BaseException:
            transport.abort()
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        """Back to the pool if its response was read whole and it stays open; else closed."""
        if conn.reusable() and self._loop is conn.loop and not self._closed:
            conn._reset()
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)
        else:
            conn.abort()
            if self._loop is conn.loop:
                self._open -= 1
        self._wake_slot()

    def _write(self, conn: _Connection, req: UpstreamRequest, limit: int | None) -> None:
        head = self._head(req)
        conn.limit = limit
        conn.last_data = conn.loop.time()
        conn.head_waiter = conn.loop.create_future()
        transport = conn.transport
        assert transport is not None
        body = req.body
        if len(body) < 65536:
            transport.write(head + body)
        else:
            transport.writelines((head, body))

    # the interface
    async def send(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        timing = timing if self.settings.trace_connect else None
        if self._ready is not None:
            await self._ready()
        try:
            conn = await self._acquire(timing)
        except _Failure as exc:
            raise _error(exc) from None
        try:
            self._write(conn, req, self.settings.max_response_bytes)
            waiter = conn.head_waiter
            assert waiter is not None
            timer = conn.loop.call_later(self._buffered_s, conn._fail, TimeoutError())
            try:
                while not conn.complete and conn.error is None:
                    await waiter
                    if not conn.complete and conn.error is None:
                        waiter = conn.body_waiter = conn.loop.create_future()
            finally:
                timer.cancel()
            if conn.error is not None:
                raise _error(conn.error, conn.status or None)
            status, headers, body = conn.status, conn.headers, conn.take()
        except BaseException:
            conn.abort()  # a failure, a timeout or a cancellation: the connection is not reused
            self._release(conn)
            raise
        self._release(conn)
        return status, headers, body

    @asynccontextmanager
    async def stream(self, req: UpstreamRequest, timing: ConnectTiming | None = None) -> AsyncIterator[H1Stream]:
        timing = timing if self.settings.trace_connect else None
        if self._ready is not None:
            await self._ready()
        try:
            conn = await self._acquire(timing)
        except _Failure as exc:
            raise _error(exc) from None
        finished = False
        watchdog = _Watchdog(conn, self._stream_idle_s)
        try:
            self._write(conn, req, None)
            waiter = conn.head_waiter
            assert waiter is not None
            await waiter
            if conn.error is not None:
                raise _error(conn.error, conn.status or None)
            yield H1Stream(conn)
            finished = True
        finally:
            watchdog.cancel()
            try:
                if finished and not conn.complete:
                    await _drain(conn)  # may be cancelled (the caller's deadline): the rest runs anyway
            finally:
                if not (finished and conn.complete):
                    conn.abort()  # left before its end: closing the connection cancels the upstream call
                self._release(conn)

    async def aclose(self) -> None:
        """Close the idle connections; one still in use is closed when its call ends."""
        self._closed = True
        for conn in self._idle:
            with contextlib.suppress(RuntimeError):  # its loop may be closed already
                conn.abort()
        self._open -= len(self._idle)
        self._idle.clear()
        await asyncio.sleep(0)


async def _drain(conn: _Connection) -> None:
    """Let a stream left after its last event deliver its end (the chunked trailer), briefly and
    bounded in bytes, so its connection can be reused; a provider that keeps sending is cut off."""
    started = conn.received
    try:
        async with asyncio.timeout(_DRAIN_S):
            while not conn.complete and conn.error is None and not conn.closed:
                conn.take()
                if conn.received - started > 65536:
                    return
                waiter = conn.body_waiter = conn.loop.create_future()
                await waiter
    except TimeoutError:
        return


class _Watchdog:
    """A stream's idle timeout: one timer per period, re-armed from the last data, not per chunk.

    Time the socket spends paused (the consumer is behind) does not count: resuming resets the
    clock.
    """

    __slots__ = ("_conn", "_handle", "_idle_s")

    def __init__(self, conn: _Connection, idle_s: float) -> None:
        self._conn = conn
        self._idle_s = idle_s
        self._handle = conn.loop.call_later(idle_s, self._check)

    def _check(self) -> None:
        conn = self._conn
        if conn.complete or conn.error is not None or conn.closed:
            return
        now = conn.loop.time()
        if conn.paused:
            self._handle = conn.loop.call_later(self._idle_s, self._check)
            return
        left = conn.last_data + self._idle_s - now
        if left <= 0:
            conn._fail(TimeoutError())
            return
        self._handle = conn.loop.call_later(left, self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class H1Stream:
    """An open streamed response on one connection."""

    __slots__ = ("_conn",)

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    @property
    def status(self) -> int:
        return self._conn.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._conn.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.error is not None:
                raise _error(conn.error, conn.status or None)
            if conn.complete:
                return
            waiter = conn.body_waiter = conn.loop.create_future()
            await waiter

    async def read_bounded(self, limit: int = MAX_ERROR_BODY) -> bytes:
        return await read_prefix(self.aiter_bytes(), limit)
