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
    "EPHEMERAL",
    "SEMANTIC_EVENTS",
    "SKIPPED",
    "CacheControl",
    "CanonicalRequest",
    "CanonicalResponse",
    "ContentPart",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "FinishReason",
    "ImagePart",
    "Message",
    "RedactedThinking",
    "RedactedThinkingPart",
    "ResponseFormat",
    "Role",
    "SkippedEvent",
    "StreamEvent",
    "StreamFinish",
    "StreamStart",
    "StreamUsage",
    "TextDelta",
    "TextPart",
    "ThinkingBlock",
    "ThinkingDelta",
    "ThinkingPart",
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
class CacheControl:
    """A prompt-cache breakpoint (Anthropic's ``cache_control: {"type": "ephemeral"}``): the prompt
    up to and including the block that carries it may be cached. A hint with no effect on the
    answer; only the Anthropic codec writes it, exactly where the client put it."""

    ttl: str | None = None
    """``5m`` or ``1h`` as the client gave it; ``None``: the provider's default (5 minutes)."""


EPHEMERAL = CacheControl()
"""The breakpoint without a TTL, shared: most requests that cache use only this one."""


@dataclass(slots=True, frozen=True)
class TextPart:
    text: str
    cache_control: CacheControl | None = None


@dataclass(slots=True, frozen=True)
class ImagePart:
    """An image by URL: either ``https://…`` or a ``data:<media>;base64,<data>`` URL."""

    url: str
    detail: str | None = None
    cache_control: CacheControl | None = None


@dataclass(slots=True, frozen=True)
class ThinkingPart:
    """A block of Anthropic extended thinking, as the model wrote it, with the signature that lets
    the provider check it was not changed. An assistant turn sends it back byte for byte."""

    thinking: str
    signature: str


@dataclass(slots=True, frozen=True)
class RedactedThinkingPart:
    """A thinking block the provider encrypted (``redacted_thinking``): opaque ``data``, sent back as is."""

    data: str


ThinkingBlock: TypeAlias = ThinkingPart | RedactedThinkingPart

ContentPart: TypeAlias = TextPart | ImagePart | ThinkingPart | RedactedThinkingPart
"""Thinking parts appear only in assistant messages, and only a front end whose alias routes are
all Anthropic-format puts them there."""


@dataclass(slots=True, frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The JSON arguments exactly as the model produced them (a string, never re-serialized)."""
    cache_control: CacheControl | None = None
    """A breakpoint on the request's ``tool_use`` block; never set on a response's calls."""


@dataclass(slots=True)
class Message:
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    cache_control: CacheControl | None = None
    """For a ``tool`` message, the breakpoint on the ``tool_result`` block it becomes (its parts
    and an assistant's tool calls carry their own)."""

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
    cache_control: CacheControl | None = None


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
    thinking_budget: int | None = None
    """Anthropic extended thinking's ``budget_tokens``; ``None``: no thinking. Only a front end
    whose alias routes are all Anthropic-format sets it."""
    anthropic_beta: tuple[str, ...] = ()
    """The ``anthropic-beta`` features the client asked for, already checked against every route of
    the alias; the Anthropic codec sends them upstream, and only ones that need nothing from the
    provider reach an alias with other formats."""


class UsageEvidence(enum.Enum):
    PROVIDER_REPORTED = "provider-reported"
    LOCAL_ESTIMATE = "local-estimate"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Usage:
    """``prompt_tokens`` counts every prompt token: those read from the provider's prompt cache
    (``cached_prompt_tokens``) and written to it (``cache_creation_tokens``) included, as OpenAI
    counts them (Anthropic's ``input_tokens`` leaves both out; its codec adds them back).
    ``completion_tokens`` includes ``reasoning_tokens``."""

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
    thinking: list[ThinkingBlock] | None = None
    """Extended thinking blocks, in the order the model wrote them (before its text and calls).
    Only the Anthropic Messages client format shows them; the others leave them out."""


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
class ThinkingDelta:
    """A piece of one extended thinking block. ``index`` is the block's ordinal among this
    response's thinking blocks (redacted ones included); its first delta opens it, possibly empty.
    ``signature`` comes once, after the thinking text."""

    index: int
    thinking: str = ""
    signature: str = ""


@dataclass(slots=True, frozen=True)
class RedactedThinking:
    """One whole redacted thinking block; ``index`` counts as in :class:`ThinkingDelta`."""

    index: int
    data: str


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

StreamEvent: TypeAlias = (
    StreamStart
    | TextDelta
    | ToolCallDelta
    | ThinkingDelta
    | RedactedThinking
    | StreamFinish
    | StreamUsage
    | SkippedEvent
)

SEMANTIC_EVENTS = (TextDelta, ToolCallDelta, ThinkingDelta, RedactedThinking)
"""Once one of these has reached the client, the request may no longer move to another target.
Thinking counts: an Anthropic Messages client is shown it as it comes, and another route would
think (and sign) differently."""


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
