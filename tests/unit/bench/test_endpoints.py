"""Endpoint kinds: the bodies they build, and how their SSE scans read the frames the mock and the gateway write.

The frames come from the real renderers (the mock's wire formats and the gateway's client-format
streams), so a change to either format that the load generator would misread fails here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson
import pytest

from bench.clients import _StreamWatch
from bench.codec import PLAN
from bench.endpoints import ENDPOINTS, PROVIDER_FORMATS, Endpoint, direct_kind, endpoint_kind, has_content, has_event
from bench.loadgen import LoadSpec
from bench.profiles import load_payload
from bench.servers import PROVIDER_MODELS
from tollway.api import anthropic_request, chat_request, responses_request
from tollway.api.anthropic_response import MessageStream
from tollway.api.chat_response import ChunkRenderer
from tollway.api.envelope import parse_body
from tollway.api.responses_response import ResponseStream
from tollway.canonical import StreamFinish, TextDelta, ToolCallDelta, Usage
from tollway.mock.anthropic_messages import AnthropicMessages
from tollway.mock.bedrock_converse import BedrockConverse, encode_frame, signed
from tollway.mock.content import MockRequest, ToolSpec, text_reply, tool_reply
from tollway.mock.gemini import Gemini
from tollway.mock.openai_chat import OpenAIChat
from tollway.providers.base import Target
from tollway.providers.bedrock_converse import BedrockConverseCodec
from tollway.providers.gemini import GeminiCodec

REPLY = text_reply("hello benchmark", None, None, 4)
MOCK_REQUEST = MockRequest(model="m", stream=True, message_count=1, echo="hello benchmark", prompt_chars=15)


def frames(stream: bytes) -> list[bytes]:
    """``stream`` split into its SSE frames, each with its blank line."""
    return [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]


def scan(kind: Endpoint, chunks: Iterable[bytes]) -> tuple[int | None, bool]:
    """Feed ``chunks`` one by one: the index of the chunk that set TTFT, and whether the stream completed."""
    assert kind.first_token is not None and kind.terminal is not None
    watch = _StreamWatch(0.0, kind.first_token, kind.terminal)
    first = None
    for i, chunk in enumerate(chunks):
        watch.feed(chunk)
        if first is None and watch.ttft is not None:
            first = i
    return first, watch.done


def mock_stream(wire: OpenAIChat | AnthropicMessages) -> tuple[list[bytes], int]:
    """The mock's frames for a 4-delta text reply, and the index of the first content delta."""
    plan = wire.stream(MOCK_REQUEST, REPLY, 1, 0)
    head = frames(plan.preamble)
    return [*head, *plan.deltas, *frames(plan.tail)], len(head)


def gateway_messages_stream(finish: str = "stop") -> tuple[list[bytes], int]:
    stream = MessageStream("msg_1", "bench-claude-v1", 12)
    head = frames(stream.event(TextDelta("")) + stream.event(TextDelta("Hello")))
    rest = stream.event(TextDelta(" there")) + stream.event(StreamFinish(finish)) + stream.end(Usage(12, 2))  # type: ignore[arg-type]
    first = next(i for i, f in enumerate(head) if f.startswith(b"event: content_block_delta"))
    return [*head, *frames(rest)], first


def gateway_responses_stream(finish: str = "stop") -> tuple[list[bytes], int]:
    stream = ResponseStream("req_0123456789abcdef", 0, "bench-v1", {})
    head = frames(stream.event(TextDelta("")) + stream.event(TextDelta("Hello")))
    rest = stream.event(TextDelta(" there")) + stream.event(StreamFinish(finish)) + stream.end(Usage(12, 2))  # type: ignore[arg-type]
    first = next(i for i, f in enumerate(head) if f.startswith(b"event: response.output_text.delta"))
    return [*head, *frames(rest)], first


def gateway_chat_stream() -> tuple[list[bytes], int]:
    renderer = ChunkRenderer("chatcmpl-1", 0, "bench-v1", False)
    return [renderer.text("Hello"), renderer.text(" there"), renderer.finish("stop"), b"data: [DONE]\n\n"], 0


def mock_chat_stream() -> tuple[list[bytes], int]:
    return mock_stream(OpenAIChat())


def mock_messages_stream() -> tuple[list[bytes], int]:
    return mock_stream(AnthropicMessages())


def mock_provider_stream(wire: Gemini | BedrockConverse, tool: bool = False) -> tuple[list[bytes], int]:
    """The mock's Gemini chunks or Bedrock event-stream messages, one per chunk (the event stream is
    binary, so not split into SSE frames), and the index of the first content delta."""
    reply = (
        tool_reply(ToolSpec("lookup", {"type": "object", "properties": {"q": {"type": "string"}}}), 3)
        if tool
        else REPLY
    )
    plan = wire.stream(MOCK_REQUEST, reply, 1, 0)
    head = [plan.preamble] if plan.preamble else []
    return [*head, *plan.deltas, plan.tail], len(head)


def mock_gemini_stream() -> tuple[list[bytes], int]:
    return mock_provider_stream(Gemini())


def mock_bedrock_stream() -> tuple[list[bytes], int]:
    return mock_provider_stream(BedrockConverse())


STREAMS: dict[str, tuple[str, Callable[[], tuple[list[bytes], int]]]] = {
    "chat from the mock": ("chat", mock_chat_stream),
    "chat from the gateway": ("chat", gateway_chat_stream),
    "messages from the mock": ("messages", mock_messages_stream),
    "messages from the gateway": ("messages", gateway_messages_stream),
    "responses from the gateway": ("responses", gateway_responses_stream),
    "gemini from the mock": ("gemini", mock_gemini_stream),
    "bedrock from the mock": ("bedrock", mock_bedrock_stream),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_ttft_is_the_first_content_frame_and_the_stream_ends_at_its_terminal_frame(case: str) -> None:
    name, build = STREAMS[case]
    chunks, first_content = build()
    assert first_content > 0 or name in ("chat", "gemini")  # the formats that open with frames of their own do
    first, done = scan(ENDPOINTS[name], chunks)
    assert first == first_content
    assert done
    _, cut_done = scan(ENDPOINTS[name], chunks[:-1])
    assert not cut_done, "a stream without its terminal frame must not count as complete"


@pytest.mark.parametrize("case", list(STREAMS))
def test_markers_split_across_chunks_are_still_found(case: str) -> None:
    name, build = STREAMS[case]
    chunks, first_content = build()
    stream = b"".join(chunks)
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    first, done = scan(ENDPOINTS[name], pieces)
    assert done
    assert first is not None
    # The first token is found in the piece that completes the first content frame's marker, not before it.
    assert len(b"".join(chunks[:first_content])) <= 7 * first < len(b"".join(chunks[: first_content + 1]))


def test_an_incomplete_response_is_not_a_completed_stream() -> None:
    chunks, _ = gateway_responses_stream(finish="length")
    assert b"event: response.incomplete" in b"".join(chunks)
    assert scan(ENDPOINTS["responses"], chunks)[1] is False


def test_one_formats_terminal_frame_does_not_end_another_formats_stream() -> None:
    messages, _ = gateway_messages_stream()
    assert scan(ENDPOINTS["messages"], [*messages[:-1], b"data: [DONE]\n\n"])[1] is False
    chat, _ = gateway_chat_stream()
    assert scan(ENDPOINTS["chat"], [*chat[:-1], b"event: message_stop\ndata: {}\n\n"])[1] is False


@pytest.mark.parametrize("wire", [Gemini(), BedrockConverse()], ids=["gemini", "bedrock"])
def test_a_provider_streams_tool_call_is_its_first_token(wire: Gemini | BedrockConverse) -> None:
    chunks, first_content = mock_provider_stream(wire, tool=True)
    first, done = scan(ENDPOINTS[wire.name], chunks)
    assert (first, done) == (first_content, True)


def test_gemini_counts_text_parts_not_the_empty_one_its_finish_chunk_carries() -> None:
    gemini = ENDPOINTS["gemini"]
    assert gemini.first_token is not None and gemini.terminal is not None
    (tail,) = frames(Gemini().stream(MOCK_REQUEST, REPLY, 1, 0).tail)
    assert b'"text":""' in tail and gemini.terminal in tail
    assert gemini.first_token(tail) is False
    assert gemini.first_token(b'data: {"candidates":[{"content":{"parts":[{"text":"Hi"}]}}]}') is True


def test_bedrocks_terminal_is_the_metadata_event_not_message_stop() -> None:
    chunks, _ = mock_bedrock_stream()
    stop = encode_frame("messageStop", b'{"stopReason":"end_turn"}')
    assert stop in chunks[-1]
    assert scan(ENDPOINTS["bedrock"], [*chunks[:-1], stop])[1] is False
    assert scan(ENDPOINTS["bedrock"], [*chunks[:-1], stop, encode_frame("metadata", b'{"usage":{}}')])[1] is True


def test_a_responses_tool_call_counts_its_first_argument_fragment() -> None:
    stream = ResponseStream("req_0123456789abcdef", 0, "bench-v1", {})
    opened = frames(stream.event(ToolCallDelta(0, "call_1", "lookup", "")))
    fragment = stream.event(ToolCallDelta(0, arguments='{"q":'))
    first, _ = scan(ENDPOINTS["responses"], [*opened, fragment])
    assert first == len(opened)


@pytest.mark.parametrize(
    ("line", "has"),
    [
        (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', False),
        (b'data: {"choices":[{"delta":{"content":"Hi"}}]}', True),
        (b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}', True),
        (b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"a"}}]}}]}', True),
        (b"data: [DONE]", False),
    ],
)
def test_content_frames_are_those_with_non_empty_text(line: bytes, has: bool) -> None:
    assert has_content(line) is has


def test_content_later_in_a_chunk_counts_even_after_an_empty_one() -> None:
    chunk = b'data: {"delta":{"content":""}}\n\ndata: {"delta":{"content":"Hi"}}\n\n'
    assert has_content(chunk)
    assert not has_content(b'data: {"delta":{"content":"')


def test_messages_count_text_deltas_not_the_empty_block_start() -> None:
    block_start = b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    assert has_content(block_start) is False
    assert ENDPOINTS["messages"].first_token is not None
    assert ENDPOINTS["messages"].first_token(block_start) is False
    # Chat's scan would take a message_start's text field; messages' scan takes only deltas.
    assert ENDPOINTS["messages"].first_token(b'{"type":"text","text":"x"}') is False


def test_an_event_matches_only_as_a_whole_line() -> None:
    events = (b"event: response.output_text.delta\n",)
    assert has_event(b"event: response.output_text.delta\ndata: {}", events)
    assert not has_event(b"event: response.output_text.done\ndata: {}", events)


# -- bodies ------------------------------------------------------------------------------------


def small() -> dict[str, object]:
    payload, _ = load_payload("small")
    return payload


def test_chat_bodies_are_the_payload_with_model_and_stream_as_always() -> None:
    payload = small()
    body = ENDPOINTS["chat"].body(payload, "bench-v1", True)
    assert orjson.dumps(body) == orjson.dumps({"model": "bench-v1", **payload, "stream": True})
    assert "stream" not in ENDPOINTS["chat"].body(payload, "bench-v1", False)


def test_a_messages_body_is_what_the_gateways_messages_parser_accepts() -> None:
    body = ENDPOINTS["messages"].body(small(), "bench-claude-v1", True)
    assert body["system"] == "You are a concise assistant."
    assert body["messages"] == [{"role": "user", "content": "Say hello to the benchmark in five words."}]
    assert (body["max_tokens"], body["stream"], body["temperature"]) == (64, True, 0)
    req = anthropic_request.to_canonical(parse_body(orjson.dumps(body)), PLAN)
    assert req.stream is True
    assert [m.role for m in req.messages] == ["system", "user"]


def test_a_responses_body_is_what_the_gateways_responses_parser_accepts() -> None:
    body = ENDPOINTS["responses"].body(small(), "bench-v1", True)
    assert body["input"] == "Say hello to the benchmark in five words."
    assert body["instructions"] == "You are a concise assistant."
    assert (body["max_output_tokens"], body["stream"]) == (64, True)
    req = responses_request.to_canonical(parse_body(orjson.dumps(body)), PLAN)
    assert req.stream is True
    assert [m.role for m in req.messages] == ["system", "user"]


@pytest.mark.parametrize("name", ["messages", "responses"])
def test_a_longer_conversation_keeps_its_turns(name: str) -> None:
    payload, _ = load_payload("10kib")
    body = ENDPOINTS[name].body(payload, "m", False)
    turns = body["messages"] if name == "messages" else body["input"]
    assert len(turns) == len(payload["messages"]) - 1  # the system message moved out
    parse = anthropic_request.to_canonical if name == "messages" else responses_request.to_canonical
    assert len(parse(parse_body(orjson.dumps(body)), PLAN).messages) == len(payload["messages"])


def test_the_direct_baseline_of_responses_is_the_chat_body_the_gateway_sends_upstream() -> None:
    kind = ENDPOINTS["responses"]
    assert kind.upstream == "chat"
    body = ENDPOINTS[kind.upstream].body(small(), "mock-gpt-small", True)
    assert chat_request.to_canonical(parse_body(orjson.dumps(body)), PLAN).stream is True


CODECS = {"gemini": GeminiCodec(), "bedrock": BedrockConverseCodec()}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("payload", ["small", "10kib"])
@pytest.mark.parametrize("name", ["gemini", "bedrock"])
def test_a_provider_baseline_sends_what_the_gateways_codec_sends_upstream(
    name: str, payload: str, stream: bool
) -> None:
    body, _ = load_payload(payload)
    model = PROVIDER_MODELS[name]
    chat = ENDPOINTS["chat"].body(body, "bench-v1", stream)
    upstream = CODECS[name].encode_request(
        chat_request.to_canonical(parse_body(orjson.dumps(chat)), PLAN), Target(model)
    )
    kind = ENDPOINTS[name]
    assert kind.body(body, model, stream) == orjson.loads(upstream.body)
    assert kind.url_path(model, stream) == "/" + upstream.path
    assert not kind.client_api


def test_the_chat_alias_format_moves_the_baseline_of_chat_and_responses_only() -> None:
    for fmt, upstream in PROVIDER_FORMATS.items():
        assert direct_kind(ENDPOINTS["chat"], fmt).name == upstream
        assert direct_kind(ENDPOINTS["responses"], fmt).name == upstream
        assert direct_kind(ENDPOINTS["messages"], fmt).name == "messages"
        assert direct_kind(ENDPOINTS["embeddings"], fmt).name == "embeddings"
    assert direct_kind(ENDPOINTS["chat"]).name == "chat"


def test_an_embeddings_body_is_a_batch_of_inputs_and_never_streams() -> None:
    payload, _ = load_payload("embed-batch")
    body = ENDPOINTS["embeddings"].body(payload, "bench-embed-v1", False)
    assert body["model"] == "bench-embed-v1"
    assert 2 <= len(body["input"]) <= 16 and all(isinstance(x, str) and x for x in body["input"])
    with pytest.raises(ValueError, match="does not stream"):
        ENDPOINTS["embeddings"].body(payload, "m", True)
    with pytest.raises(ValueError, match="input"):
        ENDPOINTS["embeddings"].body({"input": []}, "m", False)


@pytest.mark.parametrize(
    ("name", "payload", "reason"),
    [
        ("messages", "tools", "no place for the payload's tool_choice, tools"),
        ("responses", "tools", "no place for the payload's tool_choice, tools"),
        ("gemini", "tools", "the gemini endpoint has no place for the payload's tool_choice, tools"),
        ("bedrock", "tools", "the bedrock endpoint has no place for the payload's tool_choice, tools"),
        ("chat", "embed-batch", "needs a payload with messages"),
        ("embeddings", "small", "no place for the payload's"),
    ],
)
def test_a_payload_an_api_cannot_carry_is_refused_not_trimmed(name: str, payload: str, reason: str) -> None:
    body, _ = load_payload(payload)
    with pytest.raises(ValueError, match=reason):
        ENDPOINTS[name].body(body, "m", False)


def test_anthropic_callers_send_the_key_in_x_api_key_with_a_version() -> None:
    assert ENDPOINTS["messages"].headers("k") == {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    for name in ("chat", "responses", "embeddings"):
        assert ENDPOINTS[name].headers("k") == {"authorization": "Bearer k"}


def test_a_gemini_baseline_sends_the_key_in_x_goog_api_key() -> None:
    assert ENDPOINTS["gemini"].headers("k") == {"x-goog-api-key": "k"}


def test_a_bedrock_baseline_sends_one_fixed_header_of_a_sigv4_signatures_shape() -> None:
    headers = ENDPOINTS["bedrock"].headers("k")
    assert headers == ENDPOINTS["bedrock"].headers("k"), "computed once, the same every request"
    assert signed(headers["authorization"].encode()), "the mock takes it as signed"
    assert "/bedrock/aws4_request, SignedHeaders=" in headers["authorization"]
    assert len(headers["authorization"].rsplit("Signature=", 1)[1]) == 64
    assert headers["x-amz-date"].endswith("Z")


def test_a_load_spec_refuses_an_unknown_endpoint_and_a_stream_the_endpoint_cannot_give() -> None:
    with pytest.raises(ValueError, match="unknown endpoint"):
        LoadSpec(url="http://127.0.0.1:1/", body=b"{}", rate=1, duration_s=1, endpoint="completions")
    with pytest.raises(ValueError, match="does not stream"):
        LoadSpec(url="http://127.0.0.1:1/", body=b"{}", rate=1, duration_s=1, endpoint="embeddings", stream=True)
    with pytest.raises(ValueError, match="unknown endpoint"):
        endpoint_kind("completions")
    spec = LoadSpec(url="http://127.0.0.1:1/", body=b"{}", rate=1, duration_s=1, endpoint="messages", stream=True)
    assert spec.settings()["stream_terminal"] == "event: message_stop"
    assert spec.settings()["endpoint"] == "messages"
