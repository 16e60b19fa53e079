"""The DynamoDB lease store on a real moto server, and three replica processes sharing one budget.

Each test bootstraps only the ``quota-leases`` table of a fresh stage from ``topology()``, so the
table (key ``pk``, TTL ``expiresAt``) is the one the stack deploys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ROOT
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology
from tollway.governance.store import DynamoDBLeaseStore, LeaseStoreSettings, LeaseStoreUnavailable

pytestmark = pytest.mark.local_cloud

KEY = "budget#tenant:acme#cost#day#2026-11-29"
WORKERS = 3
TASKS = 8
OVER = 2
"""A worker settles at most this much above a reservation."""
LIMIT = 3_000


@pytest.fixture
def table(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> str:
    full = topology(prefix)
    topo = dataclasses.replace(
        full, queues=(), tables=(full.table("quota-leases"),), buckets=(), secrets=(), functions=()
    )
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for key, value in cloud.env().items():
        monkeypatch.setenv(key, value)
    return full.table("quota-leases").name


@pytest.fixture
async def store(table: str) -> AsyncIterator[DynamoDBLeaseStore]:
    leases = DynamoDBLeaseStore(LeaseStoreSettings.from_env(table=table))
    yield leases
    leases.close()


def item(cloud: LocalCloud, table: str, key: str) -> dict[str, Any]:
    ddb = Clients(cloud.endpoint, cloud.region, cloud.env()).client("dynamodb")
    found: dict[str, Any] = ddb.get_item(TableName=table, Key={"pk": {"S": key}}, ConsistentRead=True)["Item"]
    return found


async def test_a_take_grants_the_remainder_then_nothing_and_never_passes_the_limit(
    store: DynamoDBLeaseStore, cloud: LocalCloud, table: str
) -> None:
    assert await store.take(KEY, 60, 100, 1_900_000_000) == 60
    assert await store.take(KEY, 60, 100, 1_900_000_000) == 40  # the partial remainder
    assert await store.take(KEY, 1, 100, 1_900_000_000) == 0
    assert await store.granted(KEY) == 100
    stored = item(cloud, table, KEY)
    assert stored["granted"] == {"N": "100"} and stored["limit"] == {"N": "100"}
    assert stored["expiresAt"] == {"N": "1900000000"}


async def test_concurrent_takes_add_up_to_exactly_the_limit(store: DynamoDBLeaseStore) -> None:
    grants = await asyncio.gather(*(store.take(KEY, 7, 200, None) for _ in range(60)))
    assert sum(grants) <= 200
    assert await store.granted(KEY) == sum(grants)
    assert sum(grants) >= 200 - 7  # contention only loses a race, never the remainder for good
    assert await store.take(KEY, 10, 200, None) == 200 - sum(grants)


async def test_a_lowered_limit_grants_nothing_more(store: DynamoDBLeaseStore) -> None:
    assert await store.take(KEY, 80, 100, None) == 80
    assert await store.take(KEY, 10, 50, None) == 0
    assert await store.granted(KEY) == 80


async def test_give_back_lowers_the_counter_but_never_below_zero(store: DynamoDBLeaseStore) -> None:
    await store.take(KEY, 30, 100, None)
    await store.give_back(KEY, 20)
    assert await store.granted(KEY) == 10
    await store.give_back(KEY, 11)  # more than is granted: refused, silently
    assert await store.granted(KEY) == 10
    await store.give_back("budget#never#taken#day#2026-11-29", 5)
    assert await store.granted("budget#never#taken#day#2026-11-29") == 0


async def test_a_missing_table_is_unavailable_not_exhausted(table: str) -> None:
    missing = DynamoDBLeaseStore(LeaseStoreSettings.from_env(table=table + "-missing"))
    try:
        with pytest.raises(LeaseStoreUnavailable, match="ResourceNotFoundException"):
            await missing.take(KEY, 1, 10, None)
    finally:
        missing.close()


@dataclasses.dataclass
class Worker:
    proc: subprocess.Popen[str]
    log: Path


@pytest.fixture
def workers(table: str, tmp_path: Path) -> Iterator[list[Worker]]:
    env = {**os.environ, "TOLLWAY_TABLE_QUOTA_LEASES": table}
    started: list[Worker] = []
    try:
        for i in range(WORKERS):
            log = tmp_path / f"worker-{i}.log"
            with log.open("w") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.lease_worker", "--scope", "tenant:acme", "--limit",
                     str(LIMIT), "--tasks", str(TASKS), "--over", str(OVER), "--seed", str(i), "--seconds", "30"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env,
                )  # fmt: skip
            started.append(Worker(proc, log))
        yield started
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=10)


@pytest.mark.slow
def test_three_replica_processes_never_spend_past_the_limit_plus_their_stated_overshoot(
    workers: list[Worker], cloud: LocalCloud, table: str
) -> None:
    for w in workers:
        assert w.proc.stdout is not None
        assert w.proc.stdout.readline().strip() == "ready", w.log.read_text()
    for w in workers:  # all at once
        assert w.proc.stdin is not None
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
    reports = []
    deadline = time.monotonic() + 60
    for w in workers:
        out, _ = w.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert w.proc.returncode == 0, w.log.read_text()
        reports.append(json.loads(out.strip().splitlines()[-1]))

    counter = int(item(cloud, table, "budget#tenant:acme#cost#lifetime#all")["granted"]["N"])
    settled = sum(r["settled"] for r in reports)
    unpaid = sum(r["unpaid"] for r in reports)
    assert counter <= LIMIT  # total granted never passes the limit
    assert all(r["admitted"] > 0 for r in reports)  # every replica really competed
    assert any(r["denied"].get("budget exhausted") for r in reports)  # and the budget ran out
    assert not any(r["denied"].get("store unavailable") for r in reports)
    # settled = store counter + unpaid overshoot (every lease was given back), so settled ≤ limit + Σ D_r ...
    assert settled <= counter + unpaid
    assert settled <= LIMIT + unpaid
    # ... and D_r is bounded by the over-run of what was in flight when the budget ran dry.
    assert all(r["unpaid"] <= TASKS * OVER for r in reports), reports
    assert counter >= LIMIT - WORKERS * 10  # little is stranded once leases are given back
