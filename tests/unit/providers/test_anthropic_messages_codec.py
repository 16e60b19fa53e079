from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    SEMANTIC_EVENTS,
    SKIPPED,
    CacheControl,
    CanonicalRequest,
    ImagePart,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    ResponseFormat,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers import AnthropicMessagesCodec, ProviderFormat, Target
from tollway.wire import SseEvent

codec = AnthropicMessagesCodec()
TARGET = Target("claude-haiku-4-5-20251001", default_max_output_tokens=2048)
C = UpstreamCategory
WEATHER = ToolDefinition("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def body_of(req: CanonicalRequest) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(codec.encode_request(req, TARGET).body)
    return doc


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def ev(kind: str, **fields: Any) -> SseEvent:
    return SseEvent(kind, orjson.dumps({"type": kind, **fields}).decode())


def message_start(**usage: int) -> SseEvent:
    return ev(
        "message_start", message={"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": usage}
    )


def block_start(index: int, block: dict[str, Any]) -> SseEvent:
    return ev("content_block_start", index=index, content_block=block)


def block_delta(index: int, delta: dict[str, Any]) -> SseEvent:
    return ev("content_block_delta", index=index, delta=delta)


def message_delta(stop: str | None, **usage: int) -> SseEvent:
    return ev("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage=usage)


STOP = ev("message_stop")


async def feed(*frames: SseEvent) -> AsyncIterator[SseEvent]:
    for frame in frames:
        yield frame


async def collect(*frames: SseEvent) -> list[StreamEvent]:
    return [event async for event in codec.decode_stream(feed(*frames))]


async def failure(*frames: SseEvent) -> tuple[list[StreamEvent], UpstreamError]:
    """The events decoded before the stream failed, and the failure."""
    seen: list[StreamEvent] = []
    with pytest.raises(UpstreamError) as info:
        async for event in codec.decode_stream(feed(*frames)):
            seen.append(event)
    return seen, info.value


# encode_request


def test_encode_targets_v1_messages_with_version_header_and_default_max_tokens() -> None:
    upstream = codec.encode_request(CanonicalRequest([Message("user", "hi")], stream=True), TARGET)
    assert codec.format is ProviderFormat.ANTHROPIC_MESSAGES
    assert upstream.path == "v1/messages"
    assert dict(upstream.headers) == {"anthropic-version": "2023-06-01", "content-type": "application/json"}
    assert upstream.stream is True
    assert orjson.loads(upstream.body) == {
        "model": "claude-haiku-4-5-20251001",
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": [text("hi")]}],
        "stream": True,
    }


def test_client_max_output_tokens_wins_over_the_target_default() -> None:
    assert body_of(CanonicalRequest([Message("user", "hi")], max_output_tokens=5))["max_tokens"] == 5


def test_consecutive_same_role_messages_merge_so_roles_alternate() -> None:
    req = CanonicalRequest(
        [
            Message("user", "a"),
            Message("system", "be brief"),
            Message("user", [TextPart("b"), TextPart("")]),
            Message("assistant", "c"),
            Message("assistant", None, tool_calls=[ToolCall("t1", "get_weather", '{"city":"Oslo"}')]),
            Message("tool", "sunny", tool_call_id="t1"),
            Message("user", "thanks"),
            Message("developer", "use metric"),
        ]
    )
    doc = body_of(req)
    assert doc["system"] == "be brief\n\nuse metric"
    assert doc["messages"] == [
        {"role": "user", "content": [text("a"), text("b")]},
        {
            "role": "assistant",
            "content": [text("c"), {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}, text("thanks")],
        },
    ]


def test_consecutive_tool_results_merge_into_one_user_turn() -> None:
    calls = [ToolCall("t1", "f", "{}"), ToolCall("t2", "f", '{"a": [1, 2]}')]
    req = CanonicalRequest(
        [
            Message("user", "go"),
            Message("assistant", "", tool_calls=calls),
            Message("tool", "one", tool_call_id="t1"),
            Message("tool", [TextPart("two"), ImagePart("https://x.example/chart.png")], tool_call_id="t2"),
        ]
    )
    messages = body_of(req)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][1]["input"] == {"a": [1, 2]}
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
        {
            "type": "tool_result",
            "tool_use_id": "t2",
            "content": [
                text("two"),
                {"type": "image", "source": {"type": "url", "url": "https://x.example/chart.png"}},
            ],
        },
    ]


@pytest.mark.parametrize("arguments", ["not json", "[1, 2]", '"a string"', "42", '{"unterminated": '])
def test_tool_arguments_that_are_not_a_json_object_are_rejected(arguments: str) -> None:
    req = CanonicalRequest(
        [Message("user", "q"), Message("assistant", None, tool_calls=[ToolCall("t9", "f", arguments)])]
    )
    with pytest.raises(InvalidRequest) as info:
        codec.encode_request(req, TARGET)
    assert "'t9'" in info.value.message
    assert "JSON object" in info.value.message


def test_empty_tool_arguments_mean_no_arguments() -> None:
    req = CanonicalRequest([Message("user", "q"), Message("assistant", None, tool_calls=[ToolCall("t", "now", " ")])])
    assert body_of(req)["messages"][1]["content"] == [{"type": "tool_use", "id": "t", "name": "now", "input": {}}]


def test_a_tool_message_without_a_call_id_is_rejected() -> None:
    with pytest.raises(InvalidRequest):
        codec.encode_request(CanonicalRequest([Message("tool", "orphan")]), TARGET)


@pytest.mark.parametrize(
    "url", ["ftp://x.example/a.png", "data:image/png,rawbytes", "data:;base64,AAAA", "data:image/png;base64"]
)
def test_unusable_image_urls_are_rejected(url: str) -> None:
    with pytest.raises(InvalidRequest):
        codec.encode_request(CanonicalRequest([Message("user", [ImagePart(url)])]), TARGET)


def test_data_url_parameters_before_base64_are_tolerated() -> None:
    req = CanonicalRequest([Message("user", [ImagePart("data:image/jpeg;name=a.jpg;base64,/9j/4AAQ", "high")])])
    block = body_of(req)["messages"][0]["content"][0]
    assert block == {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}}


@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
def test_json_response_formats_are_unsupported(kind: Any) -> None:
    req = CanonicalRequest([Message("user", "q")], response_format=ResponseFormat(kind, {"name": "x", "schema": {}}))
    with pytest.raises(UnsupportedParameter) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == "response_format"


def test_text_response_format_and_extensions_are_not_sent() -> None:
    req = CanonicalRequest(
        [Message("user", "q")], response_format=ResponseFormat("text"), metadata={"team": "a"}, extensions={"seed": 1}
    )
    assert set(body_of(req)) == {"model", "max_tokens", "messages"}


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        (None, True, None),
        (ToolChoice("auto"), None, {"type": "auto"}),
        (ToolChoice("required"), None, {"type": "any"}),
        (
            ToolChoice("function", "get_weather"),
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        (ToolChoice("none"), False, {"type": "none"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)
def test_tool_choice_mapping(choice: ToolChoice | None, parallel: bool | None, expected: dict[str, Any] | None) -> None:
    doc = body_of(
        CanonicalRequest([Message("user", "q")], tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel)
    )
    assert doc.get("tool_choice") == expected
    assert doc["tools"] == [{"name": "get_weather", "input_schema": WEATHER.parameters}]


def test_tool_choice_is_dropped_when_no_tools_are_offered() -> None:
    doc = body_of(CanonicalRequest([Message("user", "q")], tool_choice=ToolChoice("auto"), parallel_tool_calls=False))
    assert "tool_choice" not in doc
    assert "tools" not in doc


def test_tool_choice_function_needs_a_name() -> None:
    with pytest.raises(InvalidRequest):
        codec.encode_request(
            CanonicalRequest([Message("user", "q")], tools=[WEATHER], tool_choice=ToolChoice("function")), TARGET
        )


# decode_response


def anthropic_message(content: list[dict[str, Any]], stop: Any = "end_turn", **extra: Any) -> bytes:
    doc = {"id": "msg_9", "type": "message", "role": "assistant", "content": content, "stop_reason": stop, **extra}
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("model_context_window_exceeded", "length"),
        ("a_future_reason", "stop"),
        (None, "stop"),
    ],
)
def test_stop_reasons_map_to_canonical(stop: Any, expected: str) -> None:
    assert codec.decode_response(200, anthropic_message([text("x")], stop)).finish_reason == expected


def test_usage_counts_cached_tokens_in_the_prompt() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 50, "output_tokens": 7}
    resp = codec.decode_response(200, anthropic_message([text("x")], usage=usage))
    assert resp.usage == Usage(
        prompt_tokens=360, completion_tokens=7, cached_prompt_tokens=300, cache_creation_tokens=50
    )


def test_only_tool_use_gives_no_content_and_empty_turn_gives_empty_text() -> None:
    tool_only = anthropic_message([{"type": "tool_use", "id": "t", "name": "f", "input": {"k": "é"}}], "tool_use")
    resp = codec.decode_response(200, tool_only)
    assert (resp.content, resp.tool_calls) == (None, [ToolCall("t", "f", '{"k":"é"}')])
    assert codec.decode_response(200, anthropic_message([])).content == ""


@pytest.mark.parametrize(
    "body",
    [
        b"upstream connect error",
        b'{"type": "message"}',
        b'{"content": "text"}',
        b'{"content": [{"type": "text"}]}',
        b'{"content": [{"type": "tool_use", "name": "f", "input": {}}]}',
    ],
)
def test_malformed_responses_are_malformed_upstream_errors(body: bytes) -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, body)
    assert info.value.category is C.MALFORMED


# decode_stream


async def test_tool_ordinals_count_tool_blocks_only() -> None:
    events = await collect(
        message_start(input_tokens=5, output_tokens=1),
        block_start(0, {"type": "text", "text": "Let me"}),
        block_delta(0, {"type": "text_delta", "text": " look."}),
        block_start(1, {"type": "tool_use", "id": "tu_a", "name": "f", "input": {}}),
        block_delta(1, {"type": "input_json_delta", "partial_json": ""}),
        block_delta(1, {"type": "input_json_delta", "partial_json": '{"a":1}'}),
        ev("content_block_stop", index=1),
        block_start(2, {"type": "text", "text": ""}),
        block_delta(2, {"type": "text_delta", "text": "and"}),
        block_start(3, {"type": "tool_use", "id": "tu_b", "name": "g", "input": {}}),
        block_delta(3, {"type": "input_json_delta", "partial_json": '{"b":'}),
        block_delta(3, {"type": "input_json_delta", "partial_json": "2}"}),
        ev("content_block_stop", index=3),
        message_delta("tool_use", output_tokens=40),
        STOP,
    )
    assert events == [
        StreamStart("msg_1"),
        TextDelta("Let me"),
        TextDelta(" look."),
        ToolCallDelta(0, "tu_a", "f", ""),
        ToolCallDelta(0, arguments='{"a":1}'),
        TextDelta("and"),
        ToolCallDelta(1, "tu_b", "g", ""),
        ToolCallDelta(1, arguments='{"b":'),
        ToolCallDelta(1, arguments="2}"),
        StreamFinish("tool_calls"),
        StreamUsage(Usage(prompt_tokens=5, completion_tokens=40)),
    ]


async def test_a_tool_call_without_argument_fragments_gets_an_empty_object() -> None:
    events = await collect(
        message_start(input_tokens=1),
        block_start(0, {"type": "tool_use", "id": "tu", "name": "now", "input": {}}),
        block_delta(0, {"type": "input_json_delta", "partial_json": ""}),
        ev("content_block_stop", index=0),
        STOP,
    )
    assert events[1:3] == [ToolCallDelta(0, "tu", "now", ""), ToolCallDelta(0, arguments="{}")]


async def test_cumulative_message_delta_usage_replaces_earlier_counts() -> None:
    events = await collect(
        message_start(input_tokens=10, cache_read_input_tokens=90, output_tokens=1),
        ev("ping"),
        ev("a_future_event", payload=1),
        block_delta(0, {"type": "thinking_delta", "thinking": "hmm"}),
        message_delta("end_turn", input_tokens=12, cache_read_input_tokens=90, output_tokens=30),
        STOP,
    )
    assert events == [
        StreamStart("msg_1"),
        StreamFinish("stop"),
        StreamUsage(Usage(prompt_tokens=102, completion_tokens=30, cached_prompt_tokens=90)),
    ]


async def test_no_usage_reported_means_no_usage_event() -> None:
    events = await collect(ev("message_start", message={"id": "m"}), message_delta("end_turn"), STOP)
    assert events == [StreamStart("m"), StreamFinish("stop")]


async def test_events_after_message_stop_are_not_read() -> None:
    events = await collect(message_start(), STOP, SseEvent(None, "not json"))
    assert events == [StreamStart("msg_1")]


@pytest.mark.parametrize(
    ("error", "category"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, C.OVERLOADED),
        ({"type": "api_error", "message": "Internal server error"}, C.SERVER),
        (
            {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your rate limit"},
            C.RATE_LIMIT,
        ),
        (
            {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"},
            C.CONTEXT_LENGTH,
        ),
        ({"type": "invalid_request_error", "message": "messages: roles must alternate"}, C.INVALID_REQUEST),
        ({"type": "something_new", "message": "?"}, C.SERVER),
    ],
)
async def test_midstream_error_event_raises_by_category(error: dict[str, Any], category: UpstreamCategory) -> None:
    seen, exc = await failure(
        message_start(input_tokens=3),
        block_start(0, {"type": "text", "text": ""}),
        block_delta(0, {"type": "text_delta", "text": "par"}),
        ev("error", error=error),
    )
    assert seen == [StreamStart("msg_1"), TextDelta("par")]
    assert exc.category is category
    assert error["type"] in exc.detail


async def test_an_error_as_the_first_event_raises_before_the_stream_starts() -> None:
    seen, exc = await failure(ev("error", error={"type": "overloaded_error", "message": "Overloaded"}))
    assert (seen, exc.category) == ([], C.OVERLOADED)


async def test_a_stream_that_ends_after_its_stop_reason_without_message_stop_is_complete() -> None:
    seen = await collect(
        message_start(input_tokens=7),
        block_start(0, {"type": "text", "text": "hi"}),
        message_delta("end_turn", output_tokens=2),
    )
    assert seen == [
        StreamStart("msg_1"),
        TextDelta("hi"),
        StreamFinish("stop"),
        StreamUsage(Usage(prompt_tokens=7, completion_tokens=2)),
    ]


async def test_a_stream_cut_before_its_stop_reason_is_truncated() -> None:
    seen, exc = await failure(message_start(), block_start(0, {"type": "text", "text": "hi"}))
    assert seen == [StreamStart("msg_1"), TextDelta("hi")]
    assert exc.category is C.TRUNCATED


async def test_an_undecodable_event_after_a_good_one_is_reported_as_skipped() -> None:
    seen = await collect(
        message_start(),
        SseEvent("content_block_delta", '{"type": "content_block_delta", "ind'),
        block_start(0, {"type": "text", "text": "hi"}),
        message_delta("end_turn"),
        STOP,
    )
    assert seen[:3] == [StreamStart("msg_1"), SKIPPED, TextDelta("hi")]


async def test_an_undecodable_first_event_is_malformed() -> None:
    _, exc = await failure(SseEvent("message_start", "{not json"), STOP)
    assert exc.category is C.MALFORMED


def test_a_content_filtering_refusal_is_a_safety_failure() -> None:
    body = anthropic_error("invalid_request_error", "Output blocked by content filtering policy")
    err = codec.decode_error(400, {}, body)
    assert err.category is C.SAFETY
    assert err.to_gateway_error().code == "content_filter"


def test_a_prompt_too_long_refusal_carries_its_numbers() -> None:
    body = anthropic_error("invalid_request_error", "prompt is too long: 210345 tokens > 200000 maximum")
    err = codec.decode_error(400, {}, body)
    assert err.reason == "The request exceeds the model's context length (210345 tokens requested, 200000 allowed)."


async def test_tool_use_start_without_id_is_malformed() -> None:
    _, exc = await failure(message_start(), block_start(0, {"type": "tool_use", "name": "f"}))
    assert exc.category is C.MALFORMED


# decode_error


def anthropic_error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011"})


@pytest.mark.parametrize(
    ("status", "body", "category"),
    [
        (400, anthropic_error("invalid_request_error", "max_tokens: Field required"), C.INVALID_REQUEST),
        (
            400,
            anthropic_error("invalid_request_error", "prompt is too long: 201234 tokens > 200000 maximum"),
            C.CONTEXT_LENGTH,
        ),
        (
            400,
            anthropic_error(
                "invalid_request_error", "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000"
            ),
            C.CONTEXT_LENGTH,
        ),
        (401, anthropic_error("authentication_error", "invalid x-api-key"), C.AUTHENTICATION),
        (403, anthropic_error("permission_error", "Your API key does not have permission"), C.PERMISSION),
        (404, anthropic_error("not_found_error", "model: claude-9"), C.NOT_FOUND),
        (
            413,
            anthropic_error("request_too_large", "Request exceeds the maximum allowed number of bytes."),
            C.INVALID_REQUEST,
        ),
        (429, anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit"), C.RATE_LIMIT),
        (500, anthropic_error("api_error", "Internal server error"), C.SERVER),
        (500, anthropic_error("overloaded_error", "Overloaded"), C.OVERLOADED),
        (503, b"upstream connect error or disconnect/reset before headers", C.OVERLOADED),
        (529, anthropic_error("overloaded_error", "Overloaded"), C.OVERLOADED),
    ],
)
def test_errors_are_classified_by_status_and_body(status: int, body: bytes, category: UpstreamCategory) -> None:
    err = codec.decode_error(status, {"content-type": "application/json"}, body)
    assert (err.category, err.status) == (category, status)


def test_error_carries_retry_after_and_a_short_detail() -> None:
    body = anthropic_error("rate_limit_error", "This request would exceed your rate limit. " * 20)
    err = codec.decode_error(429, {"retry-after": "12"}, body)
    assert err.retry_after == 12.0
    assert err.detail.startswith("rate_limit_error: This request would exceed")
    assert len(err.detail) <= 240
    assert "req_011" not in err.detail


# Prompt caching, extended thinking and betas.

CACHED = CacheControl()


def test_cache_breakpoints_are_written_exactly_where_the_client_put_them() -> None:
    req = CanonicalRequest(
        [
            Message("system", [TextPart("Policy.", CACHED), TextPart("Today.")]),
            Message("user", [TextPart("weather?"), ImagePart("https://x.example/a.png", cache_control=CACHED)]),
            Message("assistant", "Checking.", tool_calls=[ToolCall("t1", "get_weather", "{}", CacheControl("1h"))]),
            Message("tool", "sunny", tool_call_id="t1", cache_control=CACHED),
            Message("tool", [TextPart("21 C", CACHED)], tool_call_id="t2"),
        ],
        tools=[ToolDefinition("get_weather", parameters={"type": "object"}, cache_control=CACHED)],
    )
    doc = body_of(req)
    ephemeral = {"type": "ephemeral"}
    assert doc["system"] == [{**text("Policy."), "cache_control": ephemeral}, text("Today.")]
    assert doc["tools"] == [{"name": "get_weather", "input_schema": {"type": "object"}, "cache_control": ephemeral}]
    assert doc["messages"] == [
        {
            "role": "user",
            "content": [
                text("weather?"),
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://x.example/a.png"},
                    "cache_control": ephemeral,
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                text("Checking."),
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "get_weather",
                    "input": {},
                    "cache_control": {"type": "ephemeral", "ttl": "1h"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "cache_control": ephemeral},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{**text("21 C"), "cache_control": ephemeral}]},
            ],
        },
    ]


def test_system_stays_one_string_without_breakpoints() -> None:
    req = CanonicalRequest(
        [Message("system", [TextPart("a"), TextPart("b")]), Message("developer", "c"), Message("user", "q")]
    )
    assert body_of(req)["system"] == "ab\n\nc"


def test_every_system_message_becomes_blocks_when_one_part_is_cached() -> None:
    req = CanonicalRequest(
        [Message("system", "Be brief."), Message("developer", [TextPart("Policy.", CACHED)]), Message("user", "q")]
    )
    assert body_of(req)["system"] == [text("Be brief."), {**text("Policy."), "cache_control": {"type": "ephemeral"}}]


def test_thinking_and_its_blocks_are_sent_unchanged() -> None:
    req = CanonicalRequest(
        [
            Message("user", "weather?"),
            Message(
                "assistant",
                [ThinkingPart("Call the tool.", "sig-1"), RedactedThinkingPart("opaque"), TextPart("Checking.")],
                tool_calls=[ToolCall("t1", "get_weather", "{}")],
            ),
            Message("tool", "sunny", tool_call_id="t1"),
        ],
        max_output_tokens=4096,
        thinking_budget=2048,
    )
    doc = body_of(req)
    assert doc["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert doc["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Call the tool.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        text("Checking."),
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
    ]
    assert "thinking" not in body_of(CanonicalRequest([Message("user", "q")]))


def test_betas_go_upstream_in_the_anthropic_beta_header() -> None:
    req = CanonicalRequest(
        [Message("user", "q")], anthropic_beta=("context-1m-2025-08-07", "prompt-caching-2024-07-31")
    )
    headers = codec.encode_request(req, TARGET).headers
    assert dict(headers) == {
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "anthropic-beta": "context-1m-2025-08-07,prompt-caching-2024-07-31",
    }


def test_thinking_blocks_decode_whole_before_text_and_calls() -> None:
    body = anthropic_message(
        [
            {"type": "thinking", "thinking": "Paris first.", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            text("Checking."),
            {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        ],
        "tool_use",
        usage={"input_tokens": 3, "cache_creation_input_tokens": 500, "output_tokens": 90},
    )
    resp = codec.decode_response(200, body)
    assert resp.thinking == [ThinkingPart("Paris first.", "sig-1"), RedactedThinkingPart("opaque")]
    assert resp.content == "Checking." and resp.tool_calls == [ToolCall("t", "f", "{}")]
    assert resp.usage == Usage(prompt_tokens=503, completion_tokens=90, cache_creation_tokens=500)


@pytest.mark.parametrize(
    "block",
    [{"type": "thinking", "thinking": "t"}, {"type": "thinking", "signature": "s"}, {"type": "redacted_thinking"}],
)
def test_a_thinking_block_missing_a_field_is_malformed(block: dict[str, Any]) -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, anthropic_message([block]))
    assert info.value.category is C.MALFORMED


async def test_a_thinking_stream_decodes_to_thinking_deltas_that_commit_it() -> None:
    events = await collect(
        message_start(input_tokens=4, cache_read_input_tokens=400, cache_creation_input_tokens=60, output_tokens=2),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        block_delta(0, {"type": "thinking_delta", "thinking": "Two cities; "}),
        block_delta(0, {"type": "thinking_delta", "thinking": "call twice."}),
        block_delta(0, {"type": "signature_delta", "signature": "EqQBCgIY"}),
        ev("content_block_stop", index=0),
        block_start(1, {"type": "redacted_thinking", "data": "opaque"}),
        ev("content_block_stop", index=1),
        block_start(2, {"type": "text", "text": ""}),
        block_delta(2, {"type": "text_delta", "text": "Okay."}),
        block_start(3, {"type": "tool_use", "id": "tu", "name": "f", "input": {}}),
        block_delta(3, {"type": "input_json_delta", "partial_json": "{}"}),
        message_delta("tool_use", output_tokens=89),
        STOP,
    )
    assert events == [
        StreamStart("msg_1"),
        ThinkingDelta(0),
        ThinkingDelta(0, thinking="Two cities; "),
        ThinkingDelta(0, thinking="call twice."),
        ThinkingDelta(0, signature="EqQBCgIY"),
        RedactedThinking(1, "opaque"),
        TextDelta("Okay."),
        ToolCallDelta(0, "tu", "f", ""),
        ToolCallDelta(0, arguments="{}"),
        StreamFinish("tool_calls"),
        StreamUsage(Usage(prompt_tokens=464, completion_tokens=89, cached_prompt_tokens=400, cache_creation_tokens=60)),
    ]
    first_semantic = next(e for e in events if isinstance(e, SEMANTIC_EVENTS))
    assert first_semantic == ThinkingDelta(0), "a thinking block commits the stream: it reaches the client"


async def test_a_thinking_block_start_without_a_signature_key_opens_empty() -> None:
    events = await collect(message_start(), block_start(0, {"type": "thinking", "thinking": "hm"}), STOP)
    assert events[1:] == [ThinkingDelta(0, thinking="hm")]
