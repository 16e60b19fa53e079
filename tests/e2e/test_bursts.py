"""Bursts of concurrent requests on the bundled example's limits, leasing from DynamoDB on moto.

``make up`` leases the example's budgets (600 requests a minute, 5 USD a day for ``tenant:local``)
from the local cloud's quota-leases table, a lease of ``leaseFraction`` (2 %) at a time. A burst
drains the first lease at once, and the requests after it wait for a refill: the ledger coalesces
those waits into a few store calls per counter (not one per request), and a waiter gives up only
at ``leaseWaitMs``. So a burst well inside the limits is served in full, streamed or buffered, and
the only deadline in play is the gateway's own.

Each case runs its own gateway on a fresh quota-leases table: the four bursts together are the
whole minute's 600 requests, and sharing one counter would make the last case depend on the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration import conftest as local_cloud_fixtures
from tests.support.processes import ROOT, Gateway, Proc, new_key, start_gateway
from tollway.cloud.bootstrap import bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = [pytest.mark.e2e, pytest.mark.local_cloud, pytest.mark.slow]

EXAMPLES = ROOT / "shared" / "tollway" / "examples"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a burst of requests"}]

cloud = local_cloud_fixtures.cloud
prefix = local_cloud_fixtures.prefix


@pytest.fixture
def example_gateway(cloud: LocalCloud, prefix: str, mock_provider: Proc, tmp_path: Path) -> Iterator[Gateway]:
    """The bundled example as ``tollway up`` runs it: the mock providers, and budgets leased from DynamoDB."""
    full = topology(prefix)
    leases = full.table("quota-leases")
    only_leases = dataclasses.replace(full, queues=(), tables=(leases,), buckets=(), secrets=(), functions=())
    bootstrap(only_leases, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for name in ("llm-router.yml", "pricing-catalog.json"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    key, _ = new_key()
    env = {
        **cloud.env(),
        "TOLLWAY_MOCK_URL": mock_provider.url,
        "TOLLWAY_MOCK_PROVIDER_KEY": "mock-burst-provider-key",
        "TOLLWAY_DEMO_KEY": key,
        "TOLLWAY_PII_KEY": "burst-pii-placeholder-key-" + "k" * 16,
        "TOLLWAY_GOVERNANCE_STORE": "dynamodb",
        "TOLLWAY_TABLE_QUOTA_LEASES": leases.name,
        "TOLLWAY_AUDIT_SPOOL": str(tmp_path / "audit-wal"),
    }
    gw = start_gateway(tmp_path / "llm-router.yml", env)
    gw.keys = {"demo": key}
    yield gw
    gw.proc.stop()


async def one_request(sdk: openai.AsyncOpenAI, stream: bool) -> str:
    """``ok``, or what the request got instead: the status and error code, or the connection error."""
    try:
        if stream:
            chunks = await sdk.chat.completions.create(model="chat-fast-v1", messages=MESSAGES, stream=True)
            texts = [c.choices[0].delta.content async for c in chunks if c.choices and c.choices[0].delta.content]
            return "ok" if texts else "empty stream"
        resp = await sdk.chat.completions.create(model="chat-fast-v1", messages=MESSAGES)
        return "ok" if resp.choices[0].message.content else "empty answer"
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return f"{exc.status_code} {body.get('code') or body.get('error', {}).get('code')}"
    except openai.APIConnectionError as exc:
        return type(exc).__name__


async def burst(gw: Gateway, size: int, stream: bool) -> Counter[str]:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys["demo"], max_retries=0, timeout=30) as sdk:
        return Counter(await asyncio.gather(*(one_request(sdk, stream) for _ in range(size))))


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("size", [100, 200])
def test_a_burst_within_the_example_limits_is_served_in_full(example_gateway: Gateway, size: int, stream: bool) -> None:
    outcomes = asyncio.run(burst(example_gateway, size, stream))
    refused = [line for line in example_gateway.proc.log_lines() if '"status":' in line and '"status":200' not in line]
    assert outcomes == Counter({"ok": size}), (outcomes, refused[:5])
