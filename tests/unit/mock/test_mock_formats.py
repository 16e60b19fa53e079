"""The mock's two wire formats over real HTTP: shapes, determinism, tool calls, SDK compatibility."""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import httpx
import openai
import orjson
import pytest
import pytest_asyncio
from anthropic.lib.streaming._messages import accumulate_event

from tollway.mock import MockServer
from tollway.mock.content import thinking_signature

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
WEATHER_TOOL_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "threshold": {"type": "number"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "extra": {"type": "object"},
        "unit": {"type": ["string", "null"]},
    },
}
WEATHER_ARGUMENTS = (
    '{"city":"mock-city","days":1,"threshold":1.5,"metric":true,"tags":["mock-tags"],"extra":{},"unit":"mock-unit"}'
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mock() -> AsyncIterator[MockServer]:
    async with MockServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(mock: MockServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=mock.base_url, timeout=5) as http:
        yield http


@pytest.fixture(autouse=True)
def fresh_state(mock: MockServer) -> None:
    mock.app.reset()


def sse(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE frame; a trailing partial frame is kept as-is."""
    frames = []
    for block in text.split("\n\n"):
        if not block:
            continue
        event = None
        data = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        frames.append((event, "\n".join(data)))
    return frames


def openai_body(text: str = "hello brave new world", **extra: Any) -> dict[str, Any]:
    return {"model": "mock-gpt", "messages": [{"role": "user", "content": text}], **extra}


def anthropic_body(text: str = "hello brave new world", **extra: Any) -> dict[str, Any]:
    return {"model": "mock-claude", "max_tokens": 256, "messages": [{"role": "user", "content": text}], **extra}


def openai_tools(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": WEATHER_TOOL_SCHEMA}} for n in names]


def anthropic_tools(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "description": "d", "input_schema": WEATHER_TOOL_SCHEMA} for n in names]


def chunks(text: str) -> list[dict[str, Any]]:
    frames = sse(text)
    assert frames[-1] == (None, "[DONE]")
    return [orjson.loads(data) for _, data in frames[:-1]]


async def test_openai_buffered_reply_echoes_the_last_user_message(client: httpx.AsyncClient) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "keep <PII_EMAIL_1> intact"}]},
    ]
    response = await client.post(CHAT, json={"model": "gpt-x", "messages": messages})

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"].startswith("req_mock")
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "gpt-x"
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Mock reply #3: keep <PII_EMAIL_1> intact"}
    assert choice["finish_reason"] == "stop"
    prompt_chars = len("be brief") + len("first question") + len("an answer") + len("keep <PII_EMAIL_1> intact")
    assert body["usage"] == {
        "prompt_tokens": math.ceil(prompt_chars / 4),
        "completion_tokens": 6,
        "total_tokens": math.ceil(prompt_chars / 4) + 6,
    }


async def test_openai_stream_is_role_chunk_content_deltas_finish_and_done(client: httpx.AsyncClient) -> None:
    buffered = (await client.post(CHAT, json=openai_body())).json()
    response = await client.post(CHAT, json=openai_body(stream=True))

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = chunks(response.text)
    assert {f["object"] for f in frames} == {"chat.completion.chunk"}
    assert len({f["id"] for f in frames}) == 1
    assert all("usage" not in f for f in frames)
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [f["choices"][0]["delta"]["content"] for f in frames[1:-1]]
    assert len(content) == 5
    assert all(content)
    assert "".join(content) == buffered["choices"][0]["message"]["content"]
    assert frames[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


async def test_openai_stream_usage_chunk_only_when_requested(client: httpx.AsyncClient) -> None:
    body = openai_body(stream=True, stream_options={"include_usage": True})
    frames = chunks((await client.post(CHAT, json=body)).text)

    assert all(f["usage"] is None for f in frames[:-1])
    assert frames[-2]["choices"][0]["finish_reason"] == "stop"
    assert frames[-1]["choices"] == []
    assert frames[-1]["usage"] == {"prompt_tokens": 6, "completion_tokens": 7, "total_tokens": 13}


async def test_chunks_and_words_set_delta_count_and_reply_length(client: httpx.AsyncClient) -> None:
    headers = {"x-mock-chunks": "7", "x-mock-words": "20"}
    frames = chunks((await client.post(CHAT, json=openai_body(stream=True), headers=headers)).text)

    content = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
    assert len(frames) == 1 + 7 + 1
    assert content.startswith("Mock reply #20: hello brave new world alpha bravo")
    assert len(content.split()) == 3 + 20


async def test_echo_is_truncated_to_64_words(client: httpx.AsyncClient) -> None:
    text = " ".join(f"w{i}" for i in range(100))
    content = (await client.post(CHAT, json=openai_body(text))).json()["choices"][0]["message"]["content"]

    assert content == "Mock reply #64: " + " ".join(f"w{i}" for i in range(64))


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
@pytest.mark.parametrize("stream", [False, True])
async def test_same_request_gives_same_body_except_ids_and_created(
    client: httpx.AsyncClient, path: str, stream: bool
) -> None:
    body = openai_body(stream=stream) if path == CHAT else anthropic_body(stream=stream)
    first = (await client.post(path, json=body)).text
    second = (await client.post(path, json=body)).text

    assert first != second
    assert scrub(parse_body(first)) == scrub(parse_body(second))


def parse_body(text: str) -> Any:
    if text.startswith("{"):
        return orjson.loads(text)
    return [(name, data if data == "[DONE]" else orjson.loads(data)) for name, data in sse(text)]


def scrub(value: Any) -> Any:
    """The value without the keys that may differ between identical requests."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


async def test_openai_tool_call_uses_first_tool_and_schema_derived_arguments(client: httpx.AsyncClient) -> None:
    body = openai_body(tools=openai_tools("get_weather", "other"))
    choice = (await client.post(CHAT, json=body)).json()["choices"][0]

    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_")
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": WEATHER_ARGUMENTS}


async def test_openai_streamed_tool_call_fragments_arguments(client: httpx.AsyncClient) -> None:
    body = openai_body(stream=True, tools=openai_tools("get_weather"), tool_choice="required")
    frames = chunks((await client.post(CHAT, json=body)).text)

    first = frames[0]["choices"][0]["delta"]
    assert first["role"] == "assistant"
    [header] = first["tool_calls"]
    assert header["index"] == 0
    assert header["id"].startswith("call_")
    assert header["type"] == "function"
    assert header["function"] == {"name": "get_weather", "arguments": ""}
    fragments = [f["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for f in frames[1:-1]]
    assert all(f["choices"][0]["delta"]["tool_calls"][0]["index"] == 0 for f in frames[1:-1])
    assert len(fragments) >= 3
    assert "".join(fragments) == WEATHER_ARGUMENTS
    assert frames[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_openai_tool_choice_forces_named_tool(client: httpx.AsyncClient) -> None:
    choice = {"type": "function", "function": {"name": "second"}}
    body = openai_body(tools=openai_tools("first", "second"), tool_choice=choice)
    message = (await client.post(CHAT, json=body)).json()["choices"][0]["message"]

    assert message["tool_calls"][0]["function"]["name"] == "second"


async def test_openai_answers_text_for_tool_choice_none_or_after_a_tool_result(client: httpx.AsyncClient) -> None:
    none = (await client.post(CHAT, json=openai_body(tools=openai_tools("t"), tool_choice="none"))).json()
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in <PII_CITY_1>"},
    ]
    after = (await client.post(CHAT, json={"model": "m", "messages": messages, "tools": openai_tools("t")})).json()

    assert none["choices"][0]["finish_reason"] == "stop"
    assert after["choices"][0]["finish_reason"] == "stop"
    assert after["choices"][0]["message"]["content"] == "Mock reply #3: sunny in <PII_CITY_1>"


async def test_openai_unknown_forced_tool_is_a_400(client: httpx.AsyncClient) -> None:
    choice = {"type": "function", "function": {"name": "missing"}}
    response = await client.post(CHAT, json=openai_body(tools=openai_tools("t"), tool_choice=choice))

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tool_choice"


async def test_max_tokens_truncates_the_reply(client: httpx.AsyncClient) -> None:
    chat = (await client.post(CHAT, json=openai_body(max_tokens=4))).json()
    claude = (await client.post(MESSAGES, json=anthropic_body(max_tokens=4))).json()

    assert chat["choices"][0]["message"]["content"] == "Mock reply #4: hello"
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 4
    assert claude["content"][0]["text"] == "Mock reply #4: hello"
    assert claude["stop_reason"] == "max_tokens"


async def test_anthropic_buffered_message_shape(client: httpx.AsyncClient) -> None:
    body = anthropic_body(system="sys prompt")
    response = await client.post(MESSAGES, json=body)

    assert response.status_code == 200
    assert response.headers["request-id"].startswith("req_mock")
    message = response.json()
    assert message["id"].startswith("msg_")
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["model"] == "mock-claude"
    assert message["content"] == [{"type": "text", "text": "Mock reply #4: hello brave new world"}]
    assert message["stop_reason"] == "end_turn"
    assert message["stop_sequence"] is None
    assert message["usage"]["input_tokens"] == math.ceil((len("sys prompt") + len("hello brave new world")) / 4)
    assert message["usage"]["output_tokens"] == 7


async def test_anthropic_stream_follows_the_real_event_sequence(client: httpx.AsyncClient) -> None:
    buffered = (await client.post(MESSAGES, json=anthropic_body())).json()
    frames = sse((await client.post(MESSAGES, json=anthropic_body(stream=True))).text)

    names = [name for name, _ in frames]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [orjson.loads(payload) for _, payload in frames]
    assert [d["type"] for d in data] == names
    assert data[0]["message"]["content"] == []
    assert data[0]["message"]["usage"]["input_tokens"] == buffered["usage"]["input_tokens"]
    assert data[1]["content_block"] == {"type": "text", "text": ""}
    deltas = [d["delta"] for d in data[3:8]]
    assert {d["type"] for d in deltas} == {"text_delta"}
    assert "".join(d["text"] for d in deltas) == buffered["content"][0]["text"]
    assert data[9]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert data[9]["usage"] == {"output_tokens": buffered["usage"]["output_tokens"]}


async def test_anthropic_tool_use_buffered_and_streamed(client: httpx.AsyncClient) -> None:
    body = anthropic_body(tools=anthropic_tools("lookup", "forced"), tool_choice={"type": "tool", "name": "forced"})
    message = (await client.post(MESSAGES, json=body)).json()
    frames = sse((await client.post(MESSAGES, json={**body, "stream": True})).text)

    [block] = message["content"]
    assert block["type"] == "tool_use"
    assert block["id"].startswith("toolu_")
    assert block["name"] == "forced"
    assert block["input"] == orjson.loads(WEATHER_ARGUMENTS)
    assert message["stop_reason"] == "tool_use"
    data = [orjson.loads(payload) for _, payload in frames]
    assert data[1]["content_block"] == {
        "type": "tool_use",
        "id": data[1]["content_block"]["id"],
        "name": "forced",
        "input": {},
    }
    fragments = [d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta"]
    assert len(fragments) >= 3
    assert "".join(fragments) == WEATHER_ARGUMENTS
    assert data[-2]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_answers_text_for_tool_choice_none_or_after_tool_result(client: httpx.AsyncClient) -> None:
    none = await client.post(MESSAGES, json=anthropic_body(tools=anthropic_tools("t"), tool_choice={"type": "none"}))
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rainy today"}]},
    ]
    after = await client.post(
        MESSAGES, json={"model": "c", "max_tokens": 100, "messages": messages, "tools": anthropic_tools("t")}
    )

    assert none.json()["stop_reason"] == "end_turn"
    assert after.json()["content"] == [{"type": "text", "text": "Mock reply #2: rainy today"}]


THINKING = {"type": "enabled", "budget_tokens": 1024}
THOUGHT = "Mock thinking about: hello brave new world"


async def test_anthropic_thinking_opens_the_answer_with_a_signed_thinking_block(client: httpx.AsyncClient) -> None:
    message = (await client.post(MESSAGES, json=anthropic_body(max_tokens=2048, thinking=THINKING))).json()

    anthropic.types.Message.model_validate(message)
    assert message["content"] == [
        {"type": "thinking", "thinking": THOUGHT, "signature": thinking_signature(THOUGHT)},
        {"type": "text", "text": "Mock reply #4: hello brave new world"},
    ]
    assert thinking_signature(THOUGHT) == "mock-signature-" + hashlib.sha256(THOUGHT.encode()).hexdigest()[:32]
    assert message["usage"]["output_tokens"] == 7 + 7  # the reply's words and the thinking's


async def test_anthropic_thinking_streams_before_the_text_block(client: httpx.AsyncClient) -> None:
    body = anthropic_body(max_tokens=2048, thinking=THINKING)
    buffered = (await client.post(MESSAGES, json=body)).json()
    frames = sse((await client.post(MESSAGES, json={**body, "stream": True})).text)

    data = [orjson.loads(payload) for _, payload in frames]
    assert [(d["type"], d.get("index"), d.get("delta", {}).get("type")) for d in data[:6]] == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
    ]
    assert data[6] == {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
    snapshot = None
    bufs: dict[int, bytes] = {}
    for doc in data:
        if doc["type"] != "ping":
            snapshot = accumulate_event(event=cast(Any, doc), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    assert [b.model_dump(exclude_none=True) for b in snapshot.content] == buffered["content"]
    assert snapshot.usage.output_tokens == buffered["usage"]["output_tokens"]


async def test_anthropic_thinking_sent_back_must_keep_its_signature(client: httpx.AsyncClient) -> None:
    first = (await client.post(MESSAGES, json=anthropic_body(max_tokens=2048, thinking=THINKING))).json()
    turn = [{"role": "user", "content": "hello brave new world"}, {"role": "assistant", "content": first["content"]}]
    again = {"role": "user", "content": "and now?"}
    ok = await client.post(MESSAGES, json=anthropic_body(messages=[*turn, again]))
    tampered = [dict(first["content"][0], thinking=THOUGHT + "!"), first["content"][1]]
    bad = await client.post(
        MESSAGES, json=anthropic_body(messages=[turn[0], {"role": "assistant", "content": tampered}, again])
    )

    assert ok.status_code == 200
    assert bad.status_code == 400
    assert bad.json()["error"] == {
        "type": "invalid_request_error",
        "message": "messages.1.content.0: Invalid `signature` in `thinking` block",
    }


async def test_anthropic_thinking_budget_below_1024_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post(MESSAGES, json=anthropic_body(thinking={"type": "enabled", "budget_tokens": 1000}))
    assert response.status_code == 400
    assert "budget_tokens" in response.json()["error"]["message"]


SYSTEM = "s" * 400
EPHEMERAL = {"type": "ephemeral"}


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_one_cache_breakpoint_writes_the_prefix(client: httpx.AsyncClient, stream: bool) -> None:
    body = anthropic_body(system=[{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}], stream=stream)
    response = await client.post(MESSAGES, json=body)
    usage = orjson.loads(sse(response.text)[0][1])["message"]["usage"] if stream else response.json()["usage"]
    prompt = math.ceil((400 + len("hello brave new world")) / 4)
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 100)
    assert usage["input_tokens"] == prompt - 100 == 6


async def test_anthropic_the_prefix_before_the_second_to_last_breakpoint_is_read(client: httpx.AsyncClient) -> None:
    user = [
        {"type": "text", "text": "u" * 40, "cache_control": EPHEMERAL},
        {"type": "text", "text": "question?"},
    ]
    tools = [{**anthropic_tools("t")[0], "cache_control": EPHEMERAL}]
    body = anthropic_body(
        system=[{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
        messages=[{"role": "user", "content": user}],
        tools=tools,
        tool_choice={"type": "none"},
    )
    usage = (await client.post(MESSAGES, json=body)).json()["usage"]
    assert math.ceil((400 + len("u" * 40 + " question?")) / 4) == 113
    assert usage == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 10,
        "cache_read_input_tokens": 100,
        "output_tokens": 5,
    }


async def test_anthropic_without_breakpoints_nothing_is_cached(client: httpx.AsyncClient) -> None:
    usage = (await client.post(MESSAGES, json=anthropic_body(system=SYSTEM))).json()["usage"]
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 0)


async def test_anthropic_missing_max_tokens_is_an_invalid_request_error(client: httpx.AsyncClient) -> None:
    response = await client.post(MESSAGES, json={"model": "c", "messages": [{"role": "user", "content": "x"}]})

    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


async def test_malformed_requests_and_unknown_routes(client: httpx.AsyncClient) -> None:
    not_json = await client.post(CHAT, content=b"{nope", headers={"content-type": "application/json"})
    no_model = await client.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]})
    wrong_method = await client.get(CHAT)
    unknown = await client.post("/v1/rerank", json={})

    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    assert no_model.status_code == 400
    assert no_model.json()["error"]["param"] == "model"
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert unknown.status_code == 404
    assert "error" in unknown.json()


async def test_official_openai_sdk_buffered_and_streamed(mock: MockServer) -> None:
    sdk = openai.AsyncOpenAI(base_url=mock.base_url + "/v1", api_key="x", max_retries=0)
    async with sdk:
        completion = await sdk.chat.completions.create(
            model="alias-1", messages=[{"role": "user", "content": "echo this back"}]
        )
        stream = await sdk.chat.completions.create(
            model="alias-1",
            messages=[{"role": "user", "content": "echo this back"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = []
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        tool = await sdk.chat.completions.create(
            model="alias-1",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL_SCHEMA}}],
        )

    assert completion.model == "alias-1"
    assert completion.choices[0].message.content == "Mock reply #3: echo this back"
    assert completion.usage is not None
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert "".join(pieces) == "Mock reply #3: echo this back"
    assert usage is not None
    assert usage.completion_tokens == 6
    calls = tool.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].type == "function"
    assert orjson.loads(calls[0].function.arguments)["city"] == "mock-city"
    assert [r["auth"] for r in mock.app.requests] == [True, True, True]
