"""Three gateway processes, one cost budget in the local cloud's DynamoDB: spend stays within it.

Each replica takes bounded leases from the shared quota-leases table and reserves from them
locally (docs/governance.md). Admission reserves the worst case (input estimate plus
``max_tokens`` at the alias's highest rates), so the stated bound is exact: the settled spend of
all replicas together never passes the budget. The spend is measured independently, from the
usage the mock provider reported in every 200 the clients received, priced by the test.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import Gateway, Proc, new_key, start_gateway
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = [pytest.mark.local_cloud, pytest.mark.slow]

BUDGET_MICRO_USD = 40_000  # 0.04 USD
INPUT_RATE, OUTPUT_RATE = 10, 30  # micro-USD per token (10 and 30 USD per million)
REPLICAS = 3
CLIENTS_PER_REPLICA = 3
MAX_REQUESTS_PER_CLIENT = 150
DEADLINE_S = 60.0


def config(mock_url: str, digest: str) -> dict[str, Any]:
    return {
        "providers": {
            "mock": {
                "type": "openai-compatible",
                "pricingProvider": "openai",
                "baseUrl": mock_url + "/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "acct",
                "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_REPLICA_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "chat",
                "routes": [
                    {"id": "r", "provider": "mock", "model": "phys", "providerFormat": "openai-chat-completions"}
                ],
            }
        ],
        "principals": [
            {"id": "svc", "tenant": "acme", "allowedModels": ["chat"], "keys": [{"id": "svc-key", "sha256": digest}]}
        ],
        "governance": {
            "store": "dynamodb",
            "leaseFraction": 0.1,
            "pricing": {"catalogFile": "catalog.json"},
            "policies": [{"scope": "tenant:acme", "budgets": [{"window": "day", "usd": BUDGET_MICRO_USD / 1e6}]}],
        },
    }


def drive(base_url: str, key: str, out: list[tuple[int, str | None, int]], stop_at: float) -> None:
    """One client: requests until the budget says no five times running, or a bound is reached."""
    refused = 0
    body = {"model": "chat", "messages": [{"role": "user", "content": "count the spend"}], "max_tokens": 40}
    with httpx.Client(base_url=base_url, headers={"authorization": f"Bearer {key}"}, timeout=20) as client:
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if time.monotonic() > stop_at:
                return
            resp = client.post("/chat/completions", json=body)
            if resp.status_code == 200:
                usage = resp.json()["usage"]
                out.append((200, None, usage["prompt_tokens"] * INPUT_RATE + usage["completion_tokens"] * OUTPUT_RATE))
                refused = 0
                continue
            code = resp.json()["error"]["code"]
            out.append((resp.status_code, code, 0))
            refused += 1
            if refused >= 5:
                return
            time.sleep(0.05)


def test_three_replicas_never_spend_past_one_shared_budget(
    cloud: LocalCloud, prefix: str, mock_provider: Proc, tmp_path: Path
) -> None:
    topo = topology(prefix)
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region)
    table = topo.table("quota-leases").name
    key, digest = new_key()
    env = {
        **cloud.env(),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "TOLLWAY_TABLE_QUOTA_LEASES": table,
        "TOLLWAY_REPLICA_PROVIDER_KEY": "sk-replica-provider",
    }
    gateways: list[Gateway] = []
    try:
        for i in range(REPLICAS):
            folder = tmp_path / f"replica-{i}"
            folder.mkdir()
            (folder / "catalog.json").write_text(
                json.dumps({"openai": {"models": {"phys": {"cost": {"input": INPUT_RATE, "output": OUTPUT_RATE}}}}})
            )
            path = folder / "llm-router.yml"
            path.write_text(yaml.safe_dump(config(mock_provider.url, digest)))
            gateways.append(start_gateway(path, env))
        results: list[list[tuple[int, str | None, int]]] = [[] for _ in range(REPLICAS)]
        stop_at = time.monotonic() + DEADLINE_S
        threads = [
            threading.Thread(target=drive, args=(gw.base_url, key, results[i], stop_at))
            for i, gw in enumerate(gateways)
            for _ in range(CLIENTS_PER_REPLICA)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S + 30)
        assert not any(t.is_alive() for t in threads)
    finally:
        for gw in gateways:
            gw.proc.stop()  # graceful: each replica gives its unused lease back
    everything = [r for per in results for r in per]
    outcomes = Counter((status, code) for status, code, _ in everything)
    spent = sum(cost for _, _, cost in everything)
    served = [sum(1 for status, _, _ in per if status == 200) for per in results]
    # The budget was reached, across all three replicas, and never passed.
    assert outcomes[(429, "budget_exceeded")] > 0, outcomes
    assert set(outcomes) <= {(200, None), (429, "budget_exceeded")}, outcomes
    assert all(n > 0 for n in served), served
    assert spent <= BUDGET_MICRO_USD, (spent, outcomes)
    # Leases strand little: most of the budget was spent before the replicas were refused.
    assert spent >= BUDGET_MICRO_USD * 0.6, (spent, served)
    # The shared counter never granted past the limit, and after the give-backs it holds no more
    # than what was spent (a give-back lost on shutdown would only leave it higher, never lower).
    dynamodb = Clients(cloud.endpoint, cloud.region, cloud.env()).client("dynamodb")
    items = dynamodb.scan(TableName=table)["Items"]
    [counter] = [i for i in items if i["pk"]["S"].startswith("budget#tenant:acme#cost#day#")]
    granted = int(counter["granted"]["N"])
    assert spent <= granted <= BUDGET_MICRO_USD, (spent, granted)
