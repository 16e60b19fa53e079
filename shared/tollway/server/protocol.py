"""uvicorn's httptools protocol with the limits a gateway's HTTP front door needs.

- **A header read deadline** (slowloris on headers). uvicorn calls the ASGI app only once a
  request's headers are complete, and until then it has no timer: a connection that sends half
  a request line, or a header a byte every few seconds, holds a socket and a parser forever (its
  keep-alive timer is disarmed by every byte received). Here every request, the first on a
  connection and each next one on a kept-alive connection, must complete its headers within the
  deadline from its first byte, or from the connection's start; otherwise the connection gets
  ``408`` and is closed. The body has its own deadline in the app (``admission.bodyReadTimeoutMs``).
- **A header size and count limit.** httptools buffers a header's value whole before handing it
  over, and uvicorn keeps every header, so without a limit a client could make a worker hold
  megabytes per connection (uvicorn's ``h11_max_incomplete_event_size`` applies to h11 only).
  The bytes received while a request's head is incomplete (request line and headers, as sent)
  are counted before they reach the parser, and so are the header lines; past either limit the
  connection gets ``431`` and is closed, and what was buffered is freed with the parser.
- **Errors in the OpenAI envelope.** A request the parser refuses (malformed, or a
  ``Content-Length`` together with ``Transfer-Encoding: chunked``) gets a JSON ``400`` in place of
  uvicorn's plain-text one. Each of these answers closes the connection: the parser's position
  in the byte stream is no longer trustworthy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GatewayProtocol", "gateway_protocol"]


def _response(status: bytes, code: str, message: str) -> bytes:
    body = b'{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":"%s"}}' % (
        message.encode(),
        code.encode(),
    )
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


_TIMEOUT_RESPONSE = _response(
    b"408 Request Timeout", "request_timeout", "The request headers were not received in time."
)
_TOO_LARGE_RESPONSE = _response(
    b"431 Request Header Fields Too Large",
    "request_headers_too_large",
    "The request headers are too large or too many.",
)
_INVALID_RESPONSE = _response(b"400 Bad Request", "invalid_request", "The HTTP request is malformed.")


_LINGER_S = 2.0


class _HeadersTooLarge(Exception):
    """Raised from a parser callback; httptools aborts the parse and reports a parser error."""


class GatewayProtocol(HttpToolsProtocol):
    """The protocol; :func:`gateway_protocol` makes a subclass carrying the configured limits."""

    timeout_s = 10.0
    max_header_bytes = 64 * 1024
    max_headers = 100

    _deadline: asyncio.TimerHandle | None = None
    _in_head = True
    """Between a request's first byte (or the connection's start) and its complete headers."""
    _head_bytes = 0
    """Bytes of reads that ended with the head still incomplete: bounds what the parser may buffer.
    A read in which a head completes is not counted: it may carry a body, and ``_parsed_bytes``
    has the exact size of that head."""
    _heads = 0
    """Requests begun on this connection, to tell a read that began another one."""
    _parsed_bytes = 0
    """The URL and header lines parsed so far: exact, and it also sees a head that arrived in
    the same read as the previous request's end, which ``_head_bytes`` does not count."""
    _header_count = 0
    _too_large = False
    _refused = False
    """An error answer was sent: what the client still sends is read and dropped until it
    closes or the linger ends, so its own unsent data cannot turn our close into a reset
    that destroys the answer before the client reads it."""

    def connection_made(self, transport: Any) -> None:  # uvicorn's transport type
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        was_in_head, heads = self._in_head, self._heads
        super().data_received(data)
        same_head = heads == self._heads or (heads == 0 and self._heads == 1)  # or the connection's first
        if was_in_head and self._in_head and same_head and not self._refused:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(_TOO_LARGE_RESPONSE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._heads += 1
        if not self._in_head:  # the next request on a kept-alive connection
            self._in_head = True
            self._head_bytes = 0
        self._header_count = 0
        self._parsed_bytes = 0
        if self._deadline is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # not a chunked body's trailers, which the body's own limit bounds
            self._header_count += 1
            self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._parsed_bytes += size
        if self._header_count > self.max_headers or self._parsed_bytes > self.max_header_bytes:
            self._too_large = True
            raise _HeadersTooLarge

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        self._refuse(_TOO_LARGE_RESPONSE if self._too_large else _INVALID_RESPONSE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.response_started:
            # A pipelined request's limit tripped while an earlier response is still being sent:
            # an answer now would land inside that response, so the connection just closes.
            self.transport.close()
            return
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        self._refuse(_TIMEOUT_RESPONSE)


def gateway_protocol(
    timeout_s: float, *, max_header_bytes: int = 64 * 1024, max_headers: int = 100
) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these limits."""
    limits = {"timeout_s": timeout_s, "max_header_bytes": max_header_bytes, "max_headers": max_headers}
    return type("GatewayProtocol", (GatewayProtocol,), limits)
