from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    SKIPPED,
    CanonicalRequest,
    ImagePart,
    Message,
    ResponseFormat,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.eventstream import EventStreamMessage, EventStreamParser, encode_event, encode_exception
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers.base import ProviderFormat, Target
from tollway.providers.bedrock_converse import BedrockConverseCodec

codec = BedrockConverseCodec()
TARGET = Target("anthropic.claude-3-5-haiku-20241022-v1:0", default_max_output_tokens=2048)
C = UpstreamCategory
WEATHER = ToolDefinition("get_weather", "Current weather.", {"type": "object", "properties": {"city": {"type": "str"}}})
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def body_of(req: CanonicalRequest) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(codec.encode_request(req, TARGET).body)
    return doc


def user(text: str) -> Message:
    return Message("user", text)


def ev(kind: str, **fields: Any) -> EventStreamMessage:
    return EventStreamMessage("event", kind, orjson.dumps({**fields, "p": "abcdefgh"}))


def delta(index: int, **fields: Any) -> EventStreamMessage:
    return ev("contentBlockDelta", contentBlockIndex=index, delta=fields)


START = ev("messageStart", role="assistant")


def stop(reason: str) -> EventStreamMessage:
    return ev("messageStop", stopReason=reason)


def metadata(**usage: int) -> EventStreamMessage:
    return ev("metadata", usage=usage, metrics={"latencyMs": 120})


async def feed(*messages: EventStreamMessage) -> AsyncIterator[EventStreamMessage]:
    for message in messages:
        yield message


async def collect(*messages: EventStreamMessage) -> list[StreamEvent]:
    return [e async for e in codec.decode_stream(feed(*messages))]


# Identity.


def test_the_codec_names_its_format_and_framing() -> None:
    assert codec.format is ProviderFormat("bedrock-converse")
    assert codec.framing == "eventstream"


# Requests.


def test_a_text_request_posts_to_the_models_converse_path() -> None:
    upstream = codec.encode_request(CanonicalRequest([user("Hi")], max_output_tokens=64), TARGET)
    assert upstream.path == "model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    assert upstream.stream is False
    assert upstream.headers == {"content-type": "application/json"}
    assert orjson.loads(upstream.body) == {
        "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
        "inferenceConfig": {"maxTokens": 64},
    }


def test_a_stream_request_posts_to_converse_stream_and_accepts_the_event_stream() -> None:
    upstream = codec.encode_request(CanonicalRequest([user("Hi")], stream=True), TARGET)
    assert upstream.path == "model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream"
    assert upstream.stream is True
    assert upstream.headers["accept"] == "application/vnd.amazon.eventstream"
    assert "stream" not in orjson.loads(upstream.body)


def test_an_arn_model_id_is_one_path_segment() -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    upstream = codec.encode_request(CanonicalRequest([user("Hi")]), Target(arn))
    segment = upstream.path.split("/")[1]
    assert upstream.path.count("/") == 2
    assert segment.startswith("arn%3Aaws%3Abedrock") and "%2F" in segment


def test_no_output_bound_is_invented_when_the_client_gave_none() -> None:
    assert "inferenceConfig" not in body_of(CanonicalRequest([user("Hi")]))


def test_sampling_and_stop_sequences_go_to_inference_config() -> None:
    req = CanonicalRequest([user("Count")], max_output_tokens=10, temperature=0.2, top_p=0.9, stop=["7", "\n\n"])
    assert body_of(req)["inferenceConfig"] == {
        "maxTokens": 10,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["7", "\n\n"],
    }


def test_system_and_developer_messages_become_system_blocks() -> None:
    req = CanonicalRequest(
        [
            Message("system", "Be terse."),
            Message("developer", [TextPart("Answer in French.")]),
            Message("system", ""),
            user("Capital of Italy?"),
        ]
    )
    body = body_of(req)
    assert body["system"] == [{"text": "Be terse."}, {"text": "Answer in French."}]
    assert body["messages"] == [{"role": "user", "content": [{"text": "Capital of Italy?"}]}]


def test_turns_of_one_role_merge_and_empty_text_is_left_out() -> None:
    req = CanonicalRequest(
        [user("Italy?"), Message("assistant", "Rome."), user("Spain?"), Message("user", [TextPart(""), TextPart("Go")])]
    )
    assert body_of(req)["messages"] == [
        {"role": "user", "content": [{"text": "Italy?"}]},
        {"role": "assistant", "content": [{"text": "Rome."}]},
        {"role": "user", "content": [{"text": "Spain?"}, {"text": "Go"}]},
    ]


def test_tool_calls_and_results_round_trip_as_tool_use_and_tool_result() -> None:
    req = CanonicalRequest(
        [
            user("Weather in Paris?"),
            Message("assistant", None, tool_calls=[ToolCall("tu_1", "get_weather", '{"city": "Paris"}')]),
            Message("tool", '{"temp": 18}', tool_call_id="tu_1"),
            Message("tool", [TextPart("a"), ImagePart(f"data:image/png;base64,{PNG}")], tool_call_id="tu_2"),
            Message("tool", "", tool_call_id="tu_3"),
        ],
        tools=[WEATHER],
    )
    assert body_of(req)["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}}],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "tu_1", "content": [{"text": '{"temp": 18}'}]}},
                {
                    "toolResult": {
                        "toolUseId": "tu_2",
                        "content": [{"text": "a"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
                    }
                },
                {"toolResult": {"toolUseId": "tu_3", "content": [{"text": ""}]}},
            ],
        },
    ]


def test_empty_tool_arguments_mean_an_empty_input() -> None:
    req = CanonicalRequest([user("t?"), Message("assistant", None, tool_calls=[ToolCall("tu_1", "get_time", " ")])])
    assert body_of(req)["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "tu_1", "name": "get_time", "input": {}}}
    ]


@pytest.mark.parametrize("arguments", ["[1, 2]", "{not json"])
def test_tool_arguments_that_are_not_an_object_are_refused(arguments: str) -> None:
    req = CanonicalRequest([user("t?"), Message("assistant", None, tool_calls=[ToolCall("tu_1", "f", arguments)])])
    with pytest.raises(InvalidRequest) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == "messages"


def test_a_tool_message_without_its_call_id_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        codec.encode_request(CanonicalRequest([user("a"), Message("tool", "x")]), TARGET)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        (ToolChoice("auto"), {"auto": {}}),
        (ToolChoice("required"), {"any": {}}),
        (ToolChoice("function", "get_weather"), {"tool": {"name": "get_weather"}}),
    ],
    ids=["unset", "auto", "required", "function"],
)
def test_tools_and_tool_choice_become_tool_config(choice: ToolChoice | None, expected: dict[str, Any] | None) -> None:
    bare = ToolDefinition("get_time")
    config = body_of(CanonicalRequest([user("Weather?")], tools=[WEATHER, bare], tool_choice=choice))["toolConfig"]
    assert config["tools"] == [
        {
            "toolSpec": {
                "name": "get_weather",
                "description": "Current weather.",
                "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "str"}}}},
            }
        },
        {"toolSpec": {"name": "get_time", "inputSchema": {"json": {"type": "object", "properties": {}}}}},
    ]
    assert config.get("toolChoice") == expected


def test_parallel_tool_calls_is_a_hint_converse_cannot_carry() -> None:
    body = body_of(CanonicalRequest([user("Weather?")], tools=[WEATHER], parallel_tool_calls=False))
    assert body["toolConfig"] == {"tools": [body["toolConfig"]["tools"][0]]}


def test_tool_choice_none_sends_no_tools_in_a_conversation_without_tool_calls() -> None:
    assert "toolConfig" not in body_of(CanonicalRequest([user("Hi")], tools=[WEATHER], tool_choice=ToolChoice("none")))


def test_tool_choice_none_is_refused_once_the_conversation_has_tool_calls() -> None:
    req = CanonicalRequest(
        [
            user("Weather?"),
            Message("assistant", None, tool_calls=[ToolCall("tu_1", "get_weather", "{}")]),
            Message("tool", "sunny", tool_call_id="tu_1"),
        ],
        tools=[WEATHER],
        tool_choice=ToolChoice("none"),
    )
    with pytest.raises(UnsupportedParameter) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == "tool_choice"


def test_a_function_tool_choice_needs_a_name() -> None:
    with pytest.raises(InvalidRequest) as info:
        codec.encode_request(CanonicalRequest([user("a")], tools=[WEATHER], tool_choice=ToolChoice("function")), TARGET)
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("url", "image"),
    [
        (f"data:image/png;base64,{PNG}", {"format": "png", "source": {"bytes": PNG}}),
        ("data:image/jpeg;base64,AAAA", {"format": "jpeg", "source": {"bytes": "AAAA"}}),
        ("data:image/webp;base64,AAAA", {"format": "webp", "source": {"bytes": "AAAA"}}),
        ("s3://bucket/cats/cat.GIF", {"format": "gif", "source": {"s3Location": {"uri": "s3://bucket/cats/cat.GIF"}}}),
    ],
    ids=["png", "jpeg", "webp", "s3"],
)
def test_images_are_sent_as_bytes_or_an_s3_location(url: str, image: dict[str, Any]) -> None:
    req = CanonicalRequest([Message("user", [TextPart("Look"), ImagePart(url, detail="low")])])
    assert body_of(req)["messages"][0]["content"] == [{"text": "Look"}, {"image": image}]


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://images.example.com/cat.jpg", UnsupportedParameter),
        ("data:image/tiff;base64,AAAA", UnsupportedParameter),
        ("s3://bucket/cat.tiff", UnsupportedParameter),
        ("data:image/png,AAAA", InvalidRequest),
        ("ftp://example.com/cat.png", InvalidRequest),
    ],
    ids=["https", "tiff", "s3-tiff", "not-base64", "ftp"],
)
def test_images_bedrock_cannot_take_are_refused(url: str, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        codec.encode_request(CanonicalRequest([Message("user", [ImagePart(url)])]), TARGET)
    assert type(info.value) is error
    assert getattr(info.value, "param", None) == "messages"


@pytest.mark.parametrize(
    ("req", "param"),
    [
        (CanonicalRequest([user("a")], response_format=ResponseFormat("json_object")), "response_format"),
        (
            CanonicalRequest([user("a")], response_format=ResponseFormat("json_schema", {"schema": {}})),
            "response_format",
        ),
        (CanonicalRequest([user("a")], top_k=5), "top_k"),
    ],
    ids=["json_object", "json_schema", "top_k"],
)
def test_what_converse_cannot_carry_is_refused_not_dropped(req: CanonicalRequest, param: str) -> None:
    with pytest.raises(UnsupportedParameter) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == param


def test_a_text_response_format_is_the_default_and_passes() -> None:
    assert body_of(CanonicalRequest([user("a")], response_format=ResponseFormat("text")))["messages"]


def test_client_metadata_and_extensions_are_not_forwarded() -> None:
    req = CanonicalRequest([user("a")], user="u-1", metadata={"team": "x"}, extensions={"seed": 1})
    assert set(body_of(req)) == {"messages"}


# Responses.


def response(content: list[dict[str, Any]], stop: str = "end_turn", **usage: int) -> bytes:
    doc = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": usage or {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
        "metrics": {"latencyMs": 321},
    }
    return orjson.dumps(doc)


def test_a_text_response_decodes() -> None:
    resp = codec.decode_response(200, response([{"text": "Hello"}, {"text": " there"}]))
    assert resp.content == "Hello there"
    assert resp.tool_calls is None
    assert resp.finish_reason == "stop"
    assert resp.usage == Usage(prompt_tokens=10, completion_tokens=5)
    assert resp.provider_response_id is None


def test_usage_counts_cache_reads_and_writes_into_the_prompt() -> None:
    body = response(
        [{"text": "ok"}],
        inputTokens=4,
        outputTokens=159,
        totalTokens=1305,
        cacheReadInputTokens=100,
        cacheWriteInputTokens=1042,
    )
    assert codec.decode_response(200, body).usage == Usage(
        prompt_tokens=1146, completion_tokens=159, cached_prompt_tokens=100, cache_creation_tokens=1042
    )


def test_tool_use_decodes_as_tool_calls() -> None:
    tool_use = {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Tōkyō"}}
    resp = codec.decode_response(200, response([{"text": "Checking."}, {"toolUse": tool_use}], "tool_use"))
    assert resp.content == "Checking."
    assert resp.tool_calls == [ToolCall("tooluse_1", "get_weather", '{"city":"Tōkyō"}')]
    assert resp.finish_reason == "tool_calls"


def test_tool_use_alone_has_no_content_and_unknown_blocks_are_skipped() -> None:
    tool_use = {"toolUseId": "tooluse_1", "name": "f", "input": {}}
    blocks: list[dict[str, Any]] = [{"reasoningContent": {"reasoningText": {"text": "hm"}}}, {"toolUse": tool_use}]
    resp = codec.decode_response(200, response(blocks, "tool_use"))
    assert resp.content is None
    assert resp.tool_calls == [ToolCall("tooluse_1", "f", "{}")]


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("something_new", "stop"),
    ],
)
def test_stop_reasons_map_to_finish_reasons(stop: str, finish: str) -> None:
    assert codec.decode_response(200, response([{"text": "x"}], stop)).finish_reason == finish


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"output": {}}', b'{"output": {"message": {"content": [{"text": 1}]}}}'],
    ids=["not-json", "not-object", "no-message", "text-not-string"],
)
def test_malformed_responses_are_malformed_errors(body: bytes) -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, body)
    assert info.value.category is C.MALFORMED


def test_a_tool_use_without_its_id_is_malformed() -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, response([{"toolUse": {"name": "f", "input": {}}}], "tool_use"))
    assert info.value.category is C.MALFORMED


# Errors.


def error_headers(name: str, **extra: str) -> dict[str, str]:
    return {"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/", **extra}


@pytest.mark.parametrize(
    ("status", "name", "category"),
    [
        (429, "ThrottlingException", C.RATE_LIMIT),
        (400, "ValidationException", C.INVALID_REQUEST),
        (429, "ModelNotReadyException", C.OVERLOADED),
        (503, "ServiceUnavailableException", C.OVERLOADED),
        (403, "AccessDeniedException", C.PERMISSION),
        (403, "UnrecognizedClientException", C.AUTHENTICATION),
        (403, "InvalidSignatureException", C.AUTHENTICATION),
        (403, "ExpiredTokenException", C.AUTHENTICATION),
        (404, "ResourceNotFoundException", C.NOT_FOUND),
        (408, "ModelTimeoutException", C.TIMEOUT),
        (500, "InternalServerException", C.SERVER),
        (424, "ModelErrorException", C.SERVER),
        (400, "ServiceQuotaExceededException", C.RATE_LIMIT),
    ],
)
def test_each_exception_type_maps_to_its_category(status: int, name: str, category: UpstreamCategory) -> None:
    err = codec.decode_error(status, error_headers(name, **{"Retry-After": "3"}), b'{"message": "nope"}')
    assert (err.category, err.status, err.retry_after, err.reported) == (category, status, 3.0, True)
    assert err.detail == f"{name}: nope"


def test_the_exception_name_may_come_from_the_body() -> None:
    body = b'{"__type": "com.amazon.bedrock#ThrottlingException", "Message": "slow down"}'
    err = codec.decode_error(400, {}, body)
    assert err.category is C.RATE_LIMIT
    assert err.detail == "ThrottlingException: slow down"


def test_without_a_name_the_status_decides() -> None:
    assert codec.decode_error(503, {}, b"").category is C.OVERLOADED
    assert codec.decode_error(502, {}, b"<html>").category is C.SERVER
    assert codec.decode_error(429, {"retry-after": "soon"}, b"{}").retry_after is None


@pytest.mark.parametrize(
    "message",
    [
        "Input is too long for requested model.",
        "The model returned the following errors: prompt is too long: 210000 tokens > 200000 maximum",
        "Too many input tokens. Max input tokens: 8192, request input token count: 9000",
    ],
)
def test_a_validation_error_about_length_is_a_context_length_error(message: str) -> None:
    err = codec.decode_error(400, error_headers("ValidationException"), orjson.dumps({"message": message}))
    assert err.category is C.CONTEXT_LENGTH


def test_the_anthropic_count_reaches_the_client_reason() -> None:
    body = orjson.dumps({"message": "prompt is too long: 210000 tokens > 200000 maximum"})
    err = codec.decode_error(400, error_headers("ValidationException"), body)
    assert err.reason == "The request exceeds the model's context length (210000 tokens requested, 200000 allowed)."


def test_credentials_in_error_messages_are_masked() -> None:
    body = b'{"message": "The security token for AKIAABCDEFGHIJKLMNOP is invalid"}'
    err = codec.decode_error(403, error_headers("UnrecognizedClientException"), body)
    assert "AKIA" not in err.detail


# Streams.


async def test_a_text_stream_decodes_with_usage_from_metadata() -> None:
    events = await collect(
        START,
        delta(0, text="Hel"),
        delta(0, text=""),
        delta(0, text="lo"),
        ev("contentBlockStop", contentBlockIndex=0),
        stop("end_turn"),
        metadata(inputTokens=12, outputTokens=2, totalTokens=14, cacheReadInputTokens=3, cacheWriteInputTokens=4),
    )
    assert events == [
        StreamStart(None),
        TextDelta("Hel"),
        TextDelta("lo"),
        StreamFinish("stop"),
        StreamUsage(Usage(prompt_tokens=19, completion_tokens=2, cached_prompt_tokens=3, cache_creation_tokens=4)),
    ]


async def test_a_tool_use_stream_decodes_start_input_fragments_and_stop() -> None:
    tool = {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather"}}
    no_args = {"toolUse": {"toolUseId": "tooluse_2", "name": "get_time"}}
    events = await collect(
        START,
        delta(0, text="Let me check."),
        ev("contentBlockStop", contentBlockIndex=0),
        ev("contentBlockStart", contentBlockIndex=1, start=tool),
        delta(1, toolUse={"input": '{"city": '}),
        delta(1, toolUse={"input": '"Oslo"}'}),
        ev("contentBlockStop", contentBlockIndex=1),
        ev("contentBlockStart", contentBlockIndex=2, start=no_args),
        ev("contentBlockStop", contentBlockIndex=2),
        stop("tool_use"),
        metadata(inputTokens=30, outputTokens=20, totalTokens=50),
    )
    assert events == [
        StreamStart(None),
        TextDelta("Let me check."),
        ToolCallDelta(0, id="tooluse_1", name="get_weather"),
        ToolCallDelta(0, arguments='{"city": '),
        ToolCallDelta(0, arguments='"Oslo"}'),
        ToolCallDelta(1, id="tooluse_2", name="get_time"),
        ToolCallDelta(1, arguments="{}"),
        StreamFinish("tool_calls"),
        StreamUsage(Usage(prompt_tokens=30, completion_tokens=20)),
    ]


async def test_a_tool_start_without_its_id_is_malformed() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(START, ev("contentBlockStart", contentBlockIndex=0, start={"toolUse": {"name": "f"}}))
    assert info.value.category is C.MALFORMED


async def test_a_stream_that_ends_after_its_stop_reason_is_complete_without_usage() -> None:
    assert await collect(START, delta(0, text="Hi"), stop("max_tokens")) == [
        StreamStart(None),
        TextDelta("Hi"),
        StreamFinish("length"),
    ]


async def test_a_stream_cut_before_its_stop_reason_is_truncated() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(START, delta(0, text="Hi"))
    assert info.value.category is C.TRUNCATED
    assert not info.value.reported


async def test_metadata_before_the_stop_reason_does_not_end_the_stream() -> None:
    early = metadata(inputTokens=1, outputTokens=1, totalTokens=2)
    events = await collect(START, early, delta(0, text="x"), stop("end_turn"))
    assert events[-2:] == [TextDelta("x"), StreamFinish("stop")]


async def test_nothing_after_metadata_is_read() -> None:
    events = await collect(START, stop("end_turn"), metadata(inputTokens=1, outputTokens=1), delta(0, text="late"))
    assert TextDelta("late") not in events


@pytest.mark.parametrize(
    ("exception", "category"),
    [
        ("throttlingException", C.RATE_LIMIT),
        ("validationException", C.INVALID_REQUEST),
        ("modelNotReadyException", C.OVERLOADED),
        ("serviceUnavailableException", C.OVERLOADED),
        ("internalServerException", C.SERVER),
        ("modelStreamErrorException", C.SERVER),
        ("somethingNewException", C.SERVER),
    ],
)
async def test_an_exception_message_ends_the_stream_with_its_typed_error(
    exception: str, category: UpstreamCategory
) -> None:
    message = EventStreamMessage("exception", exception, b'{"message": "Bedrock says no"}')
    seen: list[StreamEvent] = []
    with pytest.raises(UpstreamError) as info:
        async for event in codec.decode_stream(feed(START, delta(0, text="Hi"), message)):
            seen.append(event)
    assert seen == [StreamStart(None), TextDelta("Hi")]
    assert (info.value.category, info.value.reported) == (category, True)
    assert info.value.detail == f"stream error {exception}: Bedrock says no"


async def test_a_context_length_exception_in_the_stream_is_a_context_length_error() -> None:
    message = EventStreamMessage(
        "exception", "validationException", b'{"message": "Input is too long for requested model."}'
    )
    with pytest.raises(UpstreamError) as info:
        await collect(message)
    assert info.value.category is C.CONTEXT_LENGTH


async def test_an_error_message_is_a_reported_server_error() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(START, EventStreamMessage("error", "InternalFailure", b"boom"))
    assert (info.value.category, info.value.reported) == (C.SERVER, True)
    assert info.value.detail == "stream error InternalFailure: boom"


async def test_an_undecodable_event_after_the_first_is_skipped() -> None:
    bad = EventStreamMessage("event", "contentBlockDelta", b"{not json")
    events = await collect(START, bad, delta(0, text="ok"), stop("end_turn"))
    assert events == [StreamStart(None), SKIPPED, TextDelta("ok"), StreamFinish("stop")]


async def test_an_undecodable_first_event_fails_the_stream() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(EventStreamMessage("event", "messageStart", b"nope"))
    assert info.value.category is C.MALFORMED


async def test_a_framed_transcript_decodes_end_to_end() -> None:
    """The codec reads what ``tollway.eventstream`` frames from Bedrock's bytes, at any chunking."""
    frames = [
        encode_event("messageStart", b'{"role":"assistant","p":"abc"}'),
        encode_event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"text":"Grüße"}}'.encode()),
        encode_event("messageStop", b'{"stopReason":"end_turn"}'),
        encode_exception("throttlingException", b'{"message":"late"}'),
    ]
    data = b"".join(frames)
    for size in (1, 3, 64, len(data)):
        parser = EventStreamParser()
        messages = [m for i in range(0, len(data), size) for m in parser.feed(data[i : i + size])]
        with pytest.raises(UpstreamError) as info:
            await collect(*messages)
        assert info.value.category is C.RATE_LIMIT
    assert await collect(*EventStreamParser().feed(b"".join(frames[:3]))) == [
        StreamStart(None),
        TextDelta("Grüße"),
        StreamFinish("stop"),
    ]
