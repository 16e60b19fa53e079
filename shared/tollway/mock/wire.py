"""The interface each mock wire format implements, and the shapes it hands the app.

A format parses a request body into a neutral :class:`~tollway.mock.content.MockRequest`
and renders replies, errors and SSE frames as bytes. It does no I/O: pacing, faults and
sending belong to :mod:`tollway.mock.app`, which is therefore format-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tollway.mock.content import MockRequest, TextReply, ToolReply

__all__ = ["Reply", "RequestError", "StreamPlan", "WireFormat"]

Reply = TextReply | ToolReply


class RequestError(Exception):
    """The request body is not a valid request for the format (rendered as a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(slots=True)
class StreamPlan:
    """An SSE response split where faults may strike: between content deltas."""

    preamble: bytes
    """Frames before the first content delta (role chunk, ``message_start``…)."""
    deltas: list[bytes]
    """One frame per content delta (text or tool-argument fragment)."""
    tail: bytes
    """Terminal frames (finish, usage, ``[DONE]`` / ``message_stop``)."""


class WireFormat(Protocol):
    name: str
    """``"openai"`` or ``"anthropic"``, as recorded in the request log."""
    request_id_header: bytes
    malformed_frame: bytes
    terminal_frame: bytes
    """The frame that ends a complete stream (``[DONE]``, ``message_stop``); ``no_done`` leaves it out."""

    def parse(self, body: dict[str, Any]) -> MockRequest: ...

    def authorized(self, bearer: bool, api_key: bool) -> bool: ...

    def error(self, status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes: ...

    def midstream_error(self, error_type: str | None) -> bytes: ...

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes: ...

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan: ...
