"""The codec interface every provider format implements: pure, no I/O, no logging, no clock."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from tollway.canonical import CanonicalRequest, CanonicalResponse, StreamEvent
from tollway.exceptions import UpstreamError

__all__ = ["ProviderCodec", "ProviderFormat", "SseEvent", "Target", "UpstreamRequest"]


class ProviderFormat(enum.Enum):
    OPENAI_CHAT = "openai-chat-completions"
    ANTHROPIC_MESSAGES = "anthropic-messages"


@dataclass(slots=True, frozen=True)
class Target:
    """What a codec needs to know about the chosen deployment: never credentials or URLs."""

    model: str
    """The physical model id sent upstream."""
    default_max_output_tokens: int = 4096
    """Used when the format requires an output bound and the client gave none."""


@dataclass(slots=True, frozen=True)
class UpstreamRequest:
    """A request body and the relative path to POST it to; the transport adds base URL and auth."""

    path: str
    body: bytes
    headers: Mapping[str, str]
    stream: bool


@dataclass(slots=True, frozen=True)
class SseEvent:
    """One Server-Sent Event after framing: ``event`` name (or None) and its joined ``data``."""

    event: str | None
    data: str


class ProviderCodec(Protocol):
    format: ClassVar[ProviderFormat]

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest: ...

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse: ...

    def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]: ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...
