"""An HTTP ``CONNECT`` proxy on 127.0.0.1 for tests, and the byte relay it tunnels with.

It records each ``CONNECT``'s target and ``Proxy-Authorization``, can demand credentials (a 407
without them, or with others), and tunnels only to loopback targets. With a server
``SSLContext`` it is an ``https`` proxy (TLS to the proxy itself)::

    async with ConnectProxy(require="Basic dTpw") as proxy:
        ...  # proxy.url, then proxy.targets == ["127.0.0.1:8443"]
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from types import TracebackType
from typing import Self

__all__ = ["ConnectProxy", "relay"]

_CLOSE_S = 5.0
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until its end, then close ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def pipe(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Relay both ways between two connections until either side ends, then close both."""
    await asyncio.gather(relay(a[0], b[1]), relay(b[0], a[1]))


class ConnectProxy:
    def __init__(self, *, require: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.require = require
        """The ``Proxy-Authorization`` value a ``CONNECT`` must carry; ``None``: any or none."""
        self.tls = tls
        self.targets: list[str] = []
        """Each ``CONNECT``'s target, in order (refused ones included)."""
        self.authorizations: list[str | None] = []
        """Each ``CONNECT``'s ``Proxy-Authorization``, or ``None`` when it had none."""
        self.requests: list[bytes] = []
        """Each request head the proxy read, as sent."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the proxy is not running")
        return self._url

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._tunnel(reader, writer)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
        except asyncio.CancelledError:
            # Returned from, not raised: asyncio 3.11 logs a stream handler task that ends cancelled.
            writer.close()
        finally:
            self._tasks.discard(task)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            writer.close()
            return
        self.targets.append(target)
        self.authorizations.append(headers.get("proxy-authorization"))
        if self.require is not None and headers.get("proxy-authorization") != self.require:
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'proxy-authenticate: Basic realm="tests"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n'
            )
            await writer.drain()
            writer.close()
            return
        host, _, port = target.rpartition(":")
        if host not in _LOOPBACK:
            writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            writer.close()
            return
        try:
            upstream = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await pipe((reader, writer), upstream)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self._url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()  # the handler ends its tunnel and returns (see ``_serve``)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=_CLOSE_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_S):
                await self._server.wait_closed()
        self._url = None
