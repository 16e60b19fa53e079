"""Embeddings through the whole request path: budgets, pricing per input token, and the audit trail.

The gateway runs in process on the real mock provider, with a pricing catalog, a cost budget and
the audit WAL attached, as ``test_governance`` and ``test_audit_gateway`` run chat requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.functional.test_audit_gateway import LIMITS
from tollway.audit.events import decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalReader, WalWriter
from tollway.mock.openai_embeddings import mock_embedding
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-embeddings-key-0001"
TEXT = "forty characters of text for one vector."  # 40 characters: 10 tokens, by the mock and the estimate
# 1000 USD per million input tokens: 1000 micro-USD a token, so one request costs 10,000 micro-USD.
CATALOG = {"openai": {"models": {"phys-embed": {"cost": {"input": 1000, "output": 0}}}}}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_EMBED_PROVIDER_KEY", "sk-embeddings-provider")
    (tmp_path / "catalog.json").write_text(json.dumps(CATALOG))
    provider = {
        "type": "openai-compatible",
        "pricingProvider": "openai",
        "baseUrl": mock.base_url + "/v1",
        "providerAccountId": "acct",
        "quotaGroupId": "acct",
        "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_EMBED_PROVIDER_KEY"}],
    }
    cfg = {
        "providers": {"mock": provider},
        "models": [
            {
                "name": "embed-v1",
                "operations": ["embeddings"],
                "routes": [
                    {"id": "e", "provider": "mock", "model": "phys-embed", "providerFormat": "openai-chat-completions"}
                ],
            }
        ],
        "principals": [
            {
                "id": "alice",
                "tenant": "acme",
                "allowedModels": ["embed-v1"],
                "keys": [{"id": "alice-key", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "governance": {
            "pricing": {"catalogFile": "catalog.json"},
            "policies": [{"scope": "principal:alice", "budgets": [{"window": "day", "usd": 0.035}]}],
        },
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    app = create_app(path, watch_interval_s=None)
    writer = WalWriter(tmp_path / "wal", instance_id="functional", limits=LIMITS, durable=True)
    writer.open()
    recorder = AuditRecorder(
        writer,
        durable=True,
        terminal_commit=True,
        commit_timeout_s=LIMITS.commit_timeout_s,
        content_mode="metadata-only",
    )
    runtime = app.state.runtime
    runtime.attach_audit(AuditPipeline(recorder=recorder, writer=writer, shipper=None))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            yield client
    finally:
        await asyncio.to_thread(writer.close, 5.0)
        await runtime.aclose()


async def embed(client: httpx.AsyncClient, inputs: Any) -> httpx.Response:
    return await client.post(
        "/v1/embeddings",
        json={"model": "embed-v1", "input": inputs, "dimensions": 8},
        headers={"authorization": f"Bearer {KEY}"},
    )


async def test_usage_is_priced_per_input_token_audited_and_budgeted(gateway: Any, tmp_path: Path) -> None:
    first = await embed(gateway, TEXT)
    assert first.status_code == 200, first.text
    assert first.json()["data"][0]["embedding"] == list(mock_embedding(TEXT, 8))
    assert first.json()["usage"] == {"prompt_tokens": math.ceil(len(TEXT) / 4), "total_tokens": 10}
    statuses = [first.status_code]
    for _ in range(5):
        resp = await embed(gateway, TEXT)
        statuses.append(resp.status_code)
        if resp.status_code != 200:
            break
    # 35,000 micro-USD holds three requests of 10,000; the fourth would pass the budget.
    assert statuses == [200, 200, 200, 429], statuses
    assert resp.json()["error"]["code"] == "budget_exceeded"

    async with asyncio.timeout(10):  # the rejection is appended without a durable wait: read until it is there
        while True:
            records = WalReader(tmp_path / "wal").read(0, 1000, 1 << 22)
            events = [decode_event(r.payload) for r in records]
            if any(e.kind == "request_rejected" for e in events):
                break
            await asyncio.sleep(0.01)
    admitted = [e.body for e in events if e.kind == "request_admitted"]
    finished = [e.body for e in events if e.kind == "request_finished"]
    assert len(admitted) == len(finished) == 3
    assert {a["operation"] for a in admitted} == {"embeddings"}
    assert {a["stream"] for a in admitted} == {False}
    for f in finished:
        assert f["usage"]["promptTokens"] == 10 and f["usage"]["completionTokens"] == 0
        assert f["usageEvidence"] == "provider-reported"
        assert f["cost"] == 10_000
    rejected = [e.body for e in events if e.kind == "request_rejected"]
    assert [(r["operation"], r["errorCode"]) for r in rejected] == [("embeddings", "budget_exceeded")]
    assert TEXT.encode() not in orjson.dumps([e.body for e in events])  # metadata only
