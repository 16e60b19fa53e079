"""Serving the mock with uvicorn: in the current event loop, in a thread, or as a process.

The mock has no authentication of its own, so every way of serving it binds a loopback
address only. Embedded servers leave the host's logging configuration and signal handlers
alone; the process entry point (``python -m tollway.mock``) configures both as uvicorn does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Generator
from types import TracebackType
from typing import Any, Self

import uvicorn
from uvicorn.supervisors import Multiprocess

from tollway.mock.app import MockApp, create_app

__all__ = ["MockServer", "MockServerThread", "loopback_socket", "serve", "socket_url"]

APP_FACTORY = "tollway.mock.app:create_app"
_STARTUP_TIMEOUT_S = 10.0
_GRACEFUL_SHUTDOWN_S = 2


def loopback_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on a loopback address; ``port=0`` picks a free port.

    Raises ``ValueError`` for an address that is not loopback.
    """
    address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    if not address.is_loopback:
        raise ValueError(f"the mock binds loopback addresses only, not {host}")
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    # proto=IPPROTO_TCP lets asyncio set TCP_NODELAY on accepted sockets; without it, Nagle
    # holds the response body behind the header segment until a delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((str(address), port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def _config(app: MockApp | str, *, embedded: bool, workers: int = 1) -> uvicorn.Config:
    options: dict[str, Any] = {"log_config": None} if embedded else {"log_level": "warning"}
    return uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        factory=isinstance(app, str),
        workers=workers,
        **options,
    )


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the host process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def serve(host: str = "127.0.0.1", port: int = 0, workers: int = 1, *, announce: bool = True) -> None:
    """Serve the mock until interrupted, printing ``mock listening on <url>`` once bound.

    With ``workers > 1`` each worker process has its own request log and fault state.
    """
    sock = loopback_socket(host, port)
    if announce:
        print(f"mock listening on {socket_url(sock)}", flush=True)
    if workers > 1:
        Multiprocess(_config(APP_FACTORY, embedded=False, workers=workers), sockets=[sock]).run()
    else:
        uvicorn.Server(_config(create_app(), embedded=False)).run(sockets=[sock])


class MockServer:
    """The mock on an ephemeral loopback port, served by a task in the running event loop.

    ::

        async with MockServer() as mock:
            client = openai.AsyncOpenAI(base_url=mock.base_url + "/v1", api_key="x")
    """

    def __init__(self, app: MockApp | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app if app is not None else create_app()
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._url: str | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, without a trailing slash."""
        if self._url is None:
            raise RuntimeError("the mock server is not running")
        return self._url

    async def start(self) -> None:
        sock = loopback_socket(self._host, self._port)
        server = _EmbeddedServer(_config(self.app, embedded=True))
        task = asyncio.create_task(server.serve(sockets=[sock]), name="tollway-mock")
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not server.started:
            if task.done() or time.monotonic() > deadline:
                server.should_exit = True
                await task
                sock.close()
                raise RuntimeError("the mock server did not start")
            await asyncio.sleep(0.001)
        self._server, self._task, self._url = server, task, socket_url(sock)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._server = self._task = self._url = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class MockServerThread:
    """The mock on an ephemeral loopback port, served by its own event loop in a daemon thread.

    For synchronous fixtures::

        with MockServerThread() as mock:
            httpx.get(mock.base_url + "/_mock/health")
    """

    def __init__(self, app: MockApp | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app if app is not None else create_app()
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None

    @property
    def base_url(self) -> str:
        if self._url is None:
            raise RuntimeError("the mock server is not running")
        return self._url

    def start(self) -> None:
        sock = loopback_socket(self._host, self._port)
        server = _EmbeddedServer(_config(self.app, embedded=True))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tollway-mock", daemon=True)
        thread.start()
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                thread.join(_STARTUP_TIMEOUT_S)
                sock.close()
                raise RuntimeError("the mock server did not start")
            time.sleep(0.001)
        self._server, self._thread, self._url = server, thread, socket_url(sock)

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(_STARTUP_TIMEOUT_S + _GRACEFUL_SHUTDOWN_S)
        self._server = self._thread = self._url = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
