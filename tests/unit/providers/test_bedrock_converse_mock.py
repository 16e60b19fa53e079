"""The mock's Converse format against the codec: what one writes, the other reads.

Here rather than under ``tests/unit/mock`` because it pairs the two halves of one format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from botocore.eventstream import EventStreamBuffer

from tollway.canonical import (
    SKIPPED,
    CanonicalRequest,
    Message,
    StreamEvent,
    StreamFinish,
    StreamUsage,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
)
from tollway.eventstream import EventStreamMessage, EventStreamParser
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.mock.app import create_app
from tollway.mock.bedrock_converse import BedrockConverse, route, signed
from tollway.mock.content import DEFAULT_CHUNKS, text_reply, tool_reply
from tollway.mock.wire import RequestError
from tollway.providers.base import Target
from tollway.providers.bedrock_converse import BedrockConverseCodec

codec = BedrockConverseCodec()
wire = BedrockConverse()
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
WEATHER = ToolDefinition("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def as_mock_body(req: CanonicalRequest) -> dict[str, Any]:
    """The body the mock parses: the codec's, with the path's model and operation as the app adds them."""
    upstream = codec.encode_request(req, Target(MODEL))
    found = route("/" + upstream.path)
    assert found is not None
    model, stream = found
    body: dict[str, Any] = orjson.loads(upstream.body)
    return {**body, "model": model, "stream": stream}


async def decode(data: bytes) -> list[StreamEvent]:
    async def messages() -> AsyncIterator[EventStreamMessage]:
        parser = EventStreamParser()
        for i in range(0, len(data), 5):
            for message in parser.feed(data[i : i + 5]):
                yield message

    return [e async for e in codec.decode_stream(messages())]


def test_route_reads_the_model_and_operation_from_the_path() -> None:
    assert route("/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse") == (MODEL, False)
    assert route("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Aprofile%2Fx/converse-stream") == (
        "arn:aws:bedrock:us-east-1:1:profile/x",
        True,
    )
    assert route("/model/x/invoke") is None
    assert route("/v1/messages") is None


def test_only_a_sigv4_authorization_is_accepted() -> None:
    assert signed(b"AWS4-HMAC-SHA256 Credential=AKID/20261202/us-east-1/bedrock/aws4_request, Signature=00")
    assert not signed(b"Bearer abc")
    assert not signed(None)
    assert wire.authorized(bearer=True, api_key=True) is False
    assert wire.authorized(bearer=False, api_key=False, sigv4=True) is True
    assert wire.always_require_auth


def test_a_buffered_text_reply_decodes() -> None:
    req = wire.parse(as_mock_body(CanonicalRequest([Message("user", "hello there")], max_output_tokens=64)))
    assert (req.model, req.stream, req.echo, req.max_tokens) == (MODEL, False, "hello there", 64)
    reply = text_reply(req.echo, None, req.max_tokens, DEFAULT_CHUNKS)
    resp = codec.decode_response(200, wire.render(req, reply, 1, 0))
    assert resp.content == "Mock reply #2: hello there"
    assert resp.finish_reason == "stop"
    assert resp.usage is not None and resp.usage.prompt_tokens == req.prompt_tokens


def test_a_buffered_tool_reply_decodes() -> None:
    body = as_mock_body(
        CanonicalRequest([Message("user", "Oslo?")], tools=[WEATHER], tool_choice=ToolChoice("function", "get_weather"))
    )
    req = wire.parse(body)
    assert req.tool is not None and req.tool.name == "get_weather"
    resp = codec.decode_response(200, wire.render(req, tool_reply(req.tool, DEFAULT_CHUNKS), 7, 0))
    assert resp.tool_calls is not None
    assert resp.tool_calls[0].name == "get_weather"
    assert resp.finish_reason == "tool_calls"


def test_no_tool_is_called_after_a_tool_result() -> None:
    req = CanonicalRequest(
        [
            Message("user", "Oslo?"),
            Message("assistant", None, tool_calls=[ToolCall("tu_1", "get_weather", '{"city":"Oslo"}')]),
            Message("tool", "sunny", tool_call_id="tu_1"),
        ],
        tools=[WEATHER],
    )
    parsed = wire.parse(as_mock_body(req))
    assert parsed.tool is None
    assert parsed.echo == "sunny"


async def test_a_text_stream_decodes_through_both_parsers() -> None:
    req = wire.parse(as_mock_body(CanonicalRequest([Message("user", "Grüße aus Köln")], stream=True)))
    plan = wire.stream(req, text_reply(req.echo, None, None, DEFAULT_CHUNKS), 1, 0)
    data = b"".join([plan.preamble, *plan.deltas, plan.tail])
    events = await decode(data)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Mock reply #3: Grüße aus Köln"
    assert events[-2] == StreamFinish("stop")
    assert isinstance(events[-1], StreamUsage)
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    assert [m.headers[":event-type"] for m in buffer][-3:] == ["contentBlockStop", "messageStop", "metadata"]


async def test_a_tool_stream_decodes() -> None:
    req = wire.parse(as_mock_body(CanonicalRequest([Message("user", "Oslo?")], tools=[WEATHER], stream=True)))
    assert req.tool is not None
    reply = tool_reply(req.tool, DEFAULT_CHUNKS)
    plan = wire.stream(req, reply, 3, 0)
    events = await decode(b"".join([plan.preamble, *plan.deltas, plan.tail]))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(0, id="tooluse_mock0000000000000003", name="get_weather")
    assert len(calls) > 2
    assert "".join(c.arguments for c in calls[1:]) == reply.arguments
    assert StreamFinish("tool_calls") in events


async def test_fault_frames_decode_as_the_codec_expects() -> None:
    req = wire.parse(as_mock_body(CanonicalRequest([Message("user", "hi")], stream=True)))
    plan = wire.stream(req, text_reply(req.echo, None, None, DEFAULT_CHUNKS), 1, 0)
    skipped = await decode(plan.preamble + plan.deltas[0] + wire.malformed_frame + plan.tail)
    assert SKIPPED in skipped
    with pytest.raises(UpstreamError) as info:
        await decode(plan.preamble + plan.deltas[0] + wire.midstream_error("ThrottlingException"))
    assert info.value.category is UpstreamCategory.RATE_LIMIT
    with pytest.raises(UpstreamError) as info:
        await decode(plan.preamble + plan.deltas[0] + wire.midstream_error(None))
    assert info.value.category is UpstreamCategory.OVERLOADED


def test_errors_name_the_exception_in_the_header_and_the_codec_reads_it() -> None:
    for status, category in ((429, UpstreamCategory.RATE_LIMIT), (400, UpstreamCategory.INVALID_REQUEST)):
        headers = {k.decode(): v.decode() for k, v in wire.error_headers(status)}
        err = codec.decode_error(status, headers, wire.error(status, "Mock fault"))
        assert err.category is category
    named = dict(wire.error_headers(429, "ModelNotReadyException"))
    assert named[b"x-amzn-errortype"].startswith(b"ModelNotReadyException:")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": []}, "start with a user message"),
        ({"messages": [{"role": "assistant", "content": [{"text": "x"}]}]}, "start with a user message"),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "user", "content": [{"text": "b"}]}]},
            "alternate",
        ),
        ({"messages": [{"role": "user", "content": [{"text": " "}]}]}, "blank"),
        (
            {"messages": [{"role": "user", "content": [{"toolResult": {"toolUseId": "t", "content": []}}]}]},
            "toolConfig",
        ),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}], "inferenceConfig": {"maxTokens": 0}},
            "maxTokens",
        ),
    ],
    ids=["empty", "assistant-first", "not-alternating", "blank-text", "tool-result-without-tools", "max-tokens"],
)
def test_the_mock_refuses_what_bedrock_refuses(body: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        wire.parse({**body, "model": MODEL, "stream": False})


# The mock app's Converse routes, over ASGI.

SIGNED = {"authorization": "AWS4-HMAC-SHA256 Credential=AKID/20261202/us-east-1/bedrock/aws4_request, Signature=00"}
CONVERSE = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"


async def _post(path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    app = create_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mock") as client:
        resp = await client.post(path, json=body, headers=headers or {})
    return resp, app


HELLO = {"messages": [{"role": "user", "content": [{"text": "hello"}]}]}


async def test_the_app_answers_a_signed_converse_request() -> None:
    resp, app = await _post(CONVERSE, HELLO, SIGNED)
    assert resp.status_code == 200
    assert codec.decode_response(200, resp.content).content == "Mock reply #1: hello"
    (record,) = app.requests
    assert (record["format"], record["model"], record["stream"], record["messages"]) == ("bedrock", MODEL, False, 1)


async def test_the_app_refuses_an_unsigned_request_as_bedrock_does() -> None:
    for headers in ({}, {"authorization": "Bearer sk-x"}):
        resp, _ = await _post(CONVERSE, HELLO, headers)
        assert resp.status_code == 401
        assert resp.headers["x-amzn-errortype"].startswith("UnrecognizedClientException:")
        err = codec.decode_error(401, dict(resp.headers), resp.content)
        assert err.category is UpstreamCategory.AUTHENTICATION


async def test_a_fault_status_carries_the_exception_name_and_retry_after() -> None:
    resp, _ = await _post("/_fault/status=429,retry_after=3" + CONVERSE, HELLO, SIGNED)
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "3"
    err = codec.decode_error(429, dict(resp.headers), resp.content)
    assert (err.category, err.retry_after) == (UpstreamCategory.RATE_LIMIT, 3.0)


async def test_a_context_refusal_is_worded_as_bedrock_words_it() -> None:
    resp, _ = await _post(
        "/_fault/context_window=1" + CONVERSE,
        {"messages": [{"role": "user", "content": [{"text": "a long prompt " * 20}]}]},
        SIGNED,
    )
    assert resp.status_code == 400
    assert resp.headers["x-amzn-errortype"].startswith("ValidationException:")
    assert codec.decode_error(400, dict(resp.headers), resp.content).category is UpstreamCategory.CONTEXT_LENGTH


async def test_the_stream_route_answers_an_event_stream() -> None:
    resp, _ = await _post(CONVERSE + "-stream", HELLO, SIGNED)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/vnd.amazon.eventstream"
    events = await decode(resp.content)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Mock reply #1: hello"
    assert isinstance(events[-1], StreamUsage)
