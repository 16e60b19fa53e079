"""An SSE response that notices a client disconnect at once and bounds every write.

Starlette's ``StreamingResponse`` only notices a disconnect on its next write under ASGI 2.4,
which can be a whole upstream stall away. Here one listener task per stream (never one per
chunk) watches ``receive`` and cancels the writer, so the upstream call is cancelled promptly.
Each ``send`` is bounded by the write-progress deadline (uvicorn's ``send`` waits for the
socket to drain, so a slow reader pauses the upstream read, then is cut off), and the whole
stream by an absolute lifetime that nothing extends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

__all__ = ["SseResponse"]


class _ReaderStalled(Exception):
    """The client made no write progress within the deadline."""


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        on_close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str],
        write_timeout_s: float,
        lifetime_s: float,
        lifetime_frame: bytes,
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
        self._write_timeout_s = write_timeout_s
        self._lifetime_s = lifetime_s
        self._lifetime_frame = lifetime_frame

    async def _send_bounded(self, send: Send, message: Message) -> None:
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await send(message)
        except TimeoutError:
            raise _ReaderStalled from None

    async def _write(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async with asyncio.timeout(self._lifetime_s):
                async for frame in self._frames:
                    await self._send_bounded(send, {"type": "http.response.body", "body": frame, "more_body": True})
        except _ReaderStalled:
            return  # the client is not reading: no frame would reach it, so just close
        except TimeoutError:
            await self._frames.aclose()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._write_timeout_s):
                    await send({"type": "http.response.body", "body": self._lifetime_frame, "more_body": True})
        async with asyncio.timeout(self._write_timeout_s):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _until_disconnect(receive: Receive) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._write(send))
        listener = asyncio.ensure_future(self._until_disconnect(receive))
        try:
            await asyncio.wait({writer, listener}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, listener):
                if not task.done():
                    task.cancel()
            try:
                for task in (writer, listener):
                    with contextlib.suppress(asyncio.CancelledError, OSError, TimeoutError, _ReaderStalled):
                        await task
            finally:
                try:
                    await self._frames.aclose()
                finally:
                    await self._on_close()
