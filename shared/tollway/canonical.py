"""Provider-neutral request, content, semantic stream events and usage.

The client format (OpenAI Chat Completions today) parses into a ``CanonicalRequest``; a
provider codec encodes it for its wire format and decodes the answer back into a
``CanonicalResponse`` or a stream of ``StreamEvent``. Nothing here knows about HTTP.

Objects are slotted dataclasses: they are built once per request on the hot path, so they
avoid pydantic's validation cost (the hot-path rule: one fast parse, no second validation
pass) while staying typed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import orjson

__all__ = [
    "SKIPPED",
    "CanonicalRequest",
    "CanonicalResponse",
    "ContentPart",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "FinishReason",
    "ImagePart",
    "Message",
    "ResponseFormat",
    "Role",
    "SkippedEvent",
    "StreamEvent",
    "StreamFinish",
    "StreamStart",
    "StreamUsage",
    "TextDelta",
    "TextPart",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolDefinition",
    "Usage",
    "UsageEvidence",
    "estimate_request_tokens",
    "estimate_tokens",
]

Role: TypeAlias = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "content_filter"]


@dataclass(slots=True, frozen=True)
class TextPart:
    text: str


@dataclass(slots=True, frozen=True)
class ImagePart:
    """An image by URL: either ``https://…`` or a ``data:<media>;base64,<data>`` URL."""

    url: str
    detail: str | None = None


ContentPart: TypeAlias = TextPart | ImagePart


@dataclass(slots=True, frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The JSON arguments exactly as the model produced them (a string, never re-serialized)."""


@dataclass(slots=True)
class Message:
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text, with image parts left out."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@dataclass(slots=True, frozen=True)
class ToolDefinition:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """``mode`` is auto, none, required, or function (then ``name`` is set)."""

    mode: Literal["auto", "none", "required", "function"]
    name: str | None = None


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


@dataclass(slots=True)
class CanonicalRequest:
    messages: list[Message]
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Anthropic's sampling cut-off; only a front end whose alias routes all carry it sets it."""
    stop: list[str] | None = None
    stream: bool = False
    include_usage: bool = False
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    """Allowlisted pass-through fields, forwarded only to formats that accept them."""


class UsageEvidence(enum.Enum):
    PROVIDER_REPORTED = "provider-reported"
    LOCAL_ESTIMATE = "local-estimate"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_creation_tokens: int = 0
    reasoning_tokens: int = 0
    evidence: UsageEvidence = UsageEvidence.PROVIDER_REPORTED

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class CanonicalResponse:
    content: str | None
    tool_calls: list[ToolCall] | None
    finish_reason: FinishReason
    usage: Usage | None
    provider_response_id: str | None = None
    refusal: str | None = None


@dataclass(slots=True, frozen=True)
class StreamStart:
    """The provider accepted the stream. Not semantic output: a fallback may still happen."""

    provider_response_id: str | None = None


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str


@dataclass(slots=True, frozen=True)
class ToolCallDelta:
    """A piece of one tool call. The first delta of a call carries ``id`` and ``name``;
    later ones carry argument fragments. ``index`` is the call's ordinal in this response."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True, frozen=True)
class StreamFinish:
    reason: FinishReason


@dataclass(slots=True, frozen=True)
class StreamUsage:
    usage: Usage


@dataclass(slots=True, frozen=True)
class SkippedEvent:
    """An upstream event that did not decode, after others had: the codec reports it and goes on;
    whether the stream survives it is the gateway's decision, not the codec's."""


SKIPPED = SkippedEvent()
"""The one instance: reporting a skipped event allocates nothing."""

StreamEvent: TypeAlias = StreamStart | TextDelta | ToolCallDelta | StreamFinish | StreamUsage | SkippedEvent

SEMANTIC_EVENTS = (TextDelta, ToolCallDelta)
"""Once one of these has reached the client, the request may no longer move to another target."""


@dataclass(slots=True)
class EmbeddingRequest:
    """One embeddings call: every input is embedded separately, in order.

    ``inputs`` holds strings, or token arrays (lists of token ids) as OpenAI accepts them; a request
    never mixes the two. Nothing streams and nothing is generated, so the governance stage reserves
    input tokens only."""

    inputs: list[str] | list[list[int]]
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"
    """What the client asked for; the gateway always asks its provider for floats and encodes."""
    user: str | None = None
    stream: bool = False
    max_output_tokens: int | None = 0
    """Always 0: an embedding generates no tokens (the governance stage reads it like a chat request's)."""
    extensions: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EmbeddingResponse:
    vectors: list[list[float]]
    """One vector per input, in input order."""
    usage: Usage | None
    provider_model: str | None = None


def estimate_tokens(text_chars: int) -> int:
    """A conservative local estimate: about four characters per token, rounded up."""
    return (text_chars + 3) // 4


def estimate_request_tokens(req: CanonicalRequest | EmbeddingRequest) -> int:
    """The request's input size as a ``local-estimate``: message text, tool calls and tool schemas
    (images are not counted). Used for the alias's input bound and when a provider reports no usage."""
    if type(req) is EmbeddingRequest:
        return sum(len(i) if isinstance(i, list) else estimate_tokens(len(i)) for i in req.inputs)
    assert isinstance(req, CanonicalRequest)
    chars = 0
    for m in req.messages:
        chars += len(m.text()) + 4
        if m.tool_calls:
            chars += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    if req.tools:
        chars += sum(len(orjson.dumps(t.parameters or {})) + len(t.name) for t in req.tools)
    return estimate_tokens(chars)
