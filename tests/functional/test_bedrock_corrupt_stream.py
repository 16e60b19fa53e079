"""A Bedrock event stream whose framing breaks (a message or prelude CRC that does not hold), through
the real gateway and the mock's ``corrupt_frame`` fault.

Before the first token the attempt is a malformed-response failure like any other: the next route
serves the request, or, with none left, the client gets a clean error envelope. After the first
token the client has output it cannot take back: the stream ends with its format's error event and
no second attempt is made. Never a 5xx crash, never a hang (every request is bounded by the test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.asgi_gateway import asgi_gateway, isolate_aws, one_principal
from tollway.mock.app import MockApp
from tollway.mock.server import MockServerThread

KEY = "tw-bedrock-corrupt-key-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
MODES = ("crc", "prelude")


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread(MockApp()) as server:
        yield server


def _config(mock_url: str) -> dict[str, Any]:
    bedrock = {"type": "bedrock", "awsRegion": "eu-west-1", "providerAccountId": "aws", "quotaGroupId": "aws"}
    providers: dict[str, Any] = {"healthy": {**bedrock, "baseUrl": mock_url, "quotaGroupId": "aws-healthy"}}
    models: list[dict[str, Any]] = []
    for mode in MODES:
        for where, k in (("first", 0), ("mid", 3)):
            pid = f"corrupt-{where}-{mode}"
            # paced, so that the tokens before the corrupt frame reach the client before it arrives: a
            # corrupt message in the same read as the first token would fail the attempt before output
            pace = ",chunk_gap_ms=250" if k else ""
            fault = f"/_fault/corrupt_frame={k},corrupt_mode={mode},chunks=4{pace}"
            providers[pid] = {**bedrock, "baseUrl": mock_url + fault, "quotaGroupId": pid}
            route = {"model": MODEL, "providerFormat": "bedrock-converse"}
            models.append(
                {
                    "name": f"fallback-{where}-{mode}",
                    "strategy": "ordered",
                    "routes": [
                        {"id": f"{pid}-a", "provider": pid, "priority": 0, **route},
                        {"id": f"{pid}-b", "provider": "healthy", "priority": 1, **route},
                    ],
                }
            )
            models.append({"name": f"only-{where}-{mode}", "routes": [{"id": f"{pid}-only", "provider": pid, **route}]})
    return {
        "providers": providers,
        "models": models,
        "routing": {"maxAttempts": 2, "baseBackoffMs": 1, "maxBackoffMs": 5},
        "principals": one_principal(KEY, [m["name"] for m in models]),
    }


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    isolate_aws(monkeypatch, tmp_path)
    async with asgi_gateway(tmp_path, _config(mock.base_url)) as http:
        mock.app.clear_requests()
        yield http


def chat(alias: str) -> dict[str, Any]:
    return {"model": alias, "messages": [{"role": "user", "content": "Grüße aus Köln"}], "stream": True}


def sse_data(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)


@pytest.mark.parametrize("mode", MODES)
async def test_corruption_before_the_first_token_falls_back_to_the_next_route(
    client: Any, mock: MockServerThread, mode: str
) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(f"fallback-first-{mode}"), headers=AUTH)
    assert resp.status_code == 200, resp.text
    chunks = sse_data(resp.text)
    assert "Grüße aus Köln" in streamed_text(chunks)
    assert not any("error" in c for c in chunks)
    assert resp.text.rstrip().endswith("data: [DONE]")
    assert [r["path"].startswith("/_fault/") for r in mock.app.requests] == [True, False]


@pytest.mark.parametrize("mode", MODES)
async def test_corruption_before_the_first_token_with_no_route_left_is_a_clean_error(
    client: Any, mock: MockServerThread, mode: str
) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(f"only-first-{mode}"), headers=AUTH)
    assert resp.status_code in (502, 503), resp.text
    error = resp.json()["error"]
    assert error["code"] and error["message"]
    assert "crc" not in resp.text.lower() and "prelude" not in resp.text.lower()
    assert len(mock.app.requests) >= 1


@pytest.mark.parametrize("mode", MODES)
async def test_corruption_after_the_first_token_ends_the_stream_with_an_error_event(
    client: Any, mock: MockServerThread, mode: str
) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(f"fallback-mid-{mode}"), headers=AUTH)
    assert resp.status_code == 200, resp.text
    chunks = sse_data(resp.text)
    assert streamed_text(chunks), "the tokens before the corrupt frame reached the client"
    errors = [c["error"] for c in chunks if "error" in c]
    assert len(errors) == 1 and errors[0]["message"]
    assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks)
    assert len(mock.app.requests) == 1, "no second attempt once output reached the client"


@pytest.mark.parametrize("mode", MODES)
async def test_an_anthropic_client_gets_its_error_event_after_the_first_token(
    client: Any, mock: MockServerThread, mode: str
) -> None:
    body = {**chat(f"fallback-mid-{mode}"), "max_tokens": 100}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    resp = await client.post("/v1/messages", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    events = [orjson.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    assert any(e["type"] == "content_block_delta" for e in events)
    assert events[-1]["type"] == "error"
    assert not any(e["type"] == "message_stop" for e in events)
    assert len(mock.app.requests) == 1
