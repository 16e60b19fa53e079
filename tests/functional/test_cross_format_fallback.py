"""Fallback across provider formats: a failing route in one format, the next priority group in another.

Each alias's priority-0 route is a provider of one format whose base URL carries the mock's
``status=503`` fault, so it fails before any response header; its priority-1 route is a provider of
another format on the healthy mock. The four formats fail in turn and each is a fallback once
(OpenAI → Anthropic → Gemini → Bedrock → OpenAI). A Chat Completions client (buffered, and streamed
with a tool) and a Messages client must get the fallback's answer in their own format, and the
mock's request log must show both attempts, the failed one first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.asgi_gateway import asgi_gateway, isolate_aws, one_principal
from tollway.mock.server import MockServerThread

KEY = "tw-cross-format-key-0001"
PROVIDER_KEY_ENV = "TOLLWAY_XFORMAT_PROVIDER_KEY"
CHAT_AUTH = {"authorization": f"Bearer {KEY}"}
MESSAGES_AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
FAILING = "status=503"
PROMPT = "Greetings from the fallback test"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

FORMATS: dict[str, dict[str, Any]] = {
    "openai-chat-completions": {"type": "openai-compatible", "path": "/v1", "model": "xf-gpt", "mock": "openai"},
    "anthropic-messages": {"type": "anthropic", "path": "", "model": "xf-claude", "mock": "anthropic"},
    "gemini": {"type": "gemini", "path": "", "model": "xf-gemini", "mock": "gemini"},
    "bedrock-converse": {
        "type": "bedrock",
        "path": "",
        "model": "anthropic.xf-claude-v1:0",
        "mock": "bedrock",
    },
}
PAIRS = [
    ("openai-chat-completions", "anthropic-messages"),
    ("anthropic-messages", "gemini"),
    ("gemini", "bedrock-converse"),
    ("bedrock-converse", "openai-chat-completions"),
]
"""(failing format, fallback format): every format fails once and answers once."""


def _provider(fmt: str, mock_url: str, fault: str = "") -> dict[str, Any]:
    spec = FORMATS[fmt]
    base = mock_url + (f"/_fault/{fault}" if fault else "") + spec["path"]
    provider: dict[str, Any] = {
        "type": spec["type"],
        "baseUrl": base,
        "providerAccountId": f"acct-{fmt}-{fault or 'ok'}",
        "quotaGroupId": f"quota-{fmt}-{fault or 'ok'}",
        "connectTimeoutMs": 1000,
        "requestTimeoutMs": 5000,
    }
    if spec["type"] == "bedrock":
        provider["awsRegion"] = "eu-west-1"
    else:
        provider["credentials"] = [{"id": "c", "secretRef": f"env:{PROVIDER_KEY_ENV}"}]
    return provider


def _config(mock_url: str, failing: str, fallback: str) -> dict[str, Any]:
    routes = [
        {
            "id": "primary",
            "provider": "failing",
            "model": FORMATS[failing]["model"],
            "providerFormat": failing,
            "priority": 0,
        },
        {
            "id": "fallback",
            "provider": "fallback",
            "model": FORMATS[fallback]["model"],
            "providerFormat": fallback,
            "priority": 1,
        },
    ]
    return {
        "providers": {
            "failing": _provider(failing, mock_url, FAILING),
            "fallback": _provider(fallback, mock_url),
        },
        "models": [{"name": "xf", "capabilities": ["streaming", "tools"], "routes": routes}],
        "routing": {
            "maxAttempts": 2,
            "baseBackoffMs": 1,
            "maxBackoffMs": 5,
            # Every request must try the failing route first: no circuit opens, no route is ejected.
            "circuitBreaker": {"failureThreshold": 50},
            "outlierDetection": {"enabled": False},
        },
        "principals": one_principal(KEY, ["xf"]),
    }


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
def isolated_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy AWS credentials for the Bedrock routes, and no other source of any."""
    isolate_aws(monkeypatch, tmp_path)


class Gateway:
    def __init__(self, client: httpx.AsyncClient, mock: MockServerThread, failing: str, fallback: str) -> None:
        self.client, self.mock = client, mock
        self.failing, self.fallback = FORMATS[failing], FORMATS[fallback]

    def attempts(self) -> list[tuple[str, str | None, bool, int | None]]:
        """The mock's log since the last call, oldest first: (format, model, stream, status)."""
        log = [(r["format"], r["model"], r["stream"], r["status"]) for r in self.mock.app.requests]
        self.mock.app.clear_requests()
        return log

    def assert_fell_back(self, stream: bool) -> None:
        """Exactly two attempts: the failing route's (a 503, logged first), then the fallback's."""
        assert self.attempts() == [
            (self.failing["mock"], self.failing["model"], stream, 503),
            (self.fallback["mock"], self.fallback["model"], stream, 200),
        ]


@pytest.fixture(params=PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
async def gateway(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mock: MockServerThread,
    monkeypatch: pytest.MonkeyPatch,
    isolated_aws: None,
) -> AsyncIterator[Gateway]:
    failing, fallback = request.param
    monkeypatch.setenv(PROVIDER_KEY_ENV, "sk-cross-format-provider")
    async with asgi_gateway(tmp_path, _config(mock.base_url, failing, fallback)) as client:
        mock.app.clear_requests()
        yield Gateway(client, mock, failing, fallback)


def data_frames(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_a_buffered_chat_completion_is_answered_by_the_fallback(gateway: Gateway) -> None:
    body = {"model": "xf", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}
    resp = await gateway.client.post("/v1/chat/completions", json=body, headers=CHAT_AUTH)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "xf"
    (choice,) = answer["choices"]
    assert PROMPT in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] > 0
    gateway.assert_fell_back(stream=False)


async def test_a_streamed_tool_call_falls_back_before_its_first_token(gateway: Gateway) -> None:
    body = {
        "model": "xf",
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
    }
    resp = await gateway.client.post("/v1/chat/completions", json=body, headers=CHAT_AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text.rstrip().endswith("data: [DONE]")
    chunks = data_frames(resp.text)
    assert all("error" not in c for c in chunks)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1, "one answer, not the start of one and then another"
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    opened = [tc for tc in calls if tc.get("id")]
    assert [tc["function"]["name"] for tc in opened] == ["get_weather"], "the call opens once: no token came before"
    assert isinstance(orjson.loads("".join(tc["function"].get("arguments", "") for tc in calls)), dict)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["tool_calls"]
    # The failed attempt is logged first, with a 503 before any header: the client saw no byte of it.
    gateway.assert_fell_back(stream=True)


async def test_a_messages_client_gets_the_fallbacks_answer_as_a_message(gateway: Gateway) -> None:
    body = {"model": "xf", "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]}
    resp = await gateway.client.post("/v1/messages", json=body, headers=MESSAGES_AUTH)
    assert resp.status_code == 200, resp.text
    message = resp.json()
    assert (message["type"], message["role"]) == ("message", "assistant")
    assert PROMPT in message["content"][0]["text"]
    assert message["stop_reason"] == "end_turn"
    gateway.assert_fell_back(stream=False)

    streamed = await gateway.client.post("/v1/messages", json={**body, "stream": True}, headers=MESSAGES_AUTH)
    assert streamed.status_code == 200, streamed.text
    events = data_frames(streamed.text)
    assert [e["type"] for e in events][:1] == ["message_start"]
    assert events[-1]["type"] == "message_stop"
    assert sum(e["type"] == "message_start" for e in events) == 1
    assert all(e["type"] != "error" for e in events)
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert PROMPT in text
    gateway.assert_fell_back(stream=True)
