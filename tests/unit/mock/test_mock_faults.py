"""Fault injection over real HTTP: statuses, retries, latency, stalls, truncation, corruption, auth."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from tollway.mock import MockServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
OPENAI = {"model": "mock-gpt", "messages": [{"role": "user", "content": "one two three four five six"}]}
ANTHROPIC = {"model": "mock-claude", "max_tokens": 100, "messages": [{"role": "user", "content": "one two three"}]}


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


def fault(spec: str, path: str) -> str:
    return f"/_fault/{spec}{path}"


def stream_body(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True}


def sse(text: str) -> list[tuple[str | None, str]]:
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


def content_deltas(text: str) -> list[str]:
    """The complete OpenAI content-delta frames in a (possibly truncated) stream."""
    complete = text[: text.rfind("\n\n") + 2] if "\n\n" in text else ""
    out = []
    for _, data in sse(complete):
        if data.startswith("{") and data != "{not json":
            chunk = orjson.loads(data)
            if (
                chunk.get("choices")
                and "content" in chunk["choices"][0]["delta"]
                and chunk["choices"][0]["delta"]["content"]
            ):
                out.append(chunk["choices"][0]["delta"]["content"])
    return out


async def read_until_timeout(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float
) -> tuple[int, str]:
    """POST and stream the body until the read times out; returns the status and what arrived."""
    received = []
    async with client.stream("POST", path, json=body, timeout=httpx.Timeout(5, read=timeout)) as response:
        with pytest.raises(httpx.ReadTimeout):
            async for text in response.aiter_text():
                received.append(text)
        return response.status_code, "".join(received)


OPENAI_ERRORS = [
    (400, "invalid_request_error", "invalid_request"),
    (401, "invalid_request_error", "invalid_api_key"),
    (429, "requests", "rate_limit_exceeded"),
    (500, "server_error", "server_error"),
    (503, "server_error", "overloaded"),
]
ANTHROPIC_ERRORS = [
    (400, "invalid_request_error"),
    (401, "authentication_error"),
    (429, "rate_limit_error"),
    (500, "api_error"),
    (503, "overloaded_error"),
    (529, "overloaded_error"),
]


@pytest.mark.parametrize(("status", "kind", "code"), OPENAI_ERRORS)
async def test_status_fault_uses_the_openai_error_envelope(
    client: httpx.AsyncClient, status: int, kind: str, code: str
) -> None:
    response = await client.post(fault(f"status={status}", CHAT), json=OPENAI)

    assert response.status_code == status
    assert response.json() == {
        "error": {"message": f"Mock fault: HTTP {status}", "type": kind, "param": None, "code": code}
    }
    assert "retry-after" not in response.headers


@pytest.mark.parametrize(("status", "kind"), ANTHROPIC_ERRORS)
async def test_status_fault_uses_the_anthropic_error_envelope(
    client: httpx.AsyncClient, status: int, kind: str
) -> None:
    response = await client.post(fault(f"status={status}", MESSAGES), json=ANTHROPIC)

    assert response.status_code == status
    assert response.json() == {"type": "error", "error": {"type": kind, "message": f"Mock fault: HTTP {status}"}}


async def test_retry_after_headers_and_error_type_override(client: httpx.AsyncClient) -> None:
    spec = "status=429,retry_after=2,retry_after_ms=1500,error_type=insufficient_quota"
    chat = await client.post(fault(spec, CHAT), json=OPENAI)
    claude = await client.post(fault("status=529,retry_after=0.5", MESSAGES), json=ANTHROPIC)

    assert chat.headers["retry-after"] == "2"
    assert chat.headers["retry-after-ms"] == "1500"
    assert chat.json()["error"]["type"] == chat.json()["error"]["code"] == "insufficient_quota"
    assert claude.headers["retry-after"] == "0.5"


async def test_fail_first_fails_n_requests_per_distinct_spec_then_succeeds(client: httpx.AsyncClient) -> None:
    path = fault("status=500,fail_first=2", CHAT)
    other = fault("status=500,fail_first=2,tag=b", CHAT)

    statuses = [(await client.post(path, json=OPENAI)).status_code for _ in range(4)]
    other_statuses = [(await client.post(other, json=OPENAI)).status_code for _ in range(3)]

    assert statuses == [500, 500, 200, 200]
    assert other_statuses == [500, 500, 200]


async def test_fail_first_alone_means_503_and_gates_stream_faults(client: httpx.AsyncClient) -> None:
    alone = [(await client.post(fault("fail_first=1", MESSAGES), json=ANTHROPIC)).status_code for _ in range(2)]
    path = fault("fail_first=1,midstream_error=1", CHAT)
    failed = (await client.post(path, json=stream_body(OPENAI))).text
    healed = (await client.post(path, json=stream_body(OPENAI))).text

    assert alone == [503, 200]
    assert "[DONE]" not in failed
    assert healed.endswith("data: [DONE]\n\n")


async def test_delay_waits_before_headers(client: httpx.AsyncClient) -> None:
    started = time.perf_counter()
    response = await client.post(fault("delay_ms=150", CHAT), json=OPENAI)
    delayed = time.perf_counter() - started
    started = time.perf_counter()
    await client.post(fault("latency_ms=0", CHAT), json=OPENAI)
    immediate = time.perf_counter() - started

    assert response.status_code == 200
    assert delayed >= 0.15
    assert immediate < 0.1


async def test_ttft_and_chunk_gap_pace_the_stream(client: httpx.AsyncClient) -> None:
    arrivals: list[float] = []
    path = fault("ttft_ms=120,chunk_gap_ms=60,chunks=3", CHAT)
    async with client.stream("POST", path, json=stream_body(OPENAI)) as response:
        headers_at = time.perf_counter()
        async for line in response.aiter_lines():
            if '"content":"' in line and '"role"' not in line:
                arrivals.append(time.perf_counter())

    assert len(arrivals) == 3
    assert arrivals[0] - headers_at >= 0.1
    assert arrivals[1] - arrivals[0] >= 0.05
    assert arrivals[2] - arrivals[1] >= 0.05


async def test_short_stall_before_headers_then_answers(client: httpx.AsyncClient) -> None:
    started = time.perf_counter()
    response = await client.post(fault("stall_ms=200", CHAT), json=OPENAI)

    assert response.status_code == 200
    assert time.perf_counter() - started >= 0.2


async def test_default_stall_hangs_until_the_client_gives_up(client: httpx.AsyncClient, mock: MockServer) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await client.post(fault("stall_at=-1", CHAT), json=OPENAI, timeout=httpx.Timeout(5, read=0.2))
    after = await client.post(CHAT, json=OPENAI)

    assert after.status_code == 200
    assert [r["status"] for r in mock.app.requests] == [None, 200]


async def test_stall_after_headers_of_a_buffered_response(client: httpx.AsyncClient) -> None:
    status, received = await read_until_timeout(client, fault("stall_at=0", CHAT), OPENAI, 0.2)

    assert status == 200
    assert received == ""


async def test_stall_mid_stream_after_k_content_chunks(client: httpx.AsyncClient) -> None:
    status, received = await read_until_timeout(client, fault("stall_at=2", CHAT), stream_body(OPENAI), 0.25)

    assert status == 200
    assert content_deltas(received) == ["Mock ", "reply #6: "]
    assert "[DONE]" not in received


async def test_abort_after_truncates_the_stream(client: httpx.AsyncClient) -> None:
    chat = (await client.post(fault("abort_after=2", CHAT), json=stream_body(OPENAI))).text
    claude = (await client.post(fault("abort_after=1", MESSAGES), json=stream_body(ANTHROPIC))).text

    assert content_deltas(chat) == ["Mock ", "reply #6: "]
    assert not chat.endswith("\n\n")
    assert "[DONE]" not in chat
    complete, partial = claude[: claude.rfind("\n\n") + 2], claude[claude.rfind("\n\n") + 2 :]
    assert [name for name, _ in sse(complete)] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
    ]
    assert partial.startswith("event: content_block_delta\ndata: {")
    assert "message_stop" not in claude


async def test_abort_after_beyond_the_last_chunk_drops_only_the_terminal_frames(client: httpx.AsyncClient) -> None:
    text = (await client.post(fault("abort_after=99", CHAT), json=stream_body(OPENAI))).text

    assert "".join(content_deltas(text)) == "Mock reply #6: one two three four five six"
    assert '"finish_reason":"stop"' not in text.rsplit("\n\n", 1)[0]
    assert "[DONE]" not in text


async def test_abort_of_a_buffered_response_truncates_the_json(client: httpx.AsyncClient) -> None:
    response = await client.post(fault("abort_after=0", CHAT), json=OPENAI)

    assert response.status_code == 200
    assert response.text.startswith('{"id":"chatcmpl-')
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


async def test_abort_mode_reset_drops_the_connection(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="uvicorn.error")
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post(fault("abort_after=1,abort_mode=reset", CHAT), json=stream_body(OPENAI))


async def test_malformed_replaces_the_kth_content_frame(client: httpx.AsyncClient) -> None:
    chat = sse((await client.post(fault("malformed=2", CHAT), json=stream_body(OPENAI))).text)
    claude = sse((await client.post(fault("malformed=1", MESSAGES), json=stream_body(ANTHROPIC))).text)

    assert [data for _, data in chat].index("{not json") == 2
    assert chat[-1] == (None, "[DONE]")
    assert sum(data == "{not json" for _, data in chat) == 1
    assert claude[3] == ("content_block_delta", "{not json")
    assert claude[-1][0] == "message_stop"


async def test_malformed_buffered_response_is_not_json(client: httpx.AsyncClient) -> None:
    response = await client.post(fault("malformed=1", MESSAGES), json=ANTHROPIC)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


async def test_midstream_error_sends_an_error_frame_and_ends(client: httpx.AsyncClient) -> None:
    chat = sse((await client.post(fault("midstream_error=2", CHAT), json=stream_body(OPENAI))).text)
    claude = sse((await client.post(fault("midstream_error=1", MESSAGES), json=stream_body(ANTHROPIC))).text)

    assert len(chat) == 1 + 2 + 1
    assert orjson.loads(chat[-1][1]) == {
        "error": {"message": "Mock midstream error", "type": "server_error", "param": None, "code": "server_error"}
    }
    assert [name for name, _ in claude] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "error",
    ]
    assert orjson.loads(claude[-1][1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }


async def test_require_auth_checks_each_formats_own_header(client: httpx.AsyncClient) -> None:
    chat_path, claude_path = fault("require_auth=1", CHAT), fault("require_auth=1", MESSAGES)
    chat_none = await client.post(chat_path, json=OPENAI)
    chat_bearer = await client.post(chat_path, json=OPENAI, headers={"authorization": "Bearer sk-test"})
    claude_bearer = await client.post(claude_path, json=ANTHROPIC, headers={"authorization": "Bearer sk-test"})
    claude_key = await client.post(claude_path, json=ANTHROPIC, headers={"x-api-key": "sk-ant-test"})

    assert chat_none.status_code == 401
    assert chat_none.json()["error"]["code"] == "invalid_api_key"
    assert chat_bearer.status_code == 200
    assert claude_bearer.status_code == 401
    assert claude_bearer.json()["error"]["type"] == "authentication_error"
    assert claude_key.status_code == 200


async def test_headers_override_path_faults(client: httpx.AsyncClient) -> None:
    response = await client.post(
        fault("status=500,retry_after=9", CHAT),
        json=OPENAI,
        headers={"x-mock-status": "429", "x-mock-retry-after": "1"},
    )
    healed = await client.post(CHAT, json=OPENAI, headers={"x-mock-words": "2"})

    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert healed.json()["choices"][0]["message"]["content"] == "Mock reply #2: one two"


async def test_invalid_fault_specs_are_rejected_in_the_formats_shape(client: httpx.AsyncClient) -> None:
    unknown = await client.post(fault("bogus=1", CHAT), json=OPENAI)
    not_int = await client.post(fault("status=abc", MESSAGES), json=ANTHROPIC)
    bad_header = await client.post(CHAT, json=OPENAI, headers={"x-mock-status": "200"})

    assert unknown.status_code == 400
    assert "bogus" in unknown.json()["error"]["message"]
    assert not_int.status_code == 400
    assert not_int.json()["error"]["type"] == "invalid_request_error"
    assert "status" in not_int.json()["error"]["message"]
    assert bad_header.status_code == 400


async def test_fault_prefix_without_a_route_is_404(client: httpx.AsyncClient) -> None:
    bare = await client.post("/_fault/status=500", json=OPENAI)
    elsewhere = await client.post(fault("status=500", "/v1/unknown"), json=OPENAI)

    assert bare.status_code == 404
    assert elsewhere.status_code == 404


async def test_down_for_fails_until_the_window_after_the_first_request_passes(client: httpx.AsyncClient) -> None:
    path = fault("down_for_ms=300", CHAT)
    first = (await client.post(path, json=OPENAI)).status_code
    deadline = time.monotonic() + 10
    statuses = []
    while time.monotonic() < deadline:
        status = (await client.post(path, json=OPENAI)).status_code
        statuses.append(status)
        if status == 200:
            break
    assert first == 503
    assert statuses[-1] == 200, "recovers once the window has passed"
    assert (await client.post(path, json=OPENAI)).status_code == 200, "and stays recovered"
    assert (await client.post(fault("down_for_ms=60000,status=500", CHAT), json=OPENAI)).status_code == 500


async def test_no_done_ends_after_the_finish_without_the_terminal_frame(client: httpx.AsyncClient) -> None:
    body = {**stream_body(OPENAI), "stream_options": {"include_usage": True}}
    chat = (await client.post(fault("no_done=1", CHAT), json=body)).text
    claude = (await client.post(fault("no_done=1", MESSAGES), json=stream_body(ANTHROPIC))).text

    assert '"finish_reason":"stop"' in chat and '"usage":{"prompt_tokens"' in chat
    assert "[DONE]" not in chat and chat.endswith("}\n\n")
    assert '"stop_reason":"end_turn"' in claude and "message_stop" not in claude


async def test_context_window_refuses_longer_prompts_in_each_formats_words(client: httpx.AsyncClient) -> None:
    long_chat = {**OPENAI, "messages": [{"role": "user", "content": "word " * 40}]}
    long_claude = {**ANTHROPIC, "messages": [{"role": "user", "content": "word " * 40}]}
    short = await client.post(fault("context_window=20", CHAT), json=OPENAI)
    chat = await client.post(fault("context_window=20", CHAT), json=long_chat)
    claude = await client.post(fault("context_window=20", MESSAGES), json=long_claude)

    assert short.status_code == 200
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 20 tokens" in chat.json()["error"]["message"]
    assert (
        claude.status_code == 400 and claude.json()["error"]["message"] == "prompt is too long: 50 tokens > 20 maximum"
    )


async def test_a_prefill_is_continued_unless_no_prefill_refuses_it(client: httpx.AsyncClient) -> None:
    prefill = {"role": "assistant", "content": "Mock reply #6: one two"}
    body = stream_body({**OPENAI, "messages": [*OPENAI["messages"], prefill]})
    continued = (await client.post(CHAT, json=body)).text
    refused = await client.post(fault("no_prefill=1", CHAT), json=body)
    plain = await client.post(fault("no_prefill=1", CHAT), json=OPENAI)

    assert "".join(content_deltas(continued)) == " three four five six"
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
    assert plain.status_code == 200


async def test_no_reply_cache_builds_the_same_reply_afresh(client: httpx.AsyncClient) -> None:
    from tollway.mock.content import text_reply

    body = {**OPENAI, "messages": [{"role": "user", "content": "a prompt seen only by this test"}]}
    text_reply.cache_clear()
    fresh = await client.post(fault("no_reply_cache=1", CHAT), json=body)
    after_fresh = text_reply.cache_info()
    memoized = await client.post(CHAT, json=body)
    again = await client.post(CHAT, json=body)

    assert fresh.status_code == memoized.status_code == 200
    assert fresh.json()["choices"] == memoized.json()["choices"] == again.json()["choices"]
    assert after_fresh.misses == 0 and after_fresh.currsize == 0  # built without touching the memo
    assert text_reply.cache_info().hits == 1 and text_reply.cache_info().misses == 1
