"""Server-Sent Events framing: bytes to events and events to bytes, with no meaning attached.

Parsing follows the WHATWG *event stream interpretation*: lines end in CRLF, LF or CR, a
blank line dispatches the event, ``data`` lines join with ``"\\n"``, and comments are
dropped. ``id`` and ``retry`` are dropped too: the gateway never reconnects an upstream
stream, so it has no use for them. Bytes are buffered until a line is complete and only
then decoded, so a UTF-8 character split across network chunks arrives intact.

The codecs in ``tollway.providers`` give the events their meaning.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator

from tollway.exceptions import TollwayError
from tollway.wire import SseEvent

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DONE", "SseFrameTooLarge", "SseParser", "aiter_sse", "encode_data"]

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
DONE = b"data: [DONE]\n\n"

_EOL = re.compile(rb"\r\n?|\n")
_BOM = b"\xef\xbb\xbf"


class SseFrameTooLarge(TollwayError, ValueError):
    """An event grew past ``max_event_bytes`` before a blank line ended it.

    A ``TollwayError`` like every error of the package; still a ``ValueError``, as it was before the
    tree existed, so callers that catch that keep working. The gateway maps it to a malformed stream.
    """


class SseParser:
    """Incremental parser: ``feed`` it chunks as they arrive, get back the events they complete.

    An event still being received (its lines plus the current unterminated line) may hold at
    most ``max_event_bytes``; past that ``feed`` raises ``SseFrameTooLarge`` and the parser
    must be discarded. An event left unterminated when the input ends is dropped, as the
    specification says: a truncated stream must not yield a truncated event.
    """

    __slots__ = ("_buf", "_data", "_event", "_event_bytes", "_first_line", "_max", "_scan_from", "_skip_lf")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes <= 0:
            raise ValueError("max_event_bytes must be positive")
        self._max = max_event_bytes
        self._buf = bytearray()
        self._scan_from = 0
        """Bytes at the front of ``_buf`` already known to hold no line end."""
        self._skip_lf = False
        """The last chunk ended in CR: an LF starting the next chunk belongs to that CRLF."""
        self._first_line = True
        self._event: str | None = None
        self._data: list[str] = []
        self._event_bytes = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        events: list[SseEvent] = []
        start = 0
        for match in _EOL.finditer(buf, self._scan_from):
            event = self._line(bytes(buf[start : match.start()]))
            if event is not None:
                events.append(event)
            start = match.end()
        if start:
            self._skip_lf = start == len(buf) and buf[start - 1] == 0x0D
            del buf[:start]
        self._scan_from = len(buf)
        if self._event_bytes + len(buf) > self._max:
            raise SseFrameTooLarge(f"SSE event exceeds {self._max} bytes")
        return events

    def _line(self, raw: bytes) -> SseEvent | None:
        if self._first_line:
            self._first_line = False
            if raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", "replace")
        name, colon, value = line.partition(":")
        if not name and colon:
            return None
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        else:
            return None
        self._event_bytes += len(raw)
        if self._event_bytes > self._max:
            raise SseFrameTooLarge(f"SSE event exceeds {self._max} bytes")
        return None

    def _dispatch(self) -> SseEvent | None:
        event = SseEvent(self._event, "\n".join(self._data)) if self._data else None
        self._event = None
        self._data = []
        self._event_bytes = 0
        return event


async def aiter_sse(
    byte_chunks: AsyncIterable[bytes], max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
) -> AsyncIterator[SseEvent]:
    """The events carried by a byte stream, as soon as each one is complete."""
    parser = SseParser(max_event_bytes)
    async for chunk in byte_chunks:
        for event in parser.feed(chunk):
            yield event


def encode_data(payload: bytes) -> bytes:
    """One ``data``-only event. A payload with line breaks becomes several ``data`` lines,
    which a client joins back with LF (serialized JSON never has any)."""
    if b"\n" not in payload and b"\r" not in payload:
        return b"data: " + payload + b"\n\n"
    return b"".join(b"data: " + line + b"\n" for line in _EOL.split(payload)) + b"\n"
