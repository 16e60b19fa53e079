"""The load generator's HTTP clients: a lean HTTP/1.1 client on httptools, and aiohttp to cross-check it.

On a 2-core machine the load generator competes with the gateway for CPU, so every
microsecond it spends per request is taken from the system under test. aiohttp costs about
0.5 ms of CPU per request here (more for SSE); :class:`Http1Client` costs a fraction of that
because a benchmark sends the *same* request over and over:

- the whole request (request line, headers, body) is rendered to bytes once;
- each keep-alive connection is an ``asyncio.Protocol`` whose response is parsed by
  httptools (llhttp, the parser uvicorn uses, already a gateway dependency); the body is
  never buffered, only scanned when the response is SSE;
- idle connections are reused last-in first-out; a connection that timed out, errored, or
  was not keep-alive is closed, never reused.

Both clients answer one question per request: ``(status, ttft_seconds_or_None, complete, code)``,
where ``complete`` means the body was read to its end and, for SSE, the endpoint kind's terminal
frame was seen. TTFT is the time from the intended send to the first chunk that holds the kind's
first-token frame (:mod:`bench.endpoints`). ``code`` is ``None`` for a 2xx; otherwise the error
envelope's ``error.code`` (or ``error.type``: OpenAI's and Anthropic's envelopes both nest it under
``error``), so a report can tell a load shed (``overloaded``) from an audit WAL refusal
(``audit_unavailable``); ``-`` when the body has no such envelope.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Protocol

from bench.endpoints import ENDPOINTS, Endpoint

__all__ = ["CLIENTS", "AiohttpClient", "Client", "Http1Client", "error_code", "make_client"]

ClientName = Literal["http1", "aiohttp"]
CLIENTS: Final[tuple[str, ...]] = ("http1", "aiohttp")

_TAIL: Final = 64
"""Bytes of the previous chunk scanned again with the next: longer than any marker."""
_ERROR_BODY_MAX: Final = 8192
"""Bytes of a non-2xx body kept for :func:`error_code` (an error envelope is far smaller)."""


def error_code(body: bytes) -> str:
    """The ``error.code`` (else ``error.type``) of an OpenAI error envelope; ``-`` without one."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "-"
    if not isinstance(error, dict):
        return "-"
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and value:
            return value
    return "-"


Reply = tuple[int, float | None, bool, str | None]
"""``(status, ttft, complete, code)``: see the module's docstring."""


class Client(Protocol):
    async def send(self, intended: float) -> Reply: ...

    async def aclose(self) -> None: ...


class _StreamWatch:
    """Scans SSE body chunks for the endpoint's first-token frame and its terminal frame."""

    __slots__ = ("done", "first_token", "intended", "marker", "tail", "ttft")

    def __init__(self, intended: float, first_token: Callable[[bytes], bool], marker: bytes) -> None:
        self.intended = intended
        self.first_token = first_token
        self.marker = marker
        self.ttft: float | None = None
        self.done = False
        self.tail = b""

    def feed(self, chunk: bytes) -> None:
        data = self.tail + chunk if self.tail else chunk
        if self.ttft is None and self.first_token(data):
            self.ttft = time.monotonic() - self.intended
        if not self.done and self.marker in data:
            self.done = True
        self.tail = data[-_TAIL:]


def _stream_parts(kind: Endpoint, stream: bool) -> tuple[Callable[[bytes], bool], bytes] | None:
    """The first-token test and terminal marker of ``kind`` when streaming; ``None`` when buffered."""
    if not stream:
        return None
    if kind.terminal is None or kind.first_token is None:
        raise ValueError(f"the {kind.name} endpoint does not stream")
    return kind.first_token, kind.terminal


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bool]] | None = None
        self.watch: _StreamWatch | None = None
        self.status = 0
        self.error_body: bytearray | None = None
        """A non-2xx answer's body (its first ``_ERROR_BODY_MAX`` bytes); ``None`` for a 2xx."""
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError and friends: a malformed response
            self._fail(exc)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = status = self.parser.get_status_code()
        self.error_body = None if 200 <= status < 300 else bytearray()

    def on_body(self, body: bytes) -> None:
        if self.error_body is not None:
            if len(self.error_body) < _ERROR_BODY_MAX:
                self.error_body += body[: _ERROR_BODY_MAX - len(self.error_body)]
        elif self.watch is not None:
            self.watch.feed(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.status, self.parser.should_keep_alive()))

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Http1Client:
    """Sends one pre-rendered POST per call over pooled keep-alive HTTP/1.1 connections."""

    def __init__(
        self, url: str, body: bytes, headers: Mapping[str, str], stream: bool, kind: Endpoint = ENDPOINTS["chat"]
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the http1 client speaks plain http only, not {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", "content-type: application/json"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "content-type"]
        lines.append(f"content-length: {len(body)}")
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        self.stream = _stream_parts(kind, stream)
        self.idle: list[_Connection] = []
        self.all: set[_Connection] = set()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        self.all.add(conn)
        return conn

    async def send(self, intended: float) -> Reply:
        idle = self.idle
        conn = None
        while idle:
            candidate = idle.pop()
            if not candidate.closed:
                conn = candidate
                break
            self.all.discard(candidate)
        if conn is None:
            conn = await self._connect()
        waiter: asyncio.Future[tuple[int, bool]] = asyncio.get_running_loop().create_future()
        conn.waiter = waiter
        stream = self.stream
        watch = conn.watch = _StreamWatch(intended, *stream) if stream is not None else None
        assert conn.transport is not None
        conn.transport.write(self.request)
        try:
            status, keep_alive = await waiter
        except BaseException:
            conn.abort()
            self.all.discard(conn)
            raise
        conn.watch = None
        error_body, conn.error_body = conn.error_body, None
        if keep_alive and not conn.closed:
            idle.append(conn)
        else:
            conn.abort()
            self.all.discard(conn)
        if error_body is not None:
            return status, None, True, error_code(bytes(error_body))
        if watch is None:
            return status, None, True, None
        return status, watch.ttft, watch.done, None

    async def aclose(self) -> None:
        for conn in list(self.all):
            conn.abort()
        self.all.clear()
        self.idle.clear()
        await asyncio.sleep(0)


class AiohttpClient:
    """The same contract on aiohttp (pinned 3.14.5 when used): an independent implementation to cross-check."""

    def __init__(
        self, url: str, body: bytes, headers: Mapping[str, str], stream: bool, kind: Endpoint, limit: int
    ) -> None:
        import aiohttp

        self.url = url
        self.body = body
        self.stream = _stream_parts(kind, stream)
        connector = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=None, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector,
            headers={"content-type": "application/json", **headers},
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def send(self, intended: float) -> Reply:
        async with self.session.post(self.url, data=self.body) as resp:
            status: int = resp.status
            if not 200 <= status < 300:
                return status, None, True, error_code((await resp.read())[:_ERROR_BODY_MAX])
            if self.stream is None:
                await resp.read()
                return status, None, True, None
            watch = _StreamWatch(intended, *self.stream)
            async for chunk in resp.content.iter_any():
                watch.feed(chunk)
            return status, watch.ttft, watch.done, None

    async def aclose(self) -> None:
        await self.session.close()


def make_client(
    name: str, url: str, body: bytes, headers: Mapping[str, str], stream: bool, kind: Endpoint, limit: int
) -> Any:
    if name == "http1":
        return Http1Client(url, body, headers, stream, kind)
    if name == "aiohttp":
        return AiohttpClient(url, body, headers, stream, kind, limit)
    raise ValueError(f"unknown client {name!r}; choose one of {', '.join(CLIENTS)}")
