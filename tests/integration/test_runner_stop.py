"""A stopping event-source runner takes what is already on its queues before the local cloud goes.

``tollway up`` stops the gateway first, then its audit shipper, which ships what the gateway's WAL
still holds; those messages reach the queues while the runner stops, and moto's state is gone once
it stops after the runner.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import FunctionSpec, QueueSpec, QueueTrigger, Topology
from tollway.cloud.runner import EventSourceRunner

pytestmark = pytest.mark.local_cloud


def _rig(cloud: LocalCloud, prefix: str, handler: Any, *, batch_size: int = 2) -> tuple[EventSourceRunner, Any, str]:
    queue = QueueSpec("work", f"{prefix}-work", visibility_timeout_s=30, max_receive_count=3)
    topo = Topology(prefix=prefix, queues=(queue,), tables=(), buckets=(), secrets=(), functions=())
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    fn = FunctionSpec(
        key="worker",
        name=f"{prefix}-worker",
        handler="unused.handler",
        source_dir="functions/worker",
        memory_mb=128,
        timeout_s=5,
        triggers=(QueueTrigger("work", batch_size=batch_size),),
    )
    runner = EventSourceRunner(
        topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), load_functions=False
    )
    runner.add_function(fn, handler)
    sqs = Clients(cloud.endpoint, cloud.region, cloud.env()).client("sqs")
    return runner, sqs, str(sqs.get_queue_url(QueueName=queue.name)["QueueUrl"])


def test_stop_with_a_drain_handles_what_is_on_the_queue_first(
    cloud: LocalCloud, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    handled: list[str] = []
    busy = threading.Event()

    def handler(event: dict[str, Any], context: Any) -> None:
        busy.set()
        handled.extend(r["body"] for r in event["Records"])

    runner, sqs, url = _rig(cloud, prefix, handler)
    runner.start()
    sqs.send_message(QueueUrl=url, MessageBody="first")
    assert busy.wait(10), "the runner never polled"
    # What a stopping gateway's shipper sends in its last drain, just before the runner is stopped:
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"late-{i}"} for i in range(7)])

    with caplog.at_level(logging.INFO, logger="tollway.cloud.runner"):
        started = time.monotonic()
        assert runner.stop(5, drain_s=10)

    assert sorted(handled) == ["first", *sorted(f"late-{i}" for i in range(7))]
    assert time.monotonic() - started < 10
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesNotVisible"]) == ("0", "0")
    assert f"{prefix}-worker<-{prefix}-work: 8 handled, 0 retried, 0 redriven, 0 left on the queue" in caplog.text


def test_a_drain_is_bounded_by_its_time(cloud: LocalCloud, prefix: str) -> None:
    def slow(event: dict[str, Any], context: Any) -> None:
        time.sleep(0.4)

    runner, sqs, url = _rig(cloud, prefix, slow, batch_size=1)
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(10)])
    runner.start()

    started = time.monotonic()
    assert runner.stop(5, drain_s=1)

    assert time.monotonic() - started < 3
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert int(left["ApproximateNumberOfMessages"]) > 0
    assert 0 < runner.counts()[f"{prefix}-worker<-{prefix}-work"].handled < 10
