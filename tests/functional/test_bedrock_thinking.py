"""Extended thinking through Bedrock Converse, end to end: an Anthropic Messages client asks for
thinking on an alias served by Bedrock, sees the reasoning as thinking blocks (buffered and
streamed), and sends them back in the next turn, where the mock checks each signature.

Depends on ``api/anthropic_request.py`` letting thinking reach Bedrock-format routes (it is refused
for every non-Anthropic route until then).
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

KEY = "tw-bedrock-thinking-key-0001"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread(MockApp()) as server:
        yield server


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    isolate_aws(monkeypatch, tmp_path)
    bedrock = {"type": "bedrock", "awsRegion": "eu-west-1", "providerAccountId": "aws", "quotaGroupId": "aws"}
    cfg = {
        "providers": {"bedrock": {**bedrock, "baseUrl": mock.base_url}},
        "models": [
            {
                "name": "claude-thinking",
                "capabilities": ["streaming"],
                "routes": [{"id": "b", "provider": "bedrock", "model": MODEL, "providerFormat": "bedrock-converse"}],
            }
        ],
        "principals": one_principal(KEY, ["claude-thinking"]),
    }
    async with asgi_gateway(tmp_path, cfg) as http:
        mock.app.clear_requests()
        yield http


BODY: dict[str, Any] = {
    "model": "claude-thinking",
    "max_tokens": 4096,
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "messages": [{"role": "user", "content": "Grüße aus Köln"}],
}


async def test_thinking_comes_back_as_blocks_and_goes_back_signed(client: Any) -> None:
    first = await client.post("/v1/messages", json=BODY, headers=HEADERS)
    assert first.status_code == 200, first.text
    content = first.json()["content"]
    assert [b["type"] for b in content] == ["thinking", "text"]
    assert content[0]["thinking"].startswith("Mock thinking about:") and content[0]["signature"]
    follow = {
        **BODY,
        "messages": [*BODY["messages"], {"role": "assistant", "content": content}, {"role": "user", "content": "Und?"}],
    }
    second = await client.post("/v1/messages", json=follow, headers=HEADERS)
    assert second.status_code == 200, second.text
    tampered = [{**content[0], "thinking": content[0]["thinking"] + "!"}, content[1]]
    follow["messages"][1] = {"role": "assistant", "content": tampered}
    refused = await client.post("/v1/messages", json=follow, headers=HEADERS)
    assert refused.status_code == 400, refused.text


async def test_streamed_thinking_reaches_the_client_with_its_signature(client: Any) -> None:
    resp = await client.post("/v1/messages", json={**BODY, "stream": True}, headers=HEADERS)
    assert resp.status_code == 200, resp.text
    events = [orjson.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas).startswith("Mock thinking about:")
    assert any(d["type"] == "signature_delta" and d["signature"] for d in deltas)
    assert "Grüße aus Köln" in "".join(d.get("text", "") for d in deltas)
