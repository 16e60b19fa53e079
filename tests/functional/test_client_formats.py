"""An alias serves only the client APIs its ``clientFormats`` lists, and ``/v1/models`` says which."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-client-formats-0001"


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_CF_PROVIDER_KEY", "sk-cf")
    route = {"id": "r", "provider": "p", "model": "m", "providerFormat": "openai-chat-completions"}
    cfg = {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "baseUrl": mock.base_url + "/v1",
                "providerAccountId": "a",
                "quotaGroupId": "q",
                "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_CF_PROVIDER_KEY"}],
            }
        },
        "models": [
            {"name": "chat-only", "clientFormats": ["openai-chat-completions"], "routes": [route]},
            {"name": "every-api", "routes": [{**route, "id": "r2"}]},
        ],
        "principals": [
            {
                "id": "u",
                "tenant": "t",
                "allowedModels": ["chat-only", "every-api"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "telemetry": {"metrics": {"enabled": False}},
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    app = create_app(path, watch_interval_s=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c
    await app.state.runtime.aclose()


def _messages(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def test_an_alias_refuses_a_client_api_it_does_not_list(client: Any) -> None:
    refused = await client.post("/v1/messages", json=_messages("chat-only"), headers={"x-api-key": KEY})
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "not served over this API" in refused.json()["error"]["message"]
    served = await client.post("/v1/messages", json=_messages("every-api"), headers={"x-api-key": KEY})
    assert served.status_code == 200 and served.json()["type"] == "message"
    chat = await client.post(
        "/v1/chat/completions",
        json={"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert chat.status_code == 200


async def test_models_list_the_client_apis_and_operations_of_each_alias(client: Any) -> None:
    listing = (await client.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})).json()["data"]
    by_id = {m["id"]: m for m in listing}
    assert by_id["chat-only"]["client_formats"] == ["openai-chat-completions"]
    assert by_id["every-api"]["client_formats"] == ["anthropic-messages", "openai-chat-completions", "openai-responses"]
    assert by_id["every-api"]["operations"] == ["chat"]
    one = (await client.get("/v1/models/chat-only", headers={"authorization": f"Bearer {KEY}"})).json()
    assert one["client_formats"] == ["openai-chat-completions"]
