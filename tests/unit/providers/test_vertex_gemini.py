"""Gemini on Vertex AI: the codec's path under a Vertex base URL, and the bundled mock serving that
path with the Gemini API's answers and faults, to bearer-token requests only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tollway.canonical import CanonicalRequest, Message, StreamEvent, StreamFinish, StreamStart, TextDelta
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.mock import MockServer
from tollway.providers.base import Target
from tollway.providers.gemini import GeminiCodec, VertexGeminiCodec, generate_path, vertex_base_url
from tollway.sse import SseParser
from tollway.wire import SseEvent

pytestmark = pytest.mark.asyncio(loop_scope="module")

codec = VertexGeminiCodec()
TARGET = Target("gemini-2.5-flash")
BASE = "/v1/projects/tollway-test/locations/europe-west4/publishers/google/"
BEARER = {"authorization": "Bearer ya29.test-token"}
C = UpstreamCategory


def request(text: str = "hallo Zürich", **fields: Any) -> CanonicalRequest:
    return CanonicalRequest([Message("user", text)], **fields)


async def test_vertex_base_url_is_regional_or_global() -> None:
    assert vertex_base_url("proj-1", "us-central1") == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/proj-1/locations/us-central1/publishers/google/"
    )
    assert vertex_base_url("proj-1", "global") == (
        "https://aiplatform.googleapis.com/v1/projects/proj-1/locations/global/publishers/google/"
    )


async def test_the_vertex_path_names_the_model_under_models_and_the_body_is_gemini_s() -> None:
    req = request(max_output_tokens=5)
    vertex, gemini = codec.encode_request(req, TARGET), GeminiCodec().encode_request(req, TARGET)
    assert vertex.path == "models/gemini-2.5-flash:generateContent"
    assert gemini.path == "v1beta/models/gemini-2.5-flash:generateContent"
    assert vertex.body == gemini.body and vertex.headers == gemini.headers
    streamed = codec.encode_request(request(stream=True), Target("models/gemini-2.5-pro"))
    assert streamed.path == "models/gemini-2.5-pro:streamGenerateContent?alt=sse" and streamed.stream
    assert generate_path("gemini-2.5-flash", False) == gemini.path, "the Gemini API's default is unchanged"


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


async def call(
    client: httpx.AsyncClient, req: CanonicalRequest, faults: str = "", headers: dict[str, str] | None = None
) -> httpx.Response:
    upstream = codec.encode_request(req, TARGET)
    prefix = f"/_fault/{faults}" if faults else ""
    sent = {**upstream.headers, **(BEARER if headers is None else headers)}
    return await client.post(f"{prefix}{BASE}{upstream.path}", content=upstream.body, headers=sent)


async def streamed(client: httpx.AsyncClient, req: CanonicalRequest, faults: str = "") -> list[StreamEvent]:
    resp = await call(client, req, faults)
    assert resp.status_code == 200, resp.text
    parser = SseParser()

    async def frames() -> AsyncIterator[SseEvent]:
        for event in parser.feed(resp.content):
            yield event

    return [event async for event in codec.decode_stream(frames())]


async def test_buffered_and_streamed_answers_on_the_vertex_path(client: httpx.AsyncClient, mock: MockServer) -> None:
    resp = await call(client, request())
    assert resp.status_code == 200, resp.text
    answer = codec.decode_response(200, resp.content)
    assert answer.content is not None and "hallo Zürich" in answer.content
    events = await streamed(client, request(stream=True))
    assert type(events[0]) is StreamStart
    assert "hallo Zürich" in "".join(e.text for e in events if type(e) is TextDelta)
    assert StreamFinish("stop") in events
    log = mock.app.requests
    assert [(r["format"], r["model"], r["stream"], r["status"]) for r in log] == [
        ("vertex", "gemini-2.5-flash", False, 200),
        ("vertex", "gemini-2.5-flash", True, 200),
    ]


@pytest.mark.parametrize("headers", [{}, {"x-goog-api-key": "an-api-key"}, {"authorization": "Basic dXNlcjpwYXNz"}])
async def test_without_a_bearer_token_vertex_answers_unauthenticated(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    resp = await call(client, request(), headers=headers)
    assert resp.status_code == 401
    assert resp.json()["error"]["status"] == "UNAUTHENTICATED"
    assert codec.decode_error(401, resp.headers, resp.content).category is C.AUTHENTICATION


async def test_a_bearer_token_does_not_open_the_gemini_api_path(client: httpx.AsyncClient) -> None:
    upstream = GeminiCodec().encode_request(request(), TARGET)
    resp = await client.post(
        f"/_fault/require_auth=1/{upstream.path}", content=upstream.body, headers={**upstream.headers, **BEARER}
    )
    assert resp.status_code == 401


@pytest.mark.parametrize(
    "path",
    [
        "/v1/projects/p/locations/l/publishers/google/models/m:countTokens",
        "/v1/projects/p/locations/l/publishers/meta/models/m:generateContent",
        "/v1/projects/p/publishers/google/models/m:generateContent",
        "/v1/projects/p/locations/l/publishers/google/models/a/b:generateContent",
    ],
)
async def test_other_vertex_paths_are_not_found(client: httpx.AsyncClient, path: str) -> None:
    resp = await client.post(path, json={"contents": []}, headers=BEARER)
    assert resp.status_code == 404


async def test_status_faults_reach_the_codec_as_gemini_errors(client: httpx.AsyncClient) -> None:
    resp = await call(client, request(), faults="status=429,retry_after=3")
    error = codec.decode_error(resp.status_code, resp.headers, resp.content)
    assert (error.category, error.retry_after) == (C.RATE_LIMIT, 3)


async def test_stream_faults_reach_the_codec(client: httpx.AsyncClient) -> None:
    with pytest.raises(UpstreamError) as info:
        await streamed(client, request(stream=True), faults="midstream_error=2")
    assert info.value.category is C.OVERLOADED
    with pytest.raises(UpstreamError) as info:
        await streamed(client, request(stream=True), faults="abort_after=1")
    assert info.value.category in (C.MALFORMED, C.TRUNCATED)
