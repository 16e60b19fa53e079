"""A conversation whose tool calls one provider made, continued on another.

Gemini 3's calls come back to the client with ids that carry their thought signature, hundreds of
characters long. A client that sends that conversation to an alias served by OpenAI (ids of at most
40 characters), Anthropic (``[a-zA-Z0-9_-]`` only) or Bedrock (both, at most 64) must be answered,
not refused by the provider; so must ids in another alphabet (``functions.get_weather:0``). The
mocks check ids, and that every call is answered by a result with its id, as the providers do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.asgi_gateway import asgi_gateway, isolate_aws, one_principal
from tollway.mock.server import MockServerThread

KEY = "tw-tool-ids-key-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MESSAGES_AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
PROVIDER_KEY_ENV = "TOLLWAY_TOOL_IDS_PROVIDER_KEY"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = {"role": "user", "content": "Weather in Oslo?"}
ROUTES = {
    "gemini-3": ("gemini", "gemini", "gemini-3-pro-preview"),
    "on-openai": ("openai-compatible", "openai-chat-completions", "gpt-4o"),
    "on-anthropic": ("anthropic", "anthropic-messages", "claude-sonnet-4-5"),
    "on-bedrock": ("bedrock", "bedrock-converse", "anthropic.claude-3-5-haiku-20241022-v1:0"),
}
MOCK_FORMAT = {"on-openai": "openai", "on-anthropic": "anthropic", "on-bedrock": "bedrock"}
OTHERS = ["on-openai", "on-anthropic", "on-bedrock"]


def _config(mock_url: str) -> dict[str, Any]:
    providers: dict[str, Any] = {}
    models = []
    for alias, (kind, fmt, model) in ROUTES.items():
        provider: dict[str, Any] = {
            "type": kind,
            "baseUrl": mock_url + ("/v1" if kind == "openai-compatible" else ""),
            "providerAccountId": f"acct-{alias}",
            "quotaGroupId": f"quota-{alias}",
        }
        if kind == "bedrock":
            provider["awsRegion"] = "eu-west-1"
        else:
            provider["credentials"] = [{"id": "c", "secretRef": f"env:{PROVIDER_KEY_ENV}"}]
        providers[alias] = provider
        route = {"id": alias, "provider": alias, "model": model, "providerFormat": fmt}
        models.append({"name": alias, "capabilities": ["streaming", "tools"], "routes": [route]})
    return {
        "providers": providers,
        "models": models,
        "routing": {"maxAttempts": 1},
        "principals": one_principal(KEY, list(ROUTES)),
    }


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv(PROVIDER_KEY_ENV, "sk-tool-ids-provider")
    async with asgi_gateway(tmp_path, _config(mock.base_url)) as http:
        mock.app.clear_requests()
        yield http


def _follow_up(alias: str, call: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    return {
        "model": alias,
        "tools": [WEATHER],
        "stream": stream,
        "messages": [
            QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 degrees"},
        ],
    }


async def _gemini_call(client: Any) -> dict[str, Any]:
    first = await client.post(
        "/v1/chat/completions",
        json={
            "model": "gemini-3",
            "messages": [QUESTION],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        headers=AUTH,
    )
    assert first.status_code == 200, first.text
    call: dict[str, Any] = first.json()["choices"][0]["message"]["tool_calls"][0]
    assert "__ts__" in call["id"] and len(call["id"]) > 300, call["id"]
    return call


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("alias", OTHERS)
async def test_a_gemini_conversation_continues_on_another_provider(
    client: Any, mock: MockServerThread, alias: str, stream: bool
) -> None:
    call = await _gemini_call(client)
    mock.app.clear_requests()
    answer = await client.post("/v1/chat/completions", json=_follow_up(alias, call, stream), headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert '"error"' not in answer.text
    assert [(r["format"], r["status"]) for r in mock.app.requests] == [(MOCK_FORMAT[alias], 200)]
    # The conversation goes back to Gemini with the signature where it was.
    again = await client.post("/v1/chat/completions", json=_follow_up("gemini-3", call), headers=AUTH)
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("alias", OTHERS)
async def test_ids_in_another_alphabet_reach_any_provider(client: Any, mock: MockServerThread, alias: str) -> None:
    call = {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    answer = await client.post("/v1/chat/completions", json=_follow_up(alias, call), headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert [(r["format"], r["status"]) for r in mock.app.requests] == [(MOCK_FORMAT[alias], 200)]


async def test_a_messages_client_moves_a_gemini_tool_use_to_bedrock(client: Any, mock: MockServerThread) -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    body: dict[str, Any] = {
        "model": "gemini-3",
        "max_tokens": 200,
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    }
    first = await client.post("/v1/messages", json=body, headers=MESSAGES_AUTH)
    assert first.status_code == 200, first.text
    use = next(b for b in first.json()["content"] if b["type"] == "tool_use")
    assert len(use["id"]) > 64
    mock.app.clear_requests()
    answer = await client.post(
        "/v1/messages",
        json={
            **body,
            "model": "on-bedrock",
            "tool_choice": {"type": "auto"},
            "messages": [
                *body["messages"],
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"}]},
            ],
        },
        headers=MESSAGES_AUTH,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["type"] == "message"
    assert [(r["format"], r["status"]) for r in mock.app.requests] == [("bedrock", 200)]
