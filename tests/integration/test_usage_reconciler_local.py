"""The usage reconciler on the local cloud: usage queue → event-source runner → the real handler → DynamoDB.

Each test bootstraps the usage queue and the usage-ledger table of a fresh stage from
``topology()``. ``topology()`` does not list the reconciler yet, so the test adds the spec it is
meant to have (a trigger on ``usage``, the queue and the table granted); the runner imports the
handler from that dotted path and the handler builds its DynamoDB ledger from the environment, as
on Lambda. The queue's visibility timeout is 3 s so that a retry comes back within seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from typing import Any

import pytest

from functions.usage_reconciler import handler as handler_module
from tests.support.local_queue import QueueRig, queue_rig
from tests.unit.metering.usage_events import DAY_MS, finished, message
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import FunctionSpec, Grant, QueueTrigger, topology
from tollway.metering import DynamoDBUsageLedger, UsageQuery, UsageScope

pytestmark = pytest.mark.local_cloud

DAY = date(2026, 11, 29)


def reconciler_spec(prefix: str) -> FunctionSpec:
    """The usage-reconciler's FunctionSpec as ``topology()`` should list it."""
    return FunctionSpec(
        key="usage-reconciler",
        name=f"{prefix}-usage-reconciler",
        handler="functions.usage_reconciler.handler.handler",
        source_dir="functions/usage_reconciler",
        triggers=(QueueTrigger("usage", batch_size=10, max_batching_window_s=1),),
        grants=(Grant("queue", "usage", "consume"), Grant("table", "usage-ledger", "read-write")),
    )


@pytest.fixture
def rig(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[QueueRig]:
    spec = reconciler_spec(prefix)
    with queue_rig(cloud, monkeypatch, topology(prefix), queue="usage", table="usage-ledger", function=spec) as rig:
        assert rig.mapping.handler is handler_module.handler  # the deployed entry point, from the spec's dotted path
        yield rig


def _events() -> list[list[Any]]:
    return [
        [
            finished("r1", principal="alice", alias="chat", cost=1000),
            finished("r2", principal="alice", alias="embed", cost=None, evidence="local-estimate"),
        ],
        [finished("r3", principal="bob", alias="chat", cost=3000, status=503, ts_ms=DAY_MS + 86_400_000)],
        [finished("r4", principal="bob", alias="chat", cost=7, usage=None, evidence="unknown", status=499)],
    ]


def test_redelivering_the_batch_twice_leaves_every_aggregate_unchanged(rig: QueueRig) -> None:
    bodies = [message(batch) for batch in _events()]
    rig.send(*bodies)
    rig.deliver(len(bodies))
    before = rig.items()
    assert len([k for k in before if k[0].startswith("req#")]) == 4

    rig.send(*bodies)
    rig.send(*bodies[::-1])
    rig.deliver(2 * len(bodies))

    assert rig.items() == before
    tenant = before["agg#tenant:acme#total", "day#2026-11-29"]
    assert {k: tenant[k] for k in ("requests", "costMicroUsd", "unknownCostRequests", "status2xx", "status499")} == {
        "requests": {"N": "3"},
        "costMicroUsd": {"N": "1007"},
        "unknownCostRequests": {"N": "1"},
        "status2xx": {"N": "2"},
        "status499": {"N": "1"},
    }
    entry = before["req#r1", "usage"]
    assert entry["expiresAt"] == {"N": str(DAY_MS // 1000 + 400 * 86_400)}
    assert (entry["principalId"], entry["costMicroUsd"]) == ({"S": "alice"}, {"N": "1000"})


def test_the_query_reads_back_the_rows_each_caller_may_see(rig: QueueRig) -> None:
    rig.send(*(message(batch) for batch in _events()))
    rig.deliver(3)
    ledger = DynamoDBUsageLedger.from_env()

    def rows(scope: UsageScope, group_by: str) -> list[tuple[str, int, int]]:
        found = ledger.query(UsageQuery(scope, DAY, date(2026, 11, 30), group_by))  # type: ignore[arg-type]
        return [(r.key, r.totals.requests, r.totals.cost_micro_usd) for r in found]

    tenant, alice = UsageScope("acme"), UsageScope("acme", "alice")
    assert rows(tenant, "day") == [("2026-11-29", 3, 1007), ("2026-11-30", 1, 3000)]
    assert rows(tenant, "alias") == [("chat", 3, 4007), ("embed", 1, 0)]
    assert rows(tenant, "principal") == [("alice", 2, 1000), ("bob", 2, 3007)]
    assert rows(alice, "alias") == [("chat", 1, 1000), ("embed", 1, 0)]
    assert rows(alice, "principal") == [("alice", 2, 1000)]
    assert rows(UsageScope("acme", "bob"), "day") == [("2026-11-29", 1, 7), ("2026-11-30", 1, 3000)]
    (only_day,) = ledger.query(UsageQuery(tenant, DAY, DAY, "day"))
    assert only_day.totals.evidence == {"provider-reported": 1, "local-estimate": 1, "unknown": 1}


def test_a_malformed_message_fails_alone_and_writes_nothing(rig: QueueRig) -> None:
    poison = message([finished("r-bad", omit=("usageEvidence",))])
    poison_id, _ = rig.send(poison, message([finished("r-ok")]))

    outcome = rig.runner.poll_once(rig.mapping, wait_s=1)

    assert outcome.received == 2 and outcome.error is None
    assert outcome.retried == (poison_id,) and outcome.deleted == 1
    keys = set(rig.items())
    assert ("req#r-ok", "usage") in keys and ("req#r-bad", "usage") not in keys
