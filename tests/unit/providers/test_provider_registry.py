from __future__ import annotations

import pytest

import tollway.providers as providers
from tollway.providers import (
    FORMAT_CAPABILITIES,
    AnthropicMessagesCodec,
    OpenAIChatCodec,
    ProviderFormat,
    codec_for,
)


@pytest.mark.parametrize(
    ("fmt", "cls"),
    [(ProviderFormat.OPENAI_CHAT, OpenAIChatCodec), (ProviderFormat.ANTHROPIC_MESSAGES, AnthropicMessagesCodec)],
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


def test_public_names_are_exported() -> None:
    assert set(providers.__all__) >= {
        "AnthropicMessagesCodec",
        "FORMAT_CAPABILITIES",
        "OpenAIChatCodec",
        "ProviderCodec",
        "ProviderFormat",
        "Target",
        "codec_for",
    }
    assert all(hasattr(providers, name) for name in providers.__all__)
