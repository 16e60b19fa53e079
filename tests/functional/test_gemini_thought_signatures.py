"""Gemini 3's thought signatures across a tool-calling conversation through the gateway.

The mock signs a Gemini 3 model's function calls (``thoughtSignature`` on the call's part) and, as
Gemini 3 does, refuses a conversation that sends a call back without its signature. The gateway
keeps no state: the signature rides in the tool call's id, which every client format sends back,
so the follow-up turn reaches Gemini with the signature where it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.asgi_gateway import asgi_gateway, one_principal
from tollway.mock.app import MockApp
from tollway.mock.server import MockServerThread

KEY = "tw-gemini-signatures-key-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "gemini-3-pro-preview"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread(MockApp()) as server:
        yield server


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_TEST_GEMINI_KEY", "gemini-test-key")
    cfg = {
        "providers": {
            "gemini": {
                "type": "gemini",
                "baseUrl": mock.base_url,
                "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_TEST_GEMINI_KEY"}],
                "providerAccountId": "g",
                "quotaGroupId": "g",
            }
        },
        "models": [
            {
                "name": "gemini-3",
                "capabilities": ["streaming", "tools"],
                "routes": [{"id": "g3", "provider": "gemini", "model": MODEL, "providerFormat": "gemini"}],
            }
        ],
        "routing": {"maxAttempts": 1},
        "principals": one_principal(KEY, ["gemini-3"]),
    }
    async with asgi_gateway(tmp_path, cfg) as http:
        mock.app.clear_requests()
        yield http


QUESTION = {"role": "user", "content": "Wetter in Köln?"}
FORCED = {"type": "function", "function": {"name": "get_weather"}}


def follow_up(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "gemini-3",
        "tools": [WEATHER],
        "messages": [
            QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sonnig, 21 Grad"},
        ],
    }


async def test_a_buffered_tool_call_keeps_its_signature_into_the_next_turn(client: Any) -> None:
    first = await client.post(
        "/v1/chat/completions",
        json={"model": "gemini-3", "messages": [QUESTION], "tools": [WEATHER], "tool_choice": FORCED},
        headers=AUTH,
    )
    assert first.status_code == 200, first.text
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    assert "__ts__" in call["id"]
    answer = await client.post("/v1/chat/completions", json=follow_up(call), headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert "sonnig, 21 Grad" in answer.json()["choices"][0]["message"]["content"]


async def test_a_streamed_tool_call_keeps_its_signature_into_the_next_turn(client: Any) -> None:
    first = await client.post(
        "/v1/chat/completions",
        json={"model": "gemini-3", "messages": [QUESTION], "tools": [WEATHER], "tool_choice": FORCED, "stream": True},
        headers=AUTH,
    )
    assert first.status_code == 200, first.text
    deltas = [
        tc
        for line in first.text.splitlines()
        if line.startswith("data: {")
        for c in [orjson.loads(line[6:])]
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    call = {
        "id": deltas[0]["id"],
        "type": "function",
        "function": {
            "name": deltas[0]["function"]["name"],
            "arguments": "".join(d["function"].get("arguments", "") for d in deltas),
        },
    }
    answer = await client.post("/v1/chat/completions", json=follow_up(call), headers=AUTH)
    assert answer.status_code == 200, answer.text


async def test_a_messages_client_keeps_the_signature_in_its_tool_use_id(client: Any) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    body: dict[str, Any] = {
        "model": "gemini-3",
        "max_tokens": 200,
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Wetter in Köln?"}],
    }
    first = await client.post("/v1/messages", json=body, headers=headers)
    assert first.status_code == 200, first.text
    use = next(b for b in first.json()["content"] if b["type"] == "tool_use")
    assert "__ts__" in use["id"]
    answer = await client.post(
        "/v1/messages",
        json={
            **body,
            "tool_choice": {"type": "auto"},
            "messages": [
                *body["messages"],
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sonnig"}]},
            ],
        },
        headers=headers,
    )
    assert answer.status_code == 200, answer.text


async def test_a_call_sent_back_without_its_signature_is_refused_by_gemini_3(client: Any) -> None:
    first = await client.post(
        "/v1/chat/completions",
        json={"model": "gemini-3", "messages": [QUESTION], "tools": [WEATHER], "tool_choice": FORCED},
        headers=AUTH,
    )
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    stripped = {**call, "id": call["id"].split("__ts__")[0]}
    answer = await client.post("/v1/chat/completions", json=follow_up(stripped), headers=AUTH)
    assert answer.status_code == 400, answer.text
