"""Bedrock Converse reasoning, codec against mock: a thinking budget turns reasoning on, the answer's
``reasoningContent`` becomes canonical thinking (buffered and streamed), and the thinking sent back
in the next turn reaches Bedrock with its signature unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    CanonicalRequest,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ThinkingPart,
)
from tollway.eventstream import EventStreamMessage, EventStreamParser, encode_event
from tollway.exceptions import UpstreamError
from tollway.mock.bedrock_converse import BedrockConverse, route
from tollway.mock.content import DEFAULT_CHUNKS, text_reply, thinking_signature
from tollway.mock.wire import RequestError
from tollway.providers.base import Target
from tollway.providers.bedrock_converse import BedrockConverseCodec

codec = BedrockConverseCodec()
wire = BedrockConverse()
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"


def as_mock_body(req: CanonicalRequest) -> dict[str, Any]:
    upstream = codec.encode_request(req, Target(MODEL))
    found = route("/" + upstream.path)
    assert found is not None
    body: dict[str, Any] = orjson.loads(upstream.body)
    return {**body, "model": found[0], "stream": found[1]}


async def decode(data: bytes) -> list[StreamEvent]:
    async def messages() -> AsyncIterator[EventStreamMessage]:
        parser = EventStreamParser()
        for i in range(0, len(data), 7):
            for message in parser.feed(data[i : i + 7]):
                yield message

    return [e async for e in codec.decode_stream(messages())]


def thinking_request(*messages: Message, stream: bool = False) -> CanonicalRequest:
    return CanonicalRequest(list(messages), max_output_tokens=4096, thinking_budget=2048, stream=stream)


def test_a_thinking_budget_is_sent_as_anthropic_thinking_in_additional_fields() -> None:
    body = as_mock_body(thinking_request(Message("user", "Grüße")))
    assert body["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert wire.parse(body).thinking


def test_buffered_reasoning_becomes_thinking_and_goes_back_signed() -> None:
    req = wire.parse(as_mock_body(thinking_request(Message("user", "Grüße aus Köln"))))
    resp = codec.decode_response(200, wire.render(req, text_reply(req.echo, None, None, DEFAULT_CHUNKS), 1, 0))
    assert resp.thinking is not None and len(resp.thinking) == 1
    block = resp.thinking[0]
    assert isinstance(block, ThinkingPart) and block.thinking.startswith("Mock thinking about:")
    assert resp.content is not None and "Grüße aus Köln" in resp.content
    follow = thinking_request(
        Message("user", "Grüße aus Köln"),
        Message("assistant", [block]),
        Message("user", "und morgen?"),
    )
    assert wire.parse(as_mock_body(follow)).echo == "und morgen?"
    tampered = ThinkingPart(block.thinking + " (edited)", block.signature)
    with pytest.raises(RequestError):
        wire.parse(
            as_mock_body(thinking_request(Message("user", "a"), Message("assistant", [tampered]), Message("user", "b")))
        )


async def test_streamed_reasoning_is_thinking_deltas_then_the_signature() -> None:
    req = wire.parse(as_mock_body(thinking_request(Message("user", "Grüße"), stream=True)))
    plan = wire.stream(req, text_reply(req.echo, None, None, DEFAULT_CHUNKS), 1, 0)
    events = await decode(b"".join([plan.preamble, *plan.deltas, plan.tail]))
    thinking = [e for e in events if isinstance(e, ThinkingDelta)]
    assert {e.index for e in thinking} == {0}
    text = "".join(e.thinking for e in thinking)
    assert text.startswith("Mock thinking about:")
    assert [e.signature for e in thinking if e.signature] == [thinking_signature(text)]
    assert "Grüße" in "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_a_redacted_block_in_pieces_is_one_redacted_thinking_block() -> None:
    frames = [
        encode_event("messageStart", b'{"role":"assistant"}'),
        encode_event(
            "contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"reasoningContent":{"redactedContent":"AAE="}}}'
        ),
        encode_event(
            "contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"reasoningContent":{"redactedContent":"Ag=="}}}'
        ),
        encode_event("contentBlockStop", b'{"contentBlockIndex":0}'),
        encode_event("messageStop", b'{"stopReason":"end_turn"}'),
    ]
    events = await decode(b"".join(frames))
    assert [e for e in events if isinstance(e, RedactedThinking)] == [RedactedThinking(0, "AAEC")]


async def test_redacted_content_that_is_not_base64_is_malformed() -> None:
    frames = [
        encode_event("messageStart", b'{"role":"assistant"}'),
        encode_event(
            "contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"reasoningContent":{"redactedContent":"@@"}}}'
        ),
    ]
    with pytest.raises(UpstreamError):
        await decode(b"".join(frames))


def test_redacted_thinking_goes_back_as_redacted_content() -> None:
    req = thinking_request(
        Message("user", "a"), Message("assistant", [RedactedThinkingPart("AAEC")]), Message("user", "b")
    )
    body = as_mock_body(req)
    assert body["messages"][1]["content"] == [{"reasoningContent": {"redactedContent": "AAEC"}}]
    wire.parse(body)
