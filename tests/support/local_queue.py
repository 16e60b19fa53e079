"""One queue-triggered function on the local cloud, polled by hand: the rig of the queue-consumer tests.

A test trims ``topology()`` to one queue, the one table its function writes and that function,
bootstraps them on the local cloud (``cloud`` in ``tests/integration/conftest.py``), exports what the
function's Lambda environment would hold, and drives an :class:`EventSourceRunner` one poll at a
time, so each assertion sees exactly the deliveries it asked for. The audit writer's and the usage
reconciler's tests share it: the same rig around two handlers.

The queue's visibility timeout is :data:`VISIBILITY_S` (and the function timeout with it, which the
runner checks against it) and its maxReceiveCount is 2, so that a retry comes back within seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import FunctionSpec, Topology
from tollway.cloud.runner import EventSourceRunner, QueueMapping

__all__ = ["VISIBILITY_S", "WAIT_S", "QueueRig", "queue_rig"]

VISIBILITY_S = 3
WAIT_S = 30.0
"""How long a test polls for what it expects before it fails."""


@dataclass
class QueueRig:
    topo: Topology
    runner: EventSourceRunner
    mapping: QueueMapping
    sqs: Any
    ddb: Any
    table: str
    """The name of the table the function writes."""

    def send(self, *bodies: str) -> list[str]:
        return [self.sqs.send_message(QueueUrl=self.mapping.queue_url, MessageBody=b)["MessageId"] for b in bodies]

    def deliver(self, count: int) -> None:
        """Poll until ``count`` messages were handled successfully (deleted); every batch must succeed."""
        deleted = 0
        deadline = time.monotonic() + WAIT_S
        while deleted < count:
            assert time.monotonic() < deadline, f"{deleted} of {count} messages handled within {WAIT_S} s"
            outcome = self.runner.poll_once(self.mapping, wait_s=1)
            assert outcome.error is None and outcome.retried == (), outcome
            deleted += outcome.deleted
        assert self.visible() == (0, 0)

    def visible(self, url: str | None = None) -> tuple[int, int]:
        """The messages waiting and in flight on the queue (or on ``url``, such as its dead-letter queue)."""
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.mapping.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def items(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every item of the table, raw (DynamoDB's typed JSON), by key, in key order."""
        found = self.ddb.scan(TableName=self.table, ConsistentRead=True)["Items"]
        return {(i["pk"]["S"], i["sk"]["S"]): i for i in sorted(found, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))}


@contextlib.contextmanager
def queue_rig(
    cloud: LocalCloud,
    monkeypatch: pytest.MonkeyPatch,
    full: Topology,
    *,
    queue: str,
    table: str,
    function: FunctionSpec,
) -> Iterator[QueueRig]:
    """``full`` trimmed to the ``queue`` and ``table`` keys and ``function``, bootstrapped, with its runner.

    ``function`` is the spec as the test means it to be deployed (its timeout becomes
    :data:`VISIBILITY_S`); the runner imports its handler from the spec's dotted path. The runner
    must stop cleanly when the block ends.
    """
    spec = dataclasses.replace(full.queue(queue), visibility_timeout_s=VISIBILITY_S, max_receive_count=2)
    topo = dataclasses.replace(
        full,
        queues=(spec,),
        tables=(full.table(table),),
        buckets=(),
        secrets=(),
        functions=(dataclasses.replace(function, timeout_s=VISIBILITY_S),),
    )
    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    # What the function's Lambda environment holds (tollway.cloud's `up` exports the same).
    for key, value in {**cloud.env(), **topo.environment(report.account, cloud.region)}.items():
        monkeypatch.setenv(key, value)
    runner = EventSourceRunner(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    (mapping,) = runner.mappings
    clients = Clients(cloud.endpoint, cloud.region, cloud.env())
    yield QueueRig(topo, runner, mapping, clients.client("sqs"), clients.client("dynamodb"), topo.table(table).name)
    assert runner.stop(timeout_s=5)
