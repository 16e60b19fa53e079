"""uvicorn's httptools protocol with a request-header read deadline (slowloris on headers).

uvicorn calls the ASGI app only once a request's headers are complete, and until then it has no
timer: a connection that sends half a request line, or a header a byte every few seconds, holds a
socket and a parser forever (its keep-alive timer is disarmed by every byte received). Here every
request, the first on a connection and each next one on a kept-alive connection, must complete
its headers within the deadline from its first byte, or from the connection's start; otherwise the
connection gets ``408`` and is closed. The body has its own deadline in the app
(``admission.bodyReadTimeoutMs``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["header_deadline_protocol"]

_BODY = (
    b'{"error":{"message":"The request headers were not received in time.",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


def header_deadline_protocol(timeout_s: float) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with a ``timeout_s`` header deadline."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # uvicorn's transport type
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # the next request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.write(_TIMEOUT_RESPONSE)
                self.transport.close()

    return HeaderDeadlineProtocol
