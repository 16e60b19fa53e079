"""Session-scoped PII on the local cloud: placeholders in the DynamoDB vault (KMS-encrypted), one
value one placeholder for the whole session, resolvable after a gateway restart, and never across
sessions.

The gateway runs in process on the real mock provider, whose answer echoes what it was sent and
whose request log shows it; the vault's table and key are the ones the stack deploys.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology
from tollway.mock.server import MockServerThread
from tollway.pii.placeholders import PLACEHOLDER_RE
from tollway.server.app import create_app

pytestmark = pytest.mark.local_cloud

KEY = "tw-pii-session-key-0001"
EMAIL = "session.person@example.net"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
def config(
    cloud: LocalCloud, prefix: str, mock: MockServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    full = topology(prefix)
    only_vault = dataclasses.replace(
        full, queues=(), tables=(full.table("pii-vault"),), buckets=(), secrets=(), functions=()
    )
    bootstrap(only_vault, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for key, value in cloud.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TOLLWAY_PII_SESSION_PROVIDER_KEY", "sk-session")
    monkeypatch.setenv("TOLLWAY_PII_SESSION_KEY", "s" * 40)
    cfg = {
        "providers": {
            "mock": {
                "type": "openai-compatible",
                "baseUrl": mock.base_url + "/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "acct",
                "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_PII_SESSION_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "pii-session",
                "piiProfileId": "session",
                "routes": [{"id": "r", "provider": "mock", "model": "m", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": ["pii-session"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "pii": {
            "keySecretRef": "env:TOLLWAY_PII_SESSION_KEY",
            "vault": {
                "type": "dynamodb",
                "table": full.table("pii-vault").name,
                "kmsKeyId": full.kms_key("pii-vault").alias,
            },
            "profiles": [{"id": "session", "scope": "session", "sessionTtlSeconds": 600}],
        },
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
async def gateway(config: Path) -> AsyncIterator[Any]:
    apps: list[Any] = []

    async def start() -> httpx.AsyncClient:
        app = create_app(config, watch_interval_s=None)
        apps.append(app)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=30)

    yield start
    for app in apps:
        await app.state.runtime.aclose()


async def chat(client: httpx.AsyncClient, text: str, session: str | None) -> httpx.Response:
    headers = {**AUTH, **({"x-tollway-session-id": session} if session else {})}
    body = {"model": "pii-session", "messages": [{"role": "user", "content": text}]}
    return await client.post("/v1/chat/completions", json=body, headers=headers)


def last_echo(mock: MockServerThread) -> str:
    return str(httpx.get(mock.base_url + "/_mock/requests", timeout=5).json()[-1]["echo"])


async def test_a_session_keeps_one_placeholder_per_value_across_turns_and_restarts(
    gateway: Any, mock: MockServerThread, cloud: LocalCloud, config: Path
) -> None:
    first = await gateway()
    turn1 = await chat(first, f"My mail is {EMAIL}.", "s-1")
    assert turn1.status_code == 200, turn1.text
    assert EMAIL in turn1.json()["choices"][0]["message"]["content"]
    seen = last_echo(mock)
    match = PLACEHOLDER_RE.search(seen)
    assert match is not None and EMAIL not in seen
    placeholder = match.group(0)

    turn2 = await chat(first, f"Again: {EMAIL}", "s-1")
    assert turn2.status_code == 200 and placeholder in last_echo(mock)  # one value, one placeholder

    # A client that kept the tokenized text sends the placeholder itself, to a restarted gateway:
    # the vault resolves it for this session, and for no other.
    restarted = await gateway()
    same = await chat(restarted, f"who is {placeholder}?", "s-1")
    assert same.status_code == 200 and f"who is {EMAIL}?" in same.json()["choices"][0]["message"]["content"]
    other = await chat(restarted, f"who is {placeholder}?", "s-2")
    assert other.status_code == 200 and placeholder in other.json()["choices"][0]["message"]["content"]
    assert EMAIL not in other.text

    missing = await chat(restarted, "hi", None)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "x-tollway-session-id"

    # The stored item holds no value in clear (the test's admin client can scan; the gateway's role cannot).
    stage = Path(config).read_text()
    table = yaml.safe_load(stage)["pii"]["vault"]["table"]
    items = Clients(cloud.endpoint, cloud.region, cloud.env()).client("dynamodb").scan(TableName=table)["Items"]
    assert len(items) == 1 and EMAIL not in str(items)


async def test_host_scope_is_stable_across_a_tenants_requests_and_nowhere_else(
    gateway: Any, mock: MockServerThread, config: Path
) -> None:
    """``host`` scope (approved with allowHostScope): one value, one placeholder for the whole
    tenant, whoever sends it and in whichever session; another tenant's key never resolves it."""
    cfg = yaml.safe_load(config.read_text())
    cfg["pii"]["profiles"][0].update({"scope": "host", "allowHostScope": True})
    other_key = "tw-pii-other-tenant-key-0002"
    cfg["principals"].append(
        {
            "id": "q",
            "tenant": "other",
            "allowedModels": ["pii-session"],
            "keys": [{"id": "q-k", "sha256": hashlib.sha256(other_key.encode()).hexdigest()}],
        }
    )
    config.write_text(yaml.safe_dump(cfg))
    client = await gateway()
    first = await chat(client, f"Mail {EMAIL}", None)  # host scope needs no session header
    assert first.status_code == 200, first.text
    match = PLACEHOLDER_RE.search(last_echo(mock))
    assert match is not None
    placeholder = match.group(0)
    again = await chat(client, f"Again {EMAIL}", "another-session")
    assert again.status_code == 200 and placeholder in last_echo(mock)
    restarted = await gateway()
    same_tenant = await chat(restarted, f"who is {placeholder}?", None)
    assert f"who is {EMAIL}?" in same_tenant.json()["choices"][0]["message"]["content"]
    body = {"model": "pii-session", "messages": [{"role": "user", "content": f"who is {placeholder}?"}]}
    foreign = await restarted.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {other_key}"})
    assert foreign.status_code == 200 and EMAIL not in foreign.text and placeholder in foreign.text
