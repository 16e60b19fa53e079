from __future__ import annotations

import pytest

import tollway.providers as providers
from tollway.providers import (
    FORMAT_CAPABILITIES,
    AnthropicMessagesCodec,
    BedrockConverseCodec,
    GeminiCodec,
    OpenAIChatCodec,
    ProviderFormat,
    codec_for,
)


@pytest.mark.parametrize(
    ("fmt", "cls"),
    [
        (ProviderFormat.OPENAI_CHAT, OpenAIChatCodec),
        (ProviderFormat.ANTHROPIC_MESSAGES, AnthropicMessagesCodec),
        (ProviderFormat.GEMINI, GeminiCodec),
        (ProviderFormat.BEDROCK_CONVERSE, BedrockConverseCodec),
    ],
)
def test_codec_for_returns_one_shared_codec_of_the_format(fmt: ProviderFormat, cls: type) -> None:
    codec = codec_for(fmt)
    assert isinstance(codec, cls)
    assert codec.format is fmt
    assert codec_for(fmt) is codec


def test_every_format_has_a_codec_and_capabilities() -> None:
    assert set(FORMAT_CAPABILITIES) == set(ProviderFormat)
    for fmt in ProviderFormat:
        assert codec_for(fmt).format is fmt


def test_capabilities_say_what_each_format_can_carry() -> None:
    assert FORMAT_CAPABILITIES[ProviderFormat.OPENAI_CHAT] == {
        "streaming",
        "tools",
        "vision",
        "json_object",
        "json_schema",
    }
    assert FORMAT_CAPABILITIES[ProviderFormat.ANTHROPIC_MESSAGES] == {"streaming", "tools", "vision"}
    assert FORMAT_CAPABILITIES[ProviderFormat.BEDROCK_CONVERSE] == {"streaming", "tools", "vision"}


def test_each_codec_names_the_framing_of_its_streams() -> None:
    framings = {fmt: codec_for(fmt).framing for fmt in ProviderFormat}
    assert framings == {
        ProviderFormat.OPENAI_CHAT: "sse",
        ProviderFormat.ANTHROPIC_MESSAGES: "sse",
        ProviderFormat.GEMINI: "sse",
        ProviderFormat.BEDROCK_CONVERSE: "eventstream",
    }


def test_public_names_are_exported() -> None:
    assert set(providers.__all__) >= {
        "AnthropicMessagesCodec",
        "AnyCodec",
        "BedrockConverseCodec",
        "EventStreamCodec",
        "FORMAT_CAPABILITIES",
        "OpenAIChatCodec",
        "ProviderCodec",
        "ProviderFormat",
        "Target",
        "codec_for",
    }
    assert all(hasattr(providers, name) for name in providers.__all__)
