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
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import (
    ContentFiltered,
    ContextLengthExceeded,
    InvalidRequest,
    UnsupportedParameter,
    UpstreamCategory,
    UpstreamError,
)
from tollway.providers import FORMAT_CAPABILITIES, GeminiCodec, ProviderFormat, Target, codec_for
from tollway.providers.gemini import generate_path
from tollway.wire import SseEvent

codec = GeminiCodec()
TARGET = Target("gemini-2.5-flash")
C = UpstreamCategory
PIXEL = "data:image/png;base64,iVBORw0KGgo="


def body_of(req: CanonicalRequest) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(codec.encode_request(req, TARGET).body)
    return doc


def user(text: str) -> Message:
    return Message("user", text)


def chunk(parts: list[dict[str, Any]] | None = None, finish: str | None = None, **extra: Any) -> SseEvent:
    cand: dict[str, Any] = {"index": 0}
    if parts is not None:
        cand["content"] = {"parts": parts, "role": "model"}
    if finish is not None:
        cand["finishReason"] = finish
    return SseEvent(None, orjson.dumps({"candidates": [cand], "responseId": "r1", **extra}).decode())


async def feed(*frames: SseEvent) -> AsyncIterator[SseEvent]:
    for frame in frames:
        yield frame


async def collect(*frames: SseEvent) -> list[StreamEvent]:
    return [event async for event in codec.decode_stream(feed(*frames))]


def error_body(code: int, status: str, message: str = "boom", details: list[Any] | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        err["details"] = details
    return orjson.dumps({"error": err})


# Registration and paths.


def test_gemini_is_registered_with_its_capabilities() -> None:
    assert codec_for(ProviderFormat.GEMINI).format is ProviderFormat.GEMINI
    assert FORMAT_CAPABILITIES[ProviderFormat.GEMINI] == {"streaming", "tools", "vision", "json_object", "json_schema"}


def test_path_names_model_and_method_and_asks_for_sse_when_streaming() -> None:
    assert codec.encode_request(CanonicalRequest([user("hi")]), TARGET).path == (
        "v1beta/models/gemini-2.5-flash:generateContent"
    )
    streamed = codec.encode_request(CanonicalRequest([user("hi")], stream=True), TARGET)
    assert (streamed.path, streamed.stream) == ("v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", True)
    assert generate_path("models/gemini-2.5-pro", False) == "v1beta/models/gemini-2.5-pro:generateContent"
    vertex = "v1/projects/p/locations/us-central1/publishers/google/models/"
    assert generate_path("gemini-2.5-pro", True, vertex) == f"{vertex}gemini-2.5-pro:streamGenerateContent?alt=sse"


# Encoding.


def test_data_url_image_becomes_inline_data() -> None:
    req = CanonicalRequest([Message("user", [TextPart("what is it?"), ImagePart(PIXEL)])])
    assert body_of(req)["contents"] == [
        {
            "role": "user",
            "parts": [{"text": "what is it?"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}],
        }
    ]


def test_remote_image_url_is_refused_not_dropped() -> None:
    req = CanonicalRequest([Message("user", [ImagePart("https://example.com/cat.png")])])
    with pytest.raises(UnsupportedParameter) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == "messages"


def test_json_object_and_json_schema_set_the_response_mime_type() -> None:
    plain = body_of(CanonicalRequest([user("x")], response_format=ResponseFormat("json_object")))
    assert plain["generationConfig"] == {"responseMimeType": "application/json"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = ResponseFormat("json_schema", {"name": "thing", "schema": schema})
    assert body_of(CanonicalRequest([user("x")], response_format=fmt))["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
    }
    with pytest.raises(InvalidRequest):
        codec.encode_request(CanonicalRequest([user("x")], response_format=ResponseFormat("json_schema")), TARGET)


def test_tool_results_are_named_after_the_call_they_answer_in_the_latest_turn() -> None:
    calls = [ToolCall("call_0", "get_weather", '{"city":"Oslo"}')]
    later = [ToolCall("call_0", "get_time", "")]
    req = CanonicalRequest(
        [
            user("weather?"),
            Message("assistant", None, tool_calls=calls),
            Message("tool", "rain", tool_call_id="call_0"),
            Message("assistant", "And the time?", tool_calls=later),
            Message("tool", [TextPart("noon")], tool_call_id="call_0"),
        ],
        tools=[ToolDefinition("get_weather"), ToolDefinition("get_time")],
    )
    contents = body_of(req)["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}],
    }
    assert contents[2]["parts"] == [{"functionResponse": {"name": "get_weather", "response": {"content": "rain"}}}]
    assert contents[3]["parts"][1] == {"functionCall": {"name": "get_time", "args": {}}}
    assert contents[4]["parts"] == [{"functionResponse": {"name": "get_time", "response": {"content": "noon"}}}]


def test_tool_result_without_a_known_call_is_invalid() -> None:
    with pytest.raises(InvalidRequest):
        codec.encode_request(CanonicalRequest([user("x"), Message("tool", "r", tool_call_id="call_9")]), TARGET)


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        (ToolChoice("auto"), {"mode": "AUTO"}),
        (ToolChoice("none"), {"mode": "NONE"}),
        (ToolChoice("required"), {"mode": "ANY"}),
        (ToolChoice("function", "get_time"), {"mode": "ANY", "allowedFunctionNames": ["get_time"]}),
    ],
)
def test_tool_choice_becomes_a_function_calling_mode(choice: ToolChoice, config: dict[str, Any]) -> None:
    req = CanonicalRequest([user("x")], tools=[ToolDefinition("get_time")], tool_choice=choice)
    assert body_of(req)["toolConfig"] == {"functionCallingConfig": config}


def test_thinking_is_refused() -> None:
    with pytest.raises(UnsupportedParameter):
        codec.encode_request(CanonicalRequest([user("x")], thinking_budget=2048), TARGET)
    turn = Message("assistant", [ThinkingPart("hmm", "sig"), TextPart("ok")])
    with pytest.raises(UnsupportedParameter):
        codec.encode_request(CanonicalRequest([user("x"), turn, user("y")]), TARGET)


def test_top_k_is_carried_and_user_metadata_are_not() -> None:
    req = CanonicalRequest([user("x")], top_k=40, user="u1", metadata={"team": "a"}, extensions={"seed": 1})
    assert body_of(req) == {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"topK": 40}}


# Buffered responses.


def response(cand: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"candidates": [cand], "responseId": "resp-1", **extra})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("OTHER", "stop"),
        ("MALFORMED_FUNCTION_CALL", "stop"),
    ],
)
def test_finish_reasons(raw: str, reason: str) -> None:
    body = response({"content": {"parts": [{"text": "a"}], "role": "model"}, "finishReason": raw})
    assert codec.decode_response(200, body).finish_reason == reason


def test_stop_after_function_calls_is_tool_calls_with_synthesized_ids() -> None:
    parts = [{"functionCall": {"name": "f", "args": {"x": 1}}}, {"functionCall": {"name": "g"}}]
    resp = codec.decode_response(200, response({"content": {"parts": parts}, "finishReason": "STOP"}))
    assert resp.finish_reason == "tool_calls"
    assert resp.content is None
    assert resp.tool_calls == [ToolCall("call_resp-1_0", "f", '{"x":1}'), ToolCall("call_resp-1_1", "g", "{}")]


def test_usage_counts_thoughts_as_completion_and_cached_content_as_cache_reads() -> None:
    meta = {
        "promptTokenCount": 100,
        "candidatesTokenCount": 10,
        "thoughtsTokenCount": 5,
        "cachedContentTokenCount": 80,
        "toolUsePromptTokenCount": 3,
        "totalTokenCount": 118,
    }
    body = response({"content": {"parts": [{"text": "a"}]}, "finishReason": "STOP"}, usageMetadata=meta)
    usage = codec.decode_response(200, body).usage
    assert usage == Usage(prompt_tokens=103, completion_tokens=15, cached_prompt_tokens=80, reasoning_tokens=5)
    assert usage is not None and usage.total_tokens == meta["totalTokenCount"]


def test_blocked_prompt_is_a_safety_failure() -> None:
    body = orjson.dumps({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}})
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, body)
    assert info.value.category is C.SAFETY
    assert isinstance(info.value.to_gateway_error(), ContentFiltered)


def test_response_without_a_candidate_is_malformed() -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, b'{"usageMetadata": {}}')
    assert info.value.category is C.MALFORMED


# Errors.


@pytest.mark.parametrize(
    ("status", "name", "category"),
    [
        (400, "INVALID_ARGUMENT", C.INVALID_REQUEST),
        (400, "FAILED_PRECONDITION", C.PERMISSION),
        (403, "PERMISSION_DENIED", C.PERMISSION),
        (404, "NOT_FOUND", C.NOT_FOUND),
        (429, "RESOURCE_EXHAUSTED", C.RATE_LIMIT),
        (500, "INTERNAL", C.SERVER),
        (503, "UNAVAILABLE", C.OVERLOADED),
        (504, "DEADLINE_EXCEEDED", C.TIMEOUT),
    ],
)
def test_error_status_names_pick_the_category(status: int, name: str, category: UpstreamCategory) -> None:
    err = codec.decode_error(status, {}, error_body(status, name))
    assert (err.category, err.status, err.reported) == (category, status, True)


def test_invalid_api_key_is_an_authentication_failure() -> None:
    details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]
    body = error_body(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", details)
    assert codec.decode_error(400, {}, body).category is C.AUTHENTICATION


def test_retry_after_comes_from_the_header_else_from_retry_info() -> None:
    details = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]
    body = error_body(429, "RESOURCE_EXHAUSTED", "quota", details)
    assert codec.decode_error(429, {}, body).retry_after == 37.0
    assert codec.decode_error(429, {"Retry-After": "2"}, body).retry_after == 2.0


def test_context_overflow_reads_geminis_wording() -> None:
    message = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    err = codec.decode_error(400, {}, error_body(400, "INVALID_ARGUMENT", message))
    assert err.category is C.CONTEXT_LENGTH
    gateway = err.to_gateway_error()
    assert isinstance(gateway, ContextLengthExceeded)
    assert (
        gateway.message == "The request exceeds the model's context length (1200000 tokens requested, 1048576 allowed)."
    )


def test_unreadable_error_body_keeps_the_status_category() -> None:
    err = codec.decode_error(502, {}, b"<html>bad gateway</html>")
    assert err.category is C.SERVER
    assert "unrecognized error body" in err.detail


# Streams.


async def test_stream_text_deltas_then_finish_then_the_last_usage() -> None:
    events = await collect(
        chunk([{"text": "Hel"}], usageMetadata={"promptTokenCount": 4, "candidatesTokenCount": 1}),
        chunk([{"text": "thinking...", "thought": True}, {"text": "lo"}]),
        chunk([{"text": ""}], "STOP", usageMetadata={"promptTokenCount": 4, "candidatesTokenCount": 2}),
    )
    assert events == [
        StreamStart("r1"),
        TextDelta("Hel"),
        TextDelta("lo"),
        StreamFinish("stop"),
        StreamUsage(Usage(prompt_tokens=4, completion_tokens=2)),
    ]


async def test_stream_function_call_arrives_whole_as_opening_and_arguments_deltas() -> None:
    events = await collect(
        chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]),
        chunk([{"functionCall": {"name": "get_time", "id": "fc-7"}}], "STOP"),
    )
    assert events == [
        StreamStart("r1"),
        ToolCallDelta(0, id="call_r1_0", name="get_weather"),
        ToolCallDelta(0, arguments='{"city":"Oslo"}'),
        ToolCallDelta(1, id="fc-7", name="get_time"),
        ToolCallDelta(1, arguments="{}"),
        StreamFinish("tool_calls"),
    ]


async def test_stream_safety_stop_is_a_content_filter_finish() -> None:
    events = await collect(chunk([{"text": "Sure, "}]), chunk(None, "SAFETY"))
    assert events[-1] == StreamFinish("content_filter")


async def test_stream_blocked_prompt_fails_before_it_starts() -> None:
    blocked = SseEvent(None, '{"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}')
    with pytest.raises(UpstreamError) as info:
        await collect(blocked)
    assert info.value.category is C.SAFETY


async def test_stream_malformed_first_chunk_is_a_malformed_failure() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(SseEvent(None, "{not json"))
    assert info.value.category is C.MALFORMED


async def test_stream_malformed_later_chunk_is_skipped() -> None:
    events = await collect(chunk([{"text": "a"}]), SseEvent(None, "{not json"), chunk([{"text": "b"}], "STOP"))
    assert events == [StreamStart("r1"), TextDelta("a"), SKIPPED, TextDelta("b"), StreamFinish("stop")]


async def test_stream_function_call_without_a_name_is_malformed() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(chunk([{"text": "a"}]), chunk([{"functionCall": {"args": {}}}]))
    assert info.value.category is C.MALFORMED


async def test_stream_ending_before_a_finish_reason_is_truncated() -> None:
    with pytest.raises(UpstreamError) as info:
        await collect(chunk([{"text": "a"}]))
    assert info.value.category is C.TRUNCATED


async def test_stream_error_chunk_is_a_reported_error_of_its_status() -> None:
    error = SseEvent(None, error_body(429, "RESOURCE_EXHAUSTED", "quota").decode())
    with pytest.raises(UpstreamError) as info:
        await collect(chunk([{"text": "a"}]), error)
    assert (info.value.category, info.value.reported) == (C.RATE_LIMIT, True)
