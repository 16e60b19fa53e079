from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    SKIPPED,
    CacheControl,
    CanonicalRequest,
    ImagePart,
    Message,
    RedactedThinkingPart,
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
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers import OpenAIChatCodec, ProviderFormat, Target
from tollway.routing.retry import RetryPolicy
from tollway.wire import SseEvent

codec = OpenAIChatCodec()
TARGET = Target("gpt-4o-mini-2024-07-18")
C = UpstreamCategory


def request(**kwargs: Any) -> CanonicalRequest:
    return CanonicalRequest(messages=[Message("user", "hi")], **kwargs)


def body_of(req: CanonicalRequest) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(codec.encode_request(req, TARGET).body)
    return doc


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> SseEvent:
    doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], **extra}
    if delta is not None or finish is not None:
        doc["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return SseEvent(None, orjson.dumps(doc).decode())


DONE = SseEvent(None, "[DONE]")


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


def test_encode_targets_chat_completions_with_the_physical_model_and_no_credentials() -> None:
    upstream = codec.encode_request(request(), TARGET)
    assert codec.format is ProviderFormat.OPENAI_CHAT
    assert upstream.path == "chat/completions"
    assert dict(upstream.headers) == {"content-type": "application/json"}
    assert upstream.stream is False
    assert orjson.loads(upstream.body) == {
        "model": "gpt-4o-mini-2024-07-18",
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_streaming_always_asks_for_usage() -> None:
    upstream = codec.encode_request(request(stream=True, include_usage=False), TARGET)
    assert upstream.stream is True
    doc = orjson.loads(upstream.body)
    assert (doc["stream"], doc["stream_options"]) == (True, {"include_usage": True})


def test_extensions_pass_through_but_never_override_what_the_codec_sets() -> None:
    doc = body_of(
        request(
            temperature=0.1,
            extensions={"seed": 7, "temperature": 1.9, "model": "x", "messages": [], "stream": True, "logprobs": True},
        )
    )
    assert doc["model"] == TARGET.model
    assert doc["messages"] == [{"role": "user", "content": "hi"}]
    assert (doc["seed"], doc["logprobs"], doc["temperature"]) == (7, True, 0.1)
    assert "stream" not in doc


def test_assistant_tool_calls_keep_their_arguments_verbatim() -> None:
    arguments = '{"q":  "naïve",\n "n": 1.0}'
    req = CanonicalRequest(
        messages=[
            Message("assistant", None, tool_calls=[ToolCall("call_1", "search", arguments)]),
            Message("tool", "result", tool_call_id="call_1"),
        ]
    )
    messages = body_of(req)["messages"]
    assert messages[0] == {
        "role": "assistant",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": arguments}}],
    }
    assert messages[1] == {"role": "tool", "content": "result", "tool_call_id": "call_1"}


def test_tool_choice_function_needs_a_name() -> None:
    with pytest.raises(InvalidRequest) as info:
        codec.encode_request(request(tool_choice=ToolChoice("function")), TARGET)
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize("kind", ["text", "json_object"])
def test_simple_response_formats_are_forwarded(kind: Any) -> None:
    assert body_of(request(response_format=ResponseFormat(kind)))["response_format"] == {"type": kind}


def test_json_schema_response_format_needs_a_schema() -> None:
    with pytest.raises(InvalidRequest) as info:
        codec.encode_request(request(response_format=ResponseFormat("json_schema")), TARGET)
    assert info.value.param == "response_format"


# decode_response


def completion(message: dict[str, Any], finish: Any = "stop", **extra: Any) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return orjson.dumps({"id": "chatcmpl-9", "object": "chat.completion", "choices": [choice], **extra})


def test_tool_call_arguments_survive_decoding_byte_for_byte() -> None:
    arguments = '{ "city" :"T\\u014dky\\u014d", "days":1.50, "tags":[ ] }'
    body = completion(
        {
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
        },
        finish="tool_calls",
    )
    resp = codec.decode_response(200, body)
    assert resp.tool_calls == [ToolCall("c1", "f", arguments)]
    assert resp.content is None
    assert resp.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("finish", "has_tools", "expected"),
    [
        ("stop", False, "stop"),
        ("length", False, "length"),
        ("content_filter", False, "content_filter"),
        ("function_call", True, "tool_calls"),
        ("something_new", False, "stop"),
        (None, False, "stop"),
        (None, True, "tool_calls"),
    ],
)
def test_finish_reasons_map_to_canonical(finish: Any, has_tools: bool, expected: str) -> None:
    message: dict[str, Any] = {"content": "x"}
    if has_tools:
        message["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert codec.decode_response(200, completion(message, finish)).finish_reason == expected


def test_usage_details_are_read_and_missing_usage_stays_unknown() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    resp = codec.decode_response(200, completion({"content": "x"}, usage=usage))
    assert resp.usage == Usage(prompt_tokens=100, completion_tokens=20, cached_prompt_tokens=64, reasoning_tokens=12)
    assert codec.decode_response(200, completion({"content": "x"})).usage is None
    nulls = {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": None}
    assert codec.decode_response(200, completion({"content": "x"}, usage=nulls)).usage == Usage(3, 4)


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 Bad Gateway</html>",
        b"",
        b"[1, 2]",
        b'{"id": "x"}',
        b'{"choices": []}',
        b'{"choices": [{"index": 0}]}',
        b'{"choices": [{"message": {"content": 5}}]}',
        b'{"choices": [{"message": {"content": null, "tool_calls": [{"id": "c"}]}}]}',
        b'{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}]}}]}',
    ],
)
def test_malformed_bodies_are_malformed_upstream_errors(body: bytes) -> None:
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, body)
    assert info.value.category is C.MALFORMED
    assert info.value.status == 200
    assert RetryPolicy().retryable(info.value)


def test_malformed_detail_never_quotes_the_body() -> None:
    body = b'{"choices": "' + b"secret-prompt-text " * 100 + b'"}'
    with pytest.raises(UpstreamError) as info:
        codec.decode_response(200, body)
    assert "secret-prompt-text" not in info.value.detail
    assert len(info.value.detail) <= 200


# decode_stream


async def test_stream_yields_start_text_finish_usage_and_skips_empty_deltas() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    events = await collect(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": None}),
        chunk({"content": "lo"}),
        chunk({}, finish="stop"),
        chunk(usage=usage),
        DONE,
    )
    assert events == [
        StreamStart("chatcmpl-1"),
        TextDelta("Hel"),
        TextDelta("lo"),
        StreamFinish("stop"),
        StreamUsage(Usage(9, 2)),
    ]


async def test_stream_stops_at_done_and_ignores_what_follows() -> None:
    events = await collect(chunk({"content": "a"}), DONE, chunk({"content": "after"}))
    assert events == [StreamStart("chatcmpl-1"), TextDelta("a")]


async def test_stream_with_only_done_still_starts() -> None:
    assert await collect(DONE) == [StreamStart()]


async def test_stream_tool_call_deltas_keep_index_id_and_fragments() -> None:
    first = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": ""}}
    events = await collect(
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": " 1}"}}]}),
        chunk({}, finish="tool_calls"),
        DONE,
    )
    assert events[1:] == [
        ToolCallDelta(1, "call_b", "g", ""),
        ToolCallDelta(1, arguments='{"x":'),
        ToolCallDelta(1, arguments=" 1}"),
        StreamFinish("tool_calls"),
    ]


async def test_only_the_first_choice_of_a_multi_choice_stream_is_decoded() -> None:
    other = SseEvent(None, '{"id": "c", "choices": [{"index": 1, "delta": {"content": "B"}, "finish_reason": null}]}')
    both = SseEvent(
        None,
        '{"id": "c", "choices": [{"index": 1, "delta": {"content": "B"}}, {"index": 0, "delta": {"content": "A"}}]}',
    )
    assert await collect(other, both, DONE) == [StreamStart("c"), TextDelta("A")]


async def test_stream_tool_call_delta_without_index_is_malformed() -> None:
    _, error = await failure(chunk({"tool_calls": [{"id": "c", "function": {"name": "f"}}]}), DONE)
    assert error.category is C.MALFORMED


async def test_azure_style_leading_chunk_without_choices_or_id_starts_the_stream() -> None:
    azure_first = SseEvent(None, '{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[]}')
    events = await collect(azure_first, chunk({"content": "ok"}), DONE)
    assert events == [StreamStart(None), TextDelta("ok")]


@pytest.mark.parametrize(
    ("error", "category"),
    [
        ({"message": "The server had an error", "type": "server_error", "code": None}, C.SERVER),
        ({"message": "Rate limit reached", "type": "tokens", "code": "rate_limit_exceeded"}, C.RATE_LIMIT),
        ({"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}, C.CONTEXT_LENGTH),
        ({"message": "filtered", "type": "invalid_request_error", "code": "content_filter"}, C.SAFETY),
        ({"message": "Service Unavailable", "code": 503}, C.OVERLOADED),
        ({"message": "something odd"}, C.SERVER),
    ],
)
async def test_midstream_error_chunk_raises_by_category(error: dict[str, Any], category: UpstreamCategory) -> None:
    seen, exc = await failure(chunk({"content": "partial"}), SseEvent(None, orjson.dumps({"error": error}).decode()))
    assert seen == [StreamStart("chatcmpl-1"), TextDelta("partial")]
    assert exc.category is category
    assert exc.detail.startswith("stream error")


async def test_an_error_as_the_first_event_raises_before_the_stream_starts() -> None:
    seen, exc = await failure(SseEvent("error", '{"error": {"message": "Overloaded", "type": "overloaded_error"}}'))
    assert seen == []
    assert exc.category is C.OVERLOADED


async def test_a_stream_that_ends_after_its_finish_without_done_is_complete() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    seen = await collect(chunk({"content": "done"}), chunk({}, finish="stop"), chunk(usage=usage))
    assert seen[-2:] == [StreamFinish("stop"), StreamUsage(Usage(prompt_tokens=3, completion_tokens=1))]


async def test_a_stream_cut_before_its_finish_is_truncated() -> None:
    seen, exc = await failure(chunk({"content": "cut"}))
    assert seen[-1] == TextDelta("cut")
    assert exc.category is C.TRUNCATED
    assert not exc.reported


async def test_an_undecodable_event_after_a_good_one_is_reported_as_skipped() -> None:
    seen = await collect(
        chunk({"content": "a"}), SseEvent(None, '{"choices": [{"delta": '), chunk({"content": "b"}), DONE
    )
    assert seen[1:] == [TextDelta("a"), SKIPPED, TextDelta("b")]


async def test_an_undecodable_first_event_is_malformed() -> None:
    _, exc = await failure(SseEvent(None, "{not json"), chunk({"content": "a"}), DONE)
    assert exc.category is C.MALFORMED


async def test_a_stream_error_event_is_reported_by_the_provider() -> None:
    _, exc = await failure(
        chunk({"content": "a"}), SseEvent(None, '{"error": {"type": "server_error", "message": "x"}}')
    )
    assert exc.category is C.SERVER and exc.reported


# decode_error


def openai_error(message: str, kind: str | None = "invalid_request_error", code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


@pytest.mark.parametrize(
    ("status", "body", "category"),
    [
        (400, openai_error("Invalid 'messages[0].role'"), C.INVALID_REQUEST),
        (
            400,
            openai_error("This model's maximum context length is 128000 tokens.", code="context_length_exceeded"),
            C.CONTEXT_LENGTH,
        ),
        (
            400,
            openai_error("This model's maximum context length is 4096 tokens. However, you requested 5000", None),
            C.CONTEXT_LENGTH,
        ),
        (400, openai_error("The response was filtered", code="content_filter"), C.SAFETY),
        (422, openai_error("unprocessable"), C.INVALID_REQUEST),
        (401, openai_error("Incorrect API key provided", code="invalid_api_key"), C.AUTHENTICATION),
        (
            403,
            openai_error("Country, region, or territory not supported", code="unsupported_country_region_territory"),
            C.PERMISSION,
        ),
        (404, openai_error("The model `gpt-9` does not exist", code="model_not_found"), C.NOT_FOUND),
        (408, b"", C.TIMEOUT),
        (409, openai_error("conflict"), C.INVALID_REQUEST),
        (413, b"request entity too large", C.INVALID_REQUEST),
        (429, openai_error("Rate limit reached for gpt-4o", "tokens", "rate_limit_exceeded"), C.RATE_LIMIT),
        (500, openai_error("The server had an error", "server_error"), C.SERVER),
        (502, b"<html><body>Bad gateway</body></html>", C.SERVER),
        (503, openai_error("The engine is currently overloaded", "server_error"), C.OVERLOADED),
        (504, b"", C.SERVER),
        (529, b"", C.OVERLOADED),
    ],
)
def test_errors_are_classified_by_status_and_body(status: int, body: bytes, category: UpstreamCategory) -> None:
    err = codec.decode_error(status, {}, body)
    assert (err.category, err.status) == (category, status)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"Retry-After": "2.5"}, 2.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"Retry-After-Ms": "250"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_delta_seconds_and_milliseconds(
    headers: dict[str, str], expected: float | None
) -> None:
    assert codec.decode_error(429, headers, openai_error("slow down", "requests")).retry_after == expected


def test_flat_error_bodies_of_compatible_servers_are_understood() -> None:
    vllm = orjson.dumps(
        {
            "object": "error",
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    )
    err = codec.decode_error(400, {}, vllm)
    assert err.category is C.CONTEXT_LENGTH
    assert err.detail.startswith("BadRequestError/400: This model's maximum context length")
    assert codec.decode_error(400, {}, b'{"error": "bad model name"}').detail == "error: bad model name"
    assert codec.decode_error(422, {}, b'{"detail": [{"loc": ["body"]}]}').detail.startswith(
        'unrecognized error body: {"detail"'
    )


def test_error_detail_is_short_and_masks_credentials() -> None:
    message = "Incorrect API key provided: sk-proj-AbCdEfGhIjKlMnOpQrStUvWx. " + "You can find your key " * 40
    err = codec.decode_error(401, {}, openai_error(message, code="invalid_api_key"))
    assert err.detail.startswith("invalid_request_error/invalid_api_key: Incorrect API key provided: [redacted]")
    assert "sk-proj" not in err.detail
    assert len(err.detail) <= 240


def test_non_json_error_detail_is_capped() -> None:
    err = codec.decode_error(502, {}, b"<html>" + b"x" * 5000 + b"</html>")
    assert err.detail.startswith("unrecognized error body: <html>")
    assert len(err.detail) <= 240
    assert codec.decode_error(500, {}, b"").detail == "empty error body"


def test_a_context_length_refusal_carries_a_normalized_reason_with_only_its_numbers() -> None:
    body = openai_error(
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130021 tokens.",
        code="context_length_exceeded",
    )
    err = codec.decode_error(400, {}, body)
    assert err.category is C.CONTEXT_LENGTH
    assert err.reason == "The request exceeds the model's context length (130021 tokens requested, 128000 allowed)."
    assert err.to_gateway_error().message == err.reason
    assert codec.decode_error(400, {}, openai_error("too long", code="context_length_exceeded")).reason is None


def test_a_content_filter_refusal_is_a_400_content_filter_naming_only_known_categories() -> None:
    body = orjson.dumps(
        {
            "error": {
                "message": "The response was filtered due to the prompt triggering content management policy.",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "innererror": {
                    "code": "ResponsibleAIPolicyViolation",
                    "content_filter_result": {
                        "hate": {"filtered": False, "severity": "safe"},
                        "violence": {"filtered": True, "severity": "high"},
                        "jailbreak": {"filtered": True, "detected": True},
                        "secret sauce <script>": {"filtered": True},
                    },
                },
            }
        }
    )
    err = codec.decode_error(400, {}, body).to_gateway_error()
    assert (err.status, err.code, err.type) == (400, "content_filter", "invalid_request_error")
    assert err.message == "The request was rejected by the model provider's content policy (jailbreak, violence)."
    plain = codec.decode_error(400, {}, openai_error("Your request was rejected as a result of our safety system."))
    assert plain.category is C.SAFETY
    assert plain.to_gateway_error().message == "The request was rejected by the model provider's content policy."


# What only the Anthropic format carries.


@pytest.mark.parametrize(
    ("req", "param"),
    [
        (request(top_k=5), "top_k"),
        (request(thinking_budget=1024), "thinking"),
        (
            CanonicalRequest([Message("user", "q"), Message("assistant", [ThinkingPart("t", "sig"), TextPart("a")])]),
            "messages",
        ),
        (CanonicalRequest([Message("user", "q"), Message("assistant", [RedactedThinkingPart("opaque")])]), "messages"),
    ],
    ids=["top-k", "thinking", "thinking-block", "redacted-thinking-block"],
)
def test_anthropic_only_fields_are_refused_never_dropped(req: CanonicalRequest, param: str) -> None:
    with pytest.raises(UnsupportedParameter) as info:
        codec.encode_request(req, TARGET)
    assert info.value.param == param


def test_cache_breakpoints_and_neutral_betas_are_left_out() -> None:
    cached = CacheControl()
    req = CanonicalRequest(
        [
            Message("system", [TextPart("Policy.", cached)]),
            Message("user", [TextPart("hi", cached), ImagePart("https://x.example/a.png", cache_control=cached)]),
            Message("assistant", None, tool_calls=[ToolCall("c1", "f", "{}", cached)]),
            Message("tool", "ok", tool_call_id="c1", cache_control=cached),
        ],
        tools=[ToolDefinition("f", cache_control=cached)],
        anthropic_beta=("prompt-caching-2024-07-31",),
    )
    upstream = codec.encode_request(req, TARGET)
    assert b"cache_control" not in upstream.body and dict(upstream.headers) == {"content-type": "application/json"}
    assert orjson.loads(upstream.body)["messages"][1]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}},
    ]
