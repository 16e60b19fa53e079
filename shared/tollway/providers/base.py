"""The codec interface every provider format implements: pure, no I/O, no logging, no clock.

The values a codec exchanges with transports and SSE framing, ``UpstreamRequest`` and ``SseEvent``,
live in ``tollway.wire`` so that ``tollway.transport`` need not import this package.

A codec's ``framing`` says how its streamed responses are framed, and so which events its
``decode_stream`` takes: Server-Sent Events (``tollway.sse``) for most formats, the AWS event stream
(``tollway.eventstream``) for Bedrock. The gateway frames the bytes by it; ``AnyCodec`` is either.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, TypeAlias

from tollway.canonical import CanonicalRequest, CanonicalResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent
from tollway.eventstream import EventStreamMessage
from tollway.exceptions import UpstreamError
from tollway.wire import SseEvent, UpstreamRequest

__all__ = ["AnyCodec", "EmbeddingsCodec", "EventStreamCodec", "ProviderCodec", "ProviderFormat", "Target"]


class ProviderFormat(enum.Enum):
    OPENAI_CHAT = "openai-chat-completions"
    ANTHROPIC_MESSAGES = "anthropic-messages"
    BEDROCK_CONVERSE = "bedrock-converse"
    GEMINI = "gemini"


@dataclass(slots=True, frozen=True)
class Target:
    """What a codec needs to know about the chosen deployment: never credentials or URLs."""

    model: str
    """The physical model id sent upstream."""
    default_max_output_tokens: int = 4096
    """Used when the format requires an output bound and the client gave none."""


class ProviderCodec(Protocol):
    """A format whose streams are Server-Sent Events."""

    format: ClassVar[ProviderFormat]
    framing: ClassVar[Literal["sse"]]

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest: ...

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse: ...

    def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]: ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...


class EventStreamCodec(Protocol):
    """A format whose streams are AWS event streams (Bedrock): the same four verbs, but
    ``decode_stream`` takes event stream messages rather than SSE events."""

    format: ClassVar[ProviderFormat]
    framing: ClassVar[Literal["eventstream"]]

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest: ...

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse: ...

    def decode_stream(self, events: AsyncIterator[EventStreamMessage]) -> AsyncIterator[StreamEvent]: ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...


AnyCodec: TypeAlias = ProviderCodec | EventStreamCodec
"""A chat codec of either framing; ``codec.framing`` tells them apart."""


class EmbeddingsCodec(Protocol):
    """The optional embeddings capability of a provider format: only a format whose providers
    embed has one (``tollway.providers.embeddings_codec_for``), so a chat-only codec stubs nothing."""

    def encode_embeddings(self, req: EmbeddingRequest, target: Target) -> UpstreamRequest: ...

    def decode_embeddings(self, status: int, body: bytes, count: int) -> EmbeddingResponse:
        """The vectors of ``count`` inputs, in input order; raises ``UpstreamError`` when malformed."""
        ...

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError: ...
