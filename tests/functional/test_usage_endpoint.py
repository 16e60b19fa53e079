"""GET /v1/usage through the real app: each caller sees its own scope, an admin its tenant's."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.unit.metering.usage_events import finished
from tollway.metering import MemoryUsageLedger
from tollway.server.app import create_app

KEYS = {"alice": "tw-usage-alice", "ops": "tw-usage-ops", "carol": "tw-usage-carol"}


def config() -> dict[str, Any]:
    def principal(pid: str, tenant: str, roles: list[str]) -> dict[str, Any]:
        digest = hashlib.sha256(KEYS[pid].encode()).hexdigest()
        return {
            "id": pid,
            "tenant": tenant,
            "roles": roles,
            "allowedModels": ["chat"],
            "keys": [{"id": f"{pid}-k", "sha256": digest}],
        }

    return {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "a",
                "quotaGroupId": "a",
                "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_USAGE_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "chat",
                "routes": [{"id": "r", "provider": "p", "model": "m", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            principal("alice", "acme", []),
            principal("ops", "acme", ["admin"]),
            principal("carol", "other", []),
        ],
    }


@pytest.fixture
async def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    monkeypatch.setenv("TOLLWAY_USAGE_PROVIDER_KEY", "sk-usage")
    monkeypatch.delenv("TOLLWAY_TABLE_USAGE_LEDGER", raising=False)
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(config()))
    app = create_app(path, watch_interval_s=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c, app.state.runtime
    await app.state.runtime.aclose()


async def get(c: httpx.AsyncClient, who: str, **params: str) -> httpx.Response:
    return await c.get("/v1/usage", params=params, headers={"authorization": f"Bearer {KEYS[who]}"})


async def test_each_caller_sees_only_its_own_scope(client: tuple[httpx.AsyncClient, Any]) -> None:
    c, runtime = client
    ledger = MemoryUsageLedger()
    now_ms = int(time.time() * 1000)
    for i, (pid, tenant) in enumerate([("alice", "acme"), ("alice", "acme"), ("ops", "acme"), ("carol", "other")]):
        ledger.apply(finished(f"req-{i}", tenant=tenant, principal=pid, team=None, ts_ms=now_ms, cost=1000))
    runtime._usage_ledger = ledger

    def by_principal(resp: httpx.Response) -> dict[str, int]:
        assert resp.status_code == 200, resp.text
        return {b["principal"]: b["requests"] for b in resp.json()["data"]}

    assert by_principal(await get(c, "alice", group_by="principal")) == {"alice": 2}
    assert by_principal(await get(c, "ops", group_by="principal")) == {"alice": 2, "ops": 1}
    assert by_principal(await get(c, "carol", group_by="principal")) == {"carol": 1}
    day = (await get(c, "alice", group_by="day")).json()
    assert sum(b["requests"] for b in day["data"]) == 2
    assert day["scope"] == {"tenant": "acme", "principal": "alice"}
    assert sum(b["cost_micro_usd"] for b in day["data"]) == 2000


async def test_bad_parameters_and_missing_keys_use_the_error_envelope(client: tuple[httpx.AsyncClient, Any]) -> None:
    c, runtime = client
    runtime._usage_ledger = MemoryUsageLedger()
    bad = await get(c, "alice", group_by="colour")
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_request"
    assert (await c.get("/v1/usage")).status_code == 401


async def test_without_a_ledger_the_endpoint_says_so(client: tuple[httpx.AsyncClient, Any]) -> None:
    c, _ = client
    resp = await get(c, "alice")
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "usage_unavailable"
