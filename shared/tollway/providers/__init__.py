"""Provider codecs: pure translation between the canonical types and each provider's wire format.

``codec_for`` returns the one shared, stateless codec of a format, and ``embeddings_codec_for``
its embeddings capability when its providers embed; ``FORMAT_CAPABILITIES``
says what each format can represent, so configuration can refuse a route that would
have to drop a feature a model is declared to have. ``provider_name`` is what metrics and spans
call a provider.
"""

from __future__ import annotations

from collections.abc import Mapping

from tollway.providers.anthropic_messages import AnthropicMessagesCodec
from tollway.providers.base import AnyCodec, EmbeddingsCodec, EventStreamCodec, ProviderCodec, ProviderFormat, Target
from tollway.providers.bedrock_converse import BedrockConverseCodec
from tollway.providers.gemini import GeminiCodec
from tollway.providers.openai_chat import OpenAIChatCodec
from tollway.providers.openai_embeddings import OpenAIEmbeddingsCodec

__all__ = [
    "FORMAT_CAPABILITIES",
    "AnthropicMessagesCodec",
    "AnyCodec",
    "BedrockConverseCodec",
    "EmbeddingsCodec",
    "EventStreamCodec",
    "GeminiCodec",
    "OpenAIChatCodec",
    "ProviderCodec",
    "ProviderFormat",
    "Target",
    "codec_for",
    "embeddings_codec_for",
    "provider_name",
]

FORMAT_CAPABILITIES: dict[ProviderFormat, frozenset[str]] = {
    ProviderFormat.OPENAI_CHAT: frozenset({"streaming", "tools", "vision", "json_object", "json_schema"}),
    ProviderFormat.ANTHROPIC_MESSAGES: frozenset({"streaming", "tools", "vision"}),
    ProviderFormat.BEDROCK_CONVERSE: frozenset({"streaming", "tools", "vision"}),
    ProviderFormat.GEMINI: frozenset({"streaming", "tools", "vision", "json_object", "json_schema"}),
}

_CODECS: Mapping[ProviderFormat, AnyCodec] = {
    ProviderFormat.OPENAI_CHAT: OpenAIChatCodec(),
    ProviderFormat.ANTHROPIC_MESSAGES: AnthropicMessagesCodec(),
    ProviderFormat.BEDROCK_CONVERSE: BedrockConverseCodec(),
    ProviderFormat.GEMINI: GeminiCodec(),
}


def codec_for(fmt: ProviderFormat) -> AnyCodec:
    """The shared codec of ``fmt``; codecs hold no per-request state, so one instance serves all.
    Its ``framing`` says how its streams are framed."""
    return _CODECS[fmt]


_EMBEDDINGS: Mapping[ProviderFormat, EmbeddingsCodec] = {ProviderFormat.OPENAI_CHAT: OpenAIEmbeddingsCodec()}


def embeddings_codec_for(fmt: ProviderFormat) -> EmbeddingsCodec | None:
    """The embeddings capability of ``fmt``; ``None`` when its providers do not embed (Anthropic)."""
    return _EMBEDDINGS.get(fmt)


_PROVIDER_NAMES: Mapping[ProviderFormat, str] = {
    ProviderFormat.OPENAI_CHAT: "openai",
    ProviderFormat.ANTHROPIC_MESSAGES: "anthropic",
    ProviderFormat.GEMINI: "gcp.gemini",
    ProviderFormat.BEDROCK_CONVERSE: "aws.bedrock",
}


def provider_name(provider_type: str, fmt: ProviderFormat) -> str:
    """``gen_ai.provider.name`` (a well-known value of the OpenTelemetry GenAI conventions) of a
    provider of ``provider_type`` spoken to in ``fmt``: by format, except Vertex AI, which speaks the
    Gemini API's format and is ``gcp.vertex_ai``."""
    return "gcp.vertex_ai" if provider_type == "vertex" else _PROVIDER_NAMES[fmt]
