"""Gemini on Vertex AI end to end: a published config, the real gateway app, the mock provider.

A ``vertex`` provider has no API key: each request carries an OAuth2 access token that the gateway
gets from Google credentials, here a service account key of the test's own whose ``token_uri`` is a
local token endpoint (``tests.support.google_token``). The mock serves Vertex's path and refuses
requests without a bearer token; the test checks every request carried a token the endpoint
issued, and that tokens are fetched per provider at publication, not per request.

Depends on the ``vertex`` wiring in ``config/root.py``, ``config/schema.py`` and
``config/validate.py``: until it lands, these tests fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.google_token import ServiceAccount
from tollway.config.loader import parse_config
from tollway.config.validate import validate
from tollway.exceptions import ConfigError
from tollway.mock.app import MockApp, Receive, Scope, Send
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-vertex-functional-key-0001"
ADMIN_KEY = "tw-vertex-functional-admin-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "gemini-2.5-flash"
PROJECT, LOCATION = "tollway-test", "europe-west4"
VERTEX_PATH = f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class RecordingMock(MockApp):
    """The mock, keeping the ``authorization`` header of each Vertex request."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[str | None] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "/publishers/google/models/" in scope["path"]:
            headers = dict(scope["headers"])
            value = headers.get(b"authorization")
            self.tokens.append(value.decode() if value is not None else None)
        await super().__call__(scope, receive, send)


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread(RecordingMock()) as server:
        yield server


@pytest.fixture
def account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceAccount]:
    with ServiceAccount(tmp_path) as sa:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(sa.key_file))
        yield sa


def _config(mock_url: str) -> dict[str, Any]:
    vertex = {
        "type": "vertex",
        "gcpProject": PROJECT,
        "gcpLocation": LOCATION,
        "providerAccountId": "gcp-tollway-test",
        "quotaGroupId": "gcp-tollway-test-europe-west4",
    }
    route = {"provider": "vertex", "model": MODEL, "providerFormat": "gemini"}
    return {
        "providers": {
            "vertex": {**vertex, "baseUrl": mock_url + VERTEX_PATH},
            "throttled": {**vertex, "baseUrl": mock_url + "/_fault/status=429,retry_after=2" + VERTEX_PATH},
        },
        "models": [
            {"name": "gemini-vertex", "capabilities": ["streaming", "tools"], "routes": [{"id": "v", **route}]},
            {"name": "gemini-throttled", "routes": [{"id": "t", **route, "provider": "throttled"}]},
        ],
        "routing": {"maxAttempts": 1, "baseBackoffMs": 1, "maxBackoffMs": 5},
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": ["gemini-vertex", "gemini-throttled"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            },
            {
                "id": "ops",
                "tenant": "t",
                "roles": ["admin"],
                "keys": [{"id": "a", "sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}],
            },
        ],
    }


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, account: ServiceAccount) -> AsyncIterator[Any]:
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock.base_url)))
    app = create_app(path, watch_interval_s=None)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=20)
    mock.app.clear_requests()
    recording = mock.app
    assert isinstance(recording, RecordingMock)
    recording.tokens.clear()
    yield http
    await http.aclose()
    await app.state.runtime.aclose()


def assert_bearer_tokens(mock: MockServerThread, account: ServiceAccount, count: int) -> None:
    """Every Vertex request carried a token the endpoint issued, fetched once per provider at
    publication (two providers here), none per request."""
    recording = mock.app
    assert isinstance(recording, RecordingMock)
    assert len(recording.tokens) == count
    assert len(account.endpoint.issued) == 2
    assert len(set(recording.tokens)) == 1
    assert set(recording.tokens) <= {f"Bearer {token}" for token in account.endpoint.issued}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_chat_completions_buffered_and_streamed_through_vertex(
    client: Any, mock: MockServerThread, account: ServiceAccount
) -> None:
    body = {"model": "gemini-vertex", "messages": [{"role": "user", "content": "Hallo aus Köln"}], "max_tokens": 64}
    buffered = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert buffered.status_code == 200, buffered.text
    answer = buffered.json()
    assert "Hallo aus Köln" in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["prompt_tokens"] > 0 and answer["usage"]["completion_tokens"] > 0

    streamed = await client.post(
        "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, headers=AUTH
    )
    assert streamed.status_code == 200, streamed.text
    chunks = sse_chunks(streamed.text)
    text = "".join((c["choices"] or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)
    assert "Hallo aus Köln" in text
    assert streamed.text.rstrip().endswith("data: [DONE]")

    log = mock.app.requests
    assert [(r["format"], r["model"], r["stream"], r["status"]) for r in log] == [
        ("vertex", MODEL, False, 200),
        ("vertex", MODEL, True, 200),
    ]
    assert [r["path"] for r in log] == [
        f"{VERTEX_PATH}models/{MODEL}:generateContent",
        f"{VERTEX_PATH}models/{MODEL}:streamGenerateContent",
    ]
    assert_bearer_tokens(mock, account, 2)


async def test_metrics_name_the_provider_vertex_ai_not_the_gemini_api(client: Any) -> None:
    body = {"model": "gemini-vertex", "messages": [{"role": "user", "content": "Hallo"}], "max_tokens": 16}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    scraped = await client.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert scraped.status_code == 200, scraped.text
    providers = {
        s.labels["gen_ai_provider_name"]
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
        if s.name == "tollway_attempts_total"
    }
    assert providers == {"gcp.vertex_ai"}


async def test_a_reload_waiting_on_a_token_does_not_hold_up_requests(
    tmp_path: Path, mock: MockServerThread, account: ServiceAccount
) -> None:
    """A reload that builds a Vertex transport fetches its first token; requests go on meanwhile."""
    cfg = _config(mock.base_url)
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    app = create_app(path, watch_interval_s=None)
    runtime = app.state.runtime
    release = threading.Event()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=20)
    try:
        cfg["providers"]["vertex-b"] = {**cfg["providers"]["vertex"], "quotaGroupId": "gcp-tollway-test-b"}
        route = {"id": "b", "provider": "vertex-b", "model": MODEL, "providerFormat": "gemini"}
        cfg["models"].append({"name": "gemini-b", "routes": [route]})
        cfg["principals"][0]["allowedModels"].append("gemini-b")
        path.write_text(yaml.safe_dump(cfg))
        account.endpoint.hold = release
        reload = asyncio.ensure_future(runtime.reload())
        assert await asyncio.to_thread(account.endpoint.holding.wait, 10), "the reload asks vertex-b's token"
        body = {"model": "gemini-vertex", "messages": [{"role": "user", "content": "Hallo"}], "max_tokens": 16}
        answer = await http.post("/v1/chat/completions", json=body, headers=AUTH)
        served_while_held = account.endpoint.holding.is_set()
        release.set()
        assert answer.status_code == 200, answer.text
        assert served_while_held, "the request waited for the reload's token grant: publication blocked the loop"
        assert await reload is True
        moved = await http.post("/v1/chat/completions", json={**body, "model": "gemini-b"}, headers=AUTH)
        assert moved.status_code == 200, moved.text
    finally:
        account.endpoint.hold = None
        release.set()
        await http.aclose()
        await runtime.aclose()


async def test_a_tool_call_round_trips_through_vertex(
    client: Any, mock: MockServerThread, account: ServiceAccount
) -> None:
    body = {
        "model": "gemini-vertex",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    first = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert first.status_code == 200, first.text
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    follow_up = {
        **body,
        "tool_choice": "auto",
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 degrees"},
        ],
    }
    answer = await client.post("/v1/chat/completions", json=follow_up, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert "sunny, 21 degrees" in answer.json()["choices"][0]["message"]["content"]
    assert_bearer_tokens(mock, account, 2)


async def test_a_messages_client_reaches_vertex(client: Any, mock: MockServerThread, account: ServiceAccount) -> None:
    body = {"model": "gemini-vertex", "max_tokens": 100, "messages": [{"role": "user", "content": "Grüße"}]}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    resp = await client.post("/v1/messages", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    assert "Grüße" in resp.json()["content"][0]["text"]
    assert_bearer_tokens(mock, account, 1)


async def test_vertex_throttling_answers_rate_limited_with_retry_after(
    client: Any, mock: MockServerThread, account: ServiceAccount
) -> None:
    body = {"model": "gemini-throttled", "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={**body, "stream": stream}, headers=AUTH)
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "rate_limited"
        assert resp.headers["retry-after"] == "2"
    assert_bearer_tokens(mock, account, 2)


def test_unreadable_google_credentials_fail_publication_naming_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "key.json"
    broken.write_text('{"type": "service_account", "private_key": "not a key"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(broken))
    cfg = _config("http://127.0.0.1:9")
    del cfg["providers"]["throttled"], cfg["models"][1]
    cfg["principals"][0]["allowedModels"] = ["gemini-vertex"]
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        create_app(path, watch_interval_s=None)
    assert [i.path for i in info.value.issues] == ["providers.vertex"]
    assert "Google credentials" in info.value.issues[0].message
    assert "not a key" not in info.value.issues[0].message


def test_a_refused_token_grant_fails_publication(tmp_path: Path, account: ServiceAccount) -> None:
    account.endpoint.fail = True
    cfg = _config("http://127.0.0.1:9")
    del cfg["providers"]["throttled"], cfg["models"][1]
    cfg["principals"][0]["allowedModels"] = ["gemini-vertex"]
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        create_app(path, watch_interval_s=None)
    assert [i.path for i in info.value.issues] == ["providers.vertex"]
    assert "account disabled" not in info.value.issues[0].message


def _issues(provider: dict[str, Any], route: dict[str, Any] | None = None) -> dict[str, str]:
    cfg = _config("http://127.0.0.1:9")
    cfg["providers"] = {"vertex": provider}
    cfg["models"] = [
        {"name": "gemini-vertex", "routes": [{"id": "v", "provider": "vertex", "model": MODEL, **(route or {})}]}
    ]
    cfg["models"][0]["routes"][0].setdefault("providerFormat", "gemini")
    cfg["principals"][0]["allowedModels"] = ["gemini-vertex"]
    return {i.path: i.message for i in validate(parse_config(cfg))}


VERTEX = {"type": "vertex", "providerAccountId": "a", "quotaGroupId": "q"}


def test_the_default_base_url_is_the_location_s_vertex_endpoint() -> None:
    regional = parse_config(
        {**_config(""), "providers": {"v": {**VERTEX, "gcpProject": "p-12345", "gcpLocation": "us-east5"}}}
    )
    assert regional.providers["v"].baseUrl == (
        "https://us-east5-aiplatform.googleapis.com/v1/projects/p-12345/locations/us-east5/publishers/google/"
    )
    world = parse_config(
        {**_config(""), "providers": {"v": {**VERTEX, "gcpProject": "p-12345", "gcpLocation": "global"}}}
    )
    assert world.providers["v"].baseUrl == (
        "https://aiplatform.googleapis.com/v1/projects/p-12345/locations/global/publishers/google/"
    )


def test_a_vertex_provider_needs_its_project_and_location() -> None:
    issues = _issues(dict(VERTEX))
    assert "providers.vertex.gcpProject" in issues and "providers.vertex.gcpLocation" in issues
    assert "providers.vertex.credentials" not in issues, "vertex takes no API key"


@pytest.mark.parametrize(
    ("field", "value"), [("gcpProject", "Bad/Project"), ("gcpLocation", "us-central1/../x"), ("gcpProject", "a")]
)
def test_a_malformed_project_or_location_is_refused(field: str, value: str) -> None:
    provider = {**VERTEX, "gcpProject": "tollway-test", "gcpLocation": "us-central1", field: value}
    assert f"providers.vertex.{field}" in _issues(provider)


def test_a_vertex_provider_takes_no_credentials_and_serves_only_gemini() -> None:
    provider = {
        **VERTEX,
        "gcpProject": "tollway-test",
        "gcpLocation": "us-central1",
        "credentials": [{"id": "k", "secretRef": "env:GOOGLE_KEY"}],
    }
    assert "providers.vertex.credentials" in _issues(provider)
    ok = {**VERTEX, "gcpProject": "tollway-test", "gcpLocation": "us-central1"}
    assert _issues(ok) == {}
    assert "models[0].routes[0].providerFormat" in _issues(ok, {"providerFormat": "openai-chat-completions"})


def test_google_settings_belong_to_vertex_only() -> None:
    cfg = _config("http://127.0.0.1:9")
    cfg["providers"]["vertex"] = {
        "type": "gemini",
        "baseUrl": "https://generativelanguage.googleapis.com",
        "gcpProject": "tollway-test",
        "credentials": [{"id": "k", "secretRef": "env:GEMINI_KEY"}],
        "providerAccountId": "a",
        "quotaGroupId": "q",
    }
    del cfg["providers"]["throttled"], cfg["models"][1]
    cfg["principals"][0]["allowedModels"] = ["gemini-vertex"]
    cfg["principals"][0]["allowedModels"] = ["gemini-vertex"]
    assert "providers.vertex.gcpProject" in {i.path for i in validate(parse_config(cfg))}
