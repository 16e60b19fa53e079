"""The codec interface every provider format implements: pure, no I/O, no logging, no clock.

The values a codec exchanges with transports and SSE framing, ``UpstreamRequest`` and ``SseEvent``,
live in ``tollway.wire`` so that ``tollway.transport`` need not import this package.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from tollway.canonical import CanonicalRequest, CanonicalResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent
from tollway.exceptions import UpstreamError
from tollway.wire import SseEvent, UpstreamRequest

__all__ = ["EmbeddingsCodec", "ProviderCodec", "ProviderFormat", "Target"]


class ProviderFormat(enum.Enum):
    OPENAI_CHAT = "openai-chat-completions"
    ANTHROPIC_MESSAGES = "anthropic-messages"
    GEMINI = "gemini"


@dataclass(slots=True, frozen=True)
class Target:
    """What a codec needs to know about the chosen deployment: never credentials or URLs."""

    model: str
    """The physical model id sent upstream."""
    default_max_output_tokens: int = 4096
    """Used when the format requires an output bound and the client gave none."""


class ProviderCodec(Protocol):
    format: ClassVar[ProviderFormat]

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest: ...

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse: ...

    def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]: ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...


class EmbeddingsCodec(Protocol):
    """The optional embeddings capability of a provider format: only a format whose providers
    embed has one (``tollway.providers.embeddings_codec_for``), so a chat-only codec stubs nothing."""

    def encode_embeddings(self, req: EmbeddingRequest, target: Target) -> UpstreamRequest: ...

    def decode_embeddings(self, status: int, body: bytes, count: int) -> EmbeddingResponse:
        """The vectors of ``count`` inputs, in input order; raises ``UpstreamError`` when malformed."""
        ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...
