"""The mock's control endpoints: request log, fault defaults, health."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from tollway.mock import MockApp, MockServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
OPENAI = {"model": "mock-gpt", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
ANTHROPIC = {"model": "mock-claude", "max_tokens": 10, "messages": [{"role": "user", "content": "c"}]}


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


async def test_health(client: httpx.AsyncClient) -> None:
    response = await client.get("/_mock/health")

    assert response.status_code == 200
    assert response.json() == {"ok": True}


async def test_requests_are_recorded_without_credential_values(client: httpx.AsyncClient) -> None:
    await client.post(CHAT, json=OPENAI, headers={"authorization": "Bearer sk-secret-value"})
    await client.post(
        "/_fault/status=429/v1/messages", json={**ANTHROPIC, "stream": True}, headers={"x-api-key": "sk-ant-secret"}
    )
    await client.post(CHAT, json={**OPENAI, "model": "other"})
    response = await client.get("/_mock/requests")

    records = response.json()
    assert "secret" not in response.text
    first, second, third = records
    assert first == {
        "seq": first["seq"],
        "path": CHAT,
        "format": "openai",
        "model": "mock-gpt",
        "stream": False,
        "auth": True,
        "messages": 2,
        "faults": "",
        "status": 200,
        "echo": "b",  # the text its answer echoes: what a test checks the provider was sent
    }
    assert second["path"] == "/_fault/status=429/v1/messages"
    assert (second["format"], second["stream"], second["auth"], second["messages"]) == ("anthropic", True, True, 1)
    assert (second["faults"], second["status"]) == ("status=429", 429)
    assert (third["model"], third["auth"]) == ("other", False)
    assert first["seq"] < second["seq"] < third["seq"]


async def test_deleting_requests_clears_the_log_but_not_the_sequence(client: httpx.AsyncClient) -> None:
    await client.post(CHAT, json=OPENAI)
    before = (await client.get("/_mock/requests")).json()[-1]["seq"]
    cleared = await client.delete("/_mock/requests")
    empty = (await client.get("/_mock/requests")).json()
    await client.post(CHAT, json=OPENAI)
    after = (await client.get("/_mock/requests")).json()

    assert cleared.status_code == 200
    assert empty == []
    assert [r["seq"] for r in after] == [before + 1]


async def test_request_log_is_a_bounded_ring() -> None:
    async with MockServer(MockApp(request_log_size=3)) as small, httpx.AsyncClient(base_url=small.base_url) as http:
        for _ in range(5):
            await http.post(CHAT, json=OPENAI)
        records = (await http.get("/_mock/requests")).json()

    assert [r["seq"] for r in records] == [3, 4, 5]


async def test_posted_faults_apply_until_deleted(client: httpx.AsyncClient) -> None:
    posted = await client.post("/_mock/faults", json={"status": 503, "retry_after": 1})
    failing = await client.post(CHAT, json=OPENAI)
    current = (await client.get("/_mock/faults")).json()
    deleted = await client.delete("/_mock/faults")
    healed = await client.post(CHAT, json=OPENAI)

    assert posted.json() == {"ok": True, "faults": "retry_after=1,status=503", "model": None}
    assert failing.status_code == 503
    assert failing.headers["retry-after"] == "1"
    assert current == {"defaults": {"status": "503", "retry_after": "1"}, "models": {}}
    assert deleted.status_code == 200
    assert healed.status_code == 200


async def test_posted_faults_can_be_scoped_to_a_model(client: httpx.AsyncClient) -> None:
    await client.post("/_mock/faults", json={"model": "mock-claude", "spec": "status=529,fail_first=1"})
    scoped = [(await client.post(MESSAGES, json=ANTHROPIC)).status_code for _ in range(2)]
    unscoped = await client.post(CHAT, json=OPENAI)

    assert scoped == [529, 200]
    assert unscoped.status_code == 200


async def test_fault_sources_layer_defaults_then_path_then_headers(client: httpx.AsyncClient) -> None:
    await client.post("/_mock/faults", json={"status": 500, "words": 1})
    await client.post("/_mock/faults", json={"model": "mock-gpt", "status": 502})
    from_model = await client.post(CHAT, json=OPENAI)
    from_path = await client.post("/_fault/status=503/v1/chat/completions", json=OPENAI)
    from_header = await client.post(
        "/_fault/status=503/v1/chat/completions", json=OPENAI, headers={"x-mock-status": "429"}
    )
    other_model = await client.post(CHAT, json={**OPENAI, "model": "x"})

    assert from_model.status_code == 502
    assert from_path.status_code == 503
    assert from_header.status_code == 429
    assert other_model.status_code == 500


async def test_posting_invalid_faults_is_a_400_and_changes_nothing(client: httpx.AsyncClient) -> None:
    unknown = await client.post("/_mock/faults", json={"explode": True})
    not_object = await client.post("/_mock/faults", json=[1])
    still_fine = await client.post(CHAT, json=OPENAI)

    assert unknown.status_code == 400
    assert "explode" in unknown.json()["error"]["message"]
    assert not_object.status_code == 400
    assert still_fine.status_code == 200


async def test_posting_faults_resets_fail_first_counters(client: httpx.AsyncClient) -> None:
    spec = {"status": 500, "fail_first": 1}
    await client.post("/_mock/faults", json=spec)
    first_round = [(await client.post(CHAT, json=OPENAI)).status_code for _ in range(2)]
    await client.post("/_mock/faults", json=spec)
    second_round = [(await client.post(CHAT, json=OPENAI)).status_code for _ in range(2)]

    assert first_round == second_round == [500, 200]


async def test_unknown_control_routes(client: httpx.AsyncClient) -> None:
    missing = await client.get("/_mock/nothing")
    wrong_method = await client.put("/_mock/requests")

    assert missing.status_code == 404
    assert wrong_method.status_code == 405
