"""A tiny scripted HTTP/1.1 server on 127.0.0.1 for testing the load generator's accounting.

``behave(seq)`` picks the answer to the ``seq``-th request (0-based, in arrival order), so a
test knows exactly how many requests got each answer and can hold the generator's counts to
the server's own tally.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b'{"ok":true}'
    delay_s: float = 0.0
    serial: bool = False
    """Hold a server-wide lock for the delay: the server works on one request at a time."""


@dataclass(frozen=True)
class Sse:
    frames: tuple[tuple[float, bytes], ...]
    """(delay before the frame, frame bytes)."""


@dataclass(frozen=True)
class Drop:
    """Close the connection without answering."""


@dataclass(frozen=True)
class Hang:
    seconds: float = 1.0


Action = Reply | Sse | Drop | Hang


@dataclass
class TinyServer:
    behave: Callable[[int], Action]
    tally: Counter[str] = field(default_factory=Counter)
    arrivals: list[float] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._seq = itertools.count()
        self._lock = asyncio.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        await asyncio.sleep(0.05)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.arrivals.append(time.monotonic())
                if not await self._answer(self.behave(next(self._seq)), writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _answer(self, action: Action, writer: asyncio.StreamWriter) -> bool:
        """Send one answer; False when the connection must close."""
        if isinstance(action, Drop):
            self.tally["drop"] += 1
            return False
        if isinstance(action, Hang):
            self.tally["hang"] += 1
            await asyncio.sleep(action.seconds)
            return False
        if isinstance(action, Sse):
            self.tally["sse"] += 1
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for delay, frame in action.frames:
                if delay:
                    await asyncio.sleep(delay)
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        self.tally[str(action.status)] += 1
        if action.serial:
            async with self._lock:
                await asyncio.sleep(action.delay_s)
        elif action.delay_s:
            await asyncio.sleep(action.delay_s)
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (action.status, len(action.body), action.body)
        )
        await writer.drain()
        return True


@contextlib.asynccontextmanager
async def serving(behave: Callable[[int], Action]) -> AsyncIterator[TinyServer]:
    """A listening :class:`TinyServer`, stopped on exit."""
    server = TinyServer(behave)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
