"""An SSE response that notices a client disconnect at once and bounds every write.

Starlette's ``StreamingResponse`` only notices a disconnect on its next write under ASGI 2.4,
which can be a whole upstream stall away. Here one listener task per stream (never one per
chunk) watches ``receive`` and cancels the stream, so the upstream call is cancelled promptly.

The frames are written by the request's own task, so the first one leaves in the same loop
iteration that produced it instead of waiting a turn for a writer task to be scheduled (that
hop cost time to first token under load: docs/benchmarks.md).

Each ``send`` is bounded by the write-progress deadline: uvicorn's ``send`` waits while the
socket is paused, so a slow reader pauses the upstream read, then is cut off. One watchdog timer
per stream checks the send in progress, rather than an ``asyncio.timeout`` (a timer armed and
cancelled) around every frame. A reader that keeps up only barely is judged by its drain rate:
the bytes sent over the time the gateway spent waiting for it to take them; once that waiting
passes the grace period, a rate below the minimum cuts the stream off too. The whole stream is
bounded by an absolute lifetime that nothing extends (heartbeats and trickle reads included).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Literal

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

__all__ = ["SseResponse"]

_Cut = Literal["disconnect", "stalled", "slow", "lifetime"]
_BLOCKED_S = 0.001
"""A send that took longer than this waited for the client (uvicorn's send returns at once otherwise)."""


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        on_close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str],
        on_cut: Callable[[str], None] | None = None,
        write_timeout_s: float,
        lifetime_s: float,
        lifetime_frame: bytes,
        min_drain_bytes_per_s: float = 0.0,
        drain_grace_s: float = 10.0,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]
        self._frames = frames
        self._on_close = on_close
        self._on_cut = on_cut
        self._write_timeout_s = write_timeout_s
        self._lifetime_s = lifetime_s
        self._lifetime_frame = lifetime_frame
        self._min_drain = min_drain_bytes_per_s
        self._drain_grace_s = drain_grace_s
        self._sent = 0
        self._waited = 0.0
        self._sending_since = -1.0
        """Loop time at which the send in progress began; negative while no send is waiting."""
        self._cut: _Cut | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    async def _write(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async with asyncio.timeout(self._lifetime_s):
                async for frame in self._frames:
                    since = self._sending_since = loop.time()
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                    self._sending_since = -1.0
                    self._sent += len(frame)
                    if self._min_drain and self._too_slow(loop.time() - since):
                        self._cut = "slow"
                        return  # no final frame: the client is not keeping up, close
        except TimeoutError:
            self._cut = "lifetime"
            await self._frames.aclose()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._write_timeout_s):
                    await send({"type": "http.response.body", "body": self._lifetime_frame, "more_body": True})
        async with asyncio.timeout(self._write_timeout_s):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _too_slow(self, waited: float) -> bool:
        if waited < _BLOCKED_S:
            return False
        self._waited += waited
        return self._waited > self._drain_grace_s and self._sent < self._min_drain * self._waited

    def _watch_progress(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
        """Cut the stream off once one send has waited for the write-progress deadline."""
        since = self._sending_since
        now = loop.time()
        if since >= 0 and now - since >= self._write_timeout_s:
            if self._cut is None:
                self._cut = "stalled"
                task.cancel()
            return
        due = (since if since >= 0 else now) + self._write_timeout_s
        self._watchdog = loop.call_at(due, self._watch_progress, loop, task)

    async def _until_disconnect(self, receive: Receive, task: asyncio.Task[None]) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                if self._cut is None:
                    self._cut = "disconnect"
                    task.cancel()
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        task: asyncio.Task[None] | None = asyncio.current_task()
        assert task is not None
        listener = loop.create_task(self._until_disconnect(receive, task))
        self._watchdog = loop.call_at(loop.time() + self._write_timeout_s, self._watch_progress, loop, task)
        try:
            await self._write(send, loop)
        except asyncio.CancelledError:
            # Our own cut (the client left, or stopped reading): close quietly. Any other
            # cancellation (server shutdown) propagates.
            if self._cut is None or task.uncancel() > 0:
                raise
        except (OSError, TimeoutError):
            pass  # the final empty frame could not be written: the client is gone or stalled
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
            listener.cancel()
            if self._cut is not None and self._cut != "disconnect" and self._on_cut is not None:
                self._on_cut(self._cut)
            try:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
            finally:
                try:
                    await self._frames.aclose()
                finally:
                    await self._on_close()
