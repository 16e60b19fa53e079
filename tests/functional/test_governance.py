"""Token and cost governance through the real app: budgets, rate limits, provider capacity, settlement.

The gateway app runs in-process (ASGI), the mock provider is a real HTTP server, prices come from
a models.dev-shaped catalog file, and the lease store is the in-process one (the DynamoDB store
and three replicas are in ``tests/e2e/test_governance_replicas.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.governance.leases import Window, cost_budget, requests_per_minute
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-governance-key-0001"
OTHER_KEY = "tw-governance-key-0002"
BODY = {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 50}
# micro-USD per token: input 10 USD / 1M = 10, output 30 USD / 1M = 30.
CATALOG = {"openai": {"models": {"phys": {"cost": {"input": 10, "output": 30}}}}}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def write_config(tmp_path: Path, mock_url: str, **governance: Any) -> Path:
    (tmp_path / "catalog.json").write_text(json.dumps(CATALOG))
    provider = {
        "type": "openai-compatible",
        "pricingProvider": "openai",
        "baseUrl": mock_url + "/v1",
        "providerAccountId": "acct",
        "quotaGroupId": "acct-main",
        # Rotation: one current credential, the others next or retiring, all in the one quota group.
        "credentials": [
            {
                "id": f"k{i}",
                "secretRef": "env:TOLLWAY_GOV_PROVIDER_KEY",
                "lifecycle": ("current", "next", "retiring")[i],
            }
            for i in range(governance.pop("credentials", 1))
        ],
    }
    models = [
        {
            "name": "chat-fast-v1",
            "routes": [
                {
                    "id": "r",
                    "provider": "mock",
                    "model": governance.pop("model", "phys"),
                    "providerFormat": "openai-chat-completions",
                }
            ],
        },
    ]
    down = {**provider, "baseUrl": mock_url + "/_fault/status=500/v1"}
    models.append(
        {
            "name": "chat-down-v1",
            "routes": [{"id": "d", "provider": "down", "model": "phys", "providerFormat": "openai-chat-completions"}],
        }
    )
    cfg = {
        "providers": {"mock": provider, "down": down},
        "models": models,
        "routing": {"maxAttempts": 1},
        "principals": [
            {
                "id": "alice",
                "tenant": "acme",
                "team": "eng",
                "allowedModels": ["chat-fast-v1", "chat-down-v1"],
                "keys": [{"id": "alice-key", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            },
            {
                "id": "bob",
                "tenant": "acme",
                "allowedModels": ["chat-fast-v1", "chat-down-v1"],
                "keys": [{"id": "bob-key", "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()}],
            },
        ],
        "governance": {"pricing": {"catalogFile": "catalog.json"}, **governance},
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Gateway:
    def __init__(self, app: Any, client: httpx.AsyncClient) -> None:
        self.app, self.client = app, client

    @property
    def ledger(self) -> Any:
        return self.app.state.runtime.governor.ledger

    async def chat(self, key: str = KEY, **extra: Any) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions", json={**BODY, **extra}, headers={"authorization": f"Bearer {key}"}
        )


@pytest.fixture
async def make_gateway(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_GOV_PROVIDER_KEY", "sk-governance-provider")
    made: list[Any] = []

    async def make(**governance: Any) -> Gateway:
        app = create_app(write_config(tmp_path, mock.base_url, **governance), watch_interval_s=None)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        made.append((app, client))
        return Gateway(app, client)

    yield make
    for app, client in made:
        await client.aclose()
        await app.state.runtime.aclose()


def provider_requests(mock: MockServerThread) -> int:
    data = httpx.get(mock.base_url + "/_mock/requests", timeout=5).json()
    return len(data["requests"] if isinstance(data, dict) else data)


def cost_of(resp: httpx.Response) -> int:
    usage = resp.json()["usage"]
    return int(usage["prompt_tokens"]) * 10 + int(usage["completion_tokens"]) * 30


async def test_a_cost_budget_stops_spending_with_budget_exceeded(make_gateway: Any) -> None:
    # Worst case per request: (estimate + 50 output tokens) priced; 0.004 USD holds a handful.
    gw = await make_gateway(policies=[{"scope": "principal:alice", "budgets": [{"window": "day", "usd": 0.004}]}])
    spent, statuses = 0, []
    for _ in range(80):
        resp = await gw.chat()
        statuses.append(resp.status_code)
        if resp.status_code == 200:
            spent += cost_of(resp)
        else:
            break
    assert statuses[-1] == 429, statuses
    body = resp.json()["error"]
    assert body["code"] == "budget_exceeded"
    assert body["type"] == "insufficient_quota"
    assert 1 <= int(resp.headers["retry-after"]) <= 86_400
    assert 1 < statuses.count(200) < 80
    assert spent <= 4_000  # settled spend never passes the budget
    stats = gw.ledger.stats(cost_budget("principal:alice", Window.DAY, 4_000))
    assert stats.spent == spent  # settled to the provider-reported usage, not the reservation
    assert stats.reserved == 0
    # Another principal of the same tenant is not affected.
    assert (await gw.chat(OTHER_KEY)).status_code == 200


async def test_a_rate_limit_answers_rate_limited_with_retry_after(make_gateway: Any) -> None:
    gw = await make_gateway(policies=[{"scope": "team:acme/eng", "limits": {"rpm": 3}}])
    codes = [(await gw.chat()).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    resp = await gw.chat()
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    assert (await gw.chat(OTHER_KEY)).status_code == 200  # bob is not in team eng
    stats = gw.ledger.stats(requests_per_minute("team:acme/eng", 3))
    assert (stats.spent, stats.reserved) == (3, 0)


async def test_an_unknown_price_under_a_hard_budget_fails_closed_before_dispatch(
    make_gateway: Any, mock: MockServerThread
) -> None:
    gw = await make_gateway(
        model="not-in-the-catalog", policies=[{"scope": "tenant:acme", "budgets": [{"window": "month", "usd": 5}]}]
    )
    before = provider_requests(mock)
    resp = await gw.chat()
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "model_unavailable"
    assert "price" in resp.json()["error"]["message"]
    assert provider_requests(mock) == before


async def test_an_unknown_price_without_a_budget_is_served_and_recorded_as_unknown(make_gateway: Any) -> None:
    gw = await make_gateway(model="not-in-the-catalog", policies=[{"scope": "tenant:acme", "limits": {"rpm": 100}}])
    assert (await gw.chat()).status_code == 200


async def test_a_policy_output_cap_applies_to_requests_that_set_none_and_rejects_larger(make_gateway: Any) -> None:
    gw = await make_gateway(policies=[{"scope": "key:alice-key", "limits": {"maxOutputTokens": 20}}])
    too_big = await gw.chat(max_tokens=21)
    assert too_big.status_code == 400
    assert too_big.json()["error"]["param"] == "max_tokens"
    assert (await gw.chat(max_tokens=20)).status_code == 200


async def test_a_provider_error_charges_nothing_but_the_request(make_gateway: Any, tmp_path: Path) -> None:
    gw = await make_gateway(policies=[{"scope": "principal:alice", "budgets": [{"window": "day", "usd": 1}]}])
    resp = await gw.chat(model="chat-down-v1")
    assert resp.status_code == 502
    stats = gw.ledger.stats(cost_budget("principal:alice", Window.DAY, 1_000_000))
    assert (stats.spent, stats.reserved) == (0, 0)


async def test_a_stream_settles_to_the_reported_usage(make_gateway: Any) -> None:
    gw = await make_gateway(policies=[{"scope": "principal:alice", "budgets": [{"window": "day", "usd": 1}]}])
    async with gw.client.stream(
        "POST",
        "/v1/chat/completions",
        json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
        headers={"authorization": f"Bearer {KEY}"},
    ) as resp:
        lines = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
    usage = json.loads(lines[-1][6:])["usage"]
    stats = gw.ledger.stats(cost_budget("principal:alice", Window.DAY, 1_000_000))
    assert stats.spent == usage["prompt_tokens"] * 10 + usage["completion_tokens"] * 30
    assert stats.reserved == 0


@pytest.mark.parametrize("credentials", [1, 3])
async def test_adding_credentials_to_a_quota_group_adds_no_capacity(make_gateway: Any, credentials: int) -> None:
    gw = await make_gateway(credentials=credentials, quotaGroups={"acct-main": {"rpm": 4}})
    codes = [(await gw.chat(KEY if i % 2 else OTHER_KEY)).status_code for i in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]
    resp = await gw.chat()
    assert resp.json()["error"]["code"] == "rate_limited"
    assert resp.headers["retry-after"] == "1"


async def test_concurrent_admissions_never_over_reserve(make_gateway: Any) -> None:
    import asyncio

    gw = await make_gateway(policies=[{"scope": "tenant:acme", "limits": {"rpm": 7}}])
    results = await asyncio.gather(*(gw.chat(KEY if i % 2 else OTHER_KEY) for i in range(20)))
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) == 7
    assert codes.count(429) == 13


async def test_an_unreachable_lease_store_fails_closed_before_dispatch(
    make_gateway: Any, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tollway.cloud.local import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    gw = await make_gateway(
        store="dynamodb",
        table="tollway-quota-leases",
        leaseWaitMs=300,
        policies=[{"scope": "tenant:acme", "budgets": [{"window": "day", "usd": 5}]}],
    )
    before = provider_requests(mock)
    resp = await gw.chat()
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "budget_unavailable"
    assert resp.headers["retry-after"] == "1"
    assert provider_requests(mock) == before
