"""The Gemini codec against the bundled mock over real HTTP: the mock answers what the codec sends,
the codec reads what the mock answers, and the mock's faults reach the codec as the right errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from tollway.canonical import (
    SKIPPED,
    CanonicalRequest,
    Message,
    ResponseFormat,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
)
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.mock import MockServer
from tollway.providers import GeminiCodec, Target
from tollway.sse import SseParser
from tollway.wire import SseEvent

pytestmark = pytest.mark.asyncio(loop_scope="module")

codec = GeminiCodec()
TARGET = Target("mock-gemini")
KEY = {"x-goog-api-key": "test-key"}
C = UpstreamCategory
WEATHER = ToolDefinition(
    "get_weather", "Weather for a city.", {"type": "object", "properties": {"city": {"type": "string"}}}
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


def request(text: str = "hello brave new world", **fields: Any) -> CanonicalRequest:
    return CanonicalRequest([Message("system", "Be brief."), Message("user", text)], **fields)


async def call(
    client: httpx.AsyncClient, req: CanonicalRequest, faults: str = "", headers: dict[str, str] | None = None
) -> httpx.Response:
    upstream = codec.encode_request(req, TARGET)
    prefix = f"/_fault/{faults}" if faults else ""
    return await client.post(
        f"{prefix}/{upstream.path}", content=upstream.body, headers={**upstream.headers, **(headers or KEY)}
    )


async def buffered(client: httpx.AsyncClient, req: CanonicalRequest, faults: str = "") -> Any:
    resp = await call(client, req, faults)
    if resp.status_code != 200:
        raise codec.decode_error(resp.status_code, resp.headers, resp.content)
    return codec.decode_response(resp.status_code, resp.content)


async def streamed(client: httpx.AsyncClient, req: CanonicalRequest, faults: str = "") -> list[StreamEvent]:
    resp = await call(client, req, faults)
    assert resp.status_code == 200, resp.text
    parser = SseParser()

    async def frames() -> AsyncIterator[SseEvent]:
        for event in parser.feed(resp.content):
            yield event

    return [event async for event in codec.decode_stream(frames())]


async def test_buffered_answer_echoes_the_user_and_reports_usage(client: httpx.AsyncClient, mock: MockServer) -> None:
    resp = await buffered(client, request())
    assert resp.content == "Mock reply #4: hello brave new world"
    assert resp.finish_reason == "stop"
    assert resp.usage is not None and resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens == 7
    [entry] = mock.app.requests
    assert (entry["format"], entry["model"], entry["stream"], entry["auth"], entry["messages"]) == (
        "gemini",
        "mock-gemini",
        False,
        True,
        1,
    )


async def test_stream_gives_the_same_text_then_finish_and_usage(client: httpx.AsyncClient) -> None:
    events = await streamed(client, request(stream=True))
    assert type(events[0]) is StreamStart
    assert "".join(e.text for e in events if type(e) is TextDelta) == "Mock reply #4: hello brave new world"
    assert events[-2:] == [StreamFinish("stop"), events[-1]]
    assert type(events[-1]) is StreamUsage


async def test_max_output_tokens_cut_the_answer(client: httpx.AsyncClient) -> None:
    resp = await buffered(client, request(max_output_tokens=3))
    assert (resp.content, resp.finish_reason) == ("Mock reply #4:", "length")


async def test_forced_function_is_called_buffered_and_streamed(client: httpx.AsyncClient) -> None:
    tools = [ToolDefinition("get_time"), WEATHER]
    req = request(tools=tools, tool_choice=ToolChoice("function", "get_weather"))
    resp = await buffered(client, req)
    assert resp.finish_reason == "tool_calls"
    assert resp.tool_calls is not None
    assert [(c.name, orjson.loads(c.arguments)) for c in resp.tool_calls] == [("get_weather", {"city": "mock-city"})]
    events = await streamed(
        client, request(tools=tools, tool_choice=ToolChoice("function", "get_weather"), stream=True)
    )
    calls = [e for e in events if type(e) is ToolCallDelta]
    assert [(c.index, c.name) for c in calls] == [(0, "get_weather"), (0, None)]
    assert orjson.loads(calls[1].arguments) == {"city": "mock-city"}
    assert StreamFinish("tool_calls") in events


async def test_json_schema_reply_is_an_instance_of_the_schema(client: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    resp = await buffered(
        client, request(response_format=ResponseFormat("json_schema", {"name": "x", "schema": schema}))
    )
    assert isinstance(orjson.loads(resp.content or ""), dict)
    assert set(orjson.loads(resp.content or "")) == {"n"}


async def test_unknown_gemini_method_is_not_found(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1beta/models/mock-gemini:countTokens", json={"contents": []}, headers=KEY)
    assert resp.status_code == 404


@pytest.mark.parametrize(
    ("faults", "category", "retry_after"),
    [
        ("status=429,retry_after=3", C.RATE_LIMIT, 3.0),
        ("status=503", C.OVERLOADED, None),
        ("status=500", C.SERVER, None),
        ("status=403", C.PERMISSION, None),
        ("context_window=2", C.CONTEXT_LENGTH, None),
        ("malformed=1", C.MALFORMED, None),
    ],
)
async def test_buffered_faults_reach_the_codec_as_typed_errors(
    client: httpx.AsyncClient, faults: str, category: UpstreamCategory, retry_after: float | None
) -> None:
    with pytest.raises(UpstreamError) as info:
        await buffered(client, request(), faults)
    assert (info.value.category, info.value.retry_after) == (category, retry_after)


async def test_require_auth_wants_the_goog_api_key(client: httpx.AsyncClient) -> None:
    resp = await call(client, request(), "require_auth=1", headers={"authorization": "Bearer x"})
    assert codec.decode_error(resp.status_code, resp.headers, resp.content).category is C.AUTHENTICATION
    assert (await call(client, request(), "require_auth=1")).status_code == 200


async def test_prefill_is_refused_or_continued(client: httpx.AsyncClient) -> None:
    req = CanonicalRequest([Message("user", "hello brave new world"), Message("assistant", "Mock reply")])
    refused = await call(client, req, "no_prefill=1")
    assert codec.decode_error(refused.status_code, refused.headers, refused.content).category is C.INVALID_REQUEST
    continued = await buffered(client, req)
    assert continued.content == " #4: hello brave new world"


async def test_stream_faults_reach_the_codec(client: httpx.AsyncClient) -> None:
    skipped = await streamed(client, request(stream=True), "malformed=2")
    assert SKIPPED in skipped and StreamFinish("stop") in skipped
    with pytest.raises(UpstreamError) as info:
        await streamed(client, request(stream=True), "midstream_error=2")
    assert (info.value.category, info.value.reported) == (C.OVERLOADED, True)
    with pytest.raises(UpstreamError) as cut:
        await streamed(client, request(stream=True), "abort_after=2")
    assert cut.value.category in (C.TRUNCATED, C.MALFORMED)
