"""The SQS sink's batching and bounded resend of partial failures, against an in-memory SQS client."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from tollway.audit.ship.shipper import _messages
from tollway.audit.ship.sinks import SQS_BATCH_BYTES, SinkUnavailable, SqsSink
from tollway.audit.ship.sinks.kafka import _first_request_id


@dataclass
class FakeSqs:
    """Records SendMessageBatch calls; refuses the entry ids listed in ``refuse`` (one list per call)."""

    refuse: list[set[str]] = field(default_factory=list)
    url_lookups: int = 0
    calls: list[list[dict[str, str]]] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    error: Exception | None = None

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        self.url_lookups += 1
        return {"QueueUrl": f"http://sqs.local/000000000000/{QueueName}"}

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        assert QueueUrl.endswith("/audit-q")
        if self.error is not None:
            raise self.error
        assert 1 <= len(Entries) <= 10
        assert sum(len(e["MessageBody"].encode()) for e in Entries) <= SQS_BATCH_BYTES
        assert len({e["Id"] for e in Entries}) == len(Entries)
        self.calls.append(Entries)
        refused = self.refuse.pop(0) if self.refuse else set()
        failed = [{"Id": e["Id"], "Code": "InternalError", "SenderFault": False} for e in Entries if e["Id"] in refused]
        self.delivered.extend(e["MessageBody"] for e in Entries if e["Id"] not in refused)
        return {"Successful": [{"Id": e["Id"]} for e in Entries if e["Id"] not in refused], "Failed": failed}


def sink(fake: FakeSqs, **kw: Any) -> SqsSink:
    return SqsSink("audit-q", None, "us-east-1", {}, client=fake, retry_delay_s=0.0, **kw)


def bodies(n: int, size: int = 10) -> list[bytes]:
    return [(f'{{"v":1,"n":{i},"pad":"' + "x" * size + '"}').encode() for i in range(n)]


def test_batches_hold_at_most_10_messages_and_the_queue_url_is_resolved_once() -> None:
    fake = FakeSqs()
    s = sink(fake)
    s.send(bodies(23))
    s.send(bodies(4))
    assert [len(c) for c in fake.calls] == [10, 10, 3, 4]
    assert fake.delivered == [b.decode() for b in bodies(23) + bodies(4)]
    assert fake.url_lookups == 1


def test_batches_stay_within_the_256_kib_request_limit() -> None:
    fake = FakeSqs()
    sink(fake).send(bodies(9, size=100_000))
    assert [len(c) for c in fake.calls] == [2, 2, 2, 2, 1]
    assert len(fake.delivered) == 9


def test_partially_failed_entries_are_resent_alone() -> None:
    fake = FakeSqs(refuse=[{"1", "4"}, {"4"}])
    sink(fake).send(bodies(6))
    assert [[e["Id"] for e in c] for c in fake.calls] == [["0", "1", "2", "3", "4", "5"], ["1", "4"], ["4"]]
    assert sorted(fake.delivered) == sorted(b.decode() for b in bodies(6))


def test_entries_still_refused_after_the_last_try_raise() -> None:
    fake = FakeSqs(refuse=[{"2"}, {"2"}, {"2"}, {"2"}])
    with pytest.raises(SinkUnavailable, match="InternalError"):
        sink(fake, max_attempts=3).send(bodies(3))
    assert len(fake.calls) == 3


@pytest.mark.parametrize(
    "error",
    [
        ClientError({"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue"}}, "SendMessageBatch"),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
    ],
)
def test_client_errors_become_sink_unavailable(error: Exception) -> None:
    fake = FakeSqs(error=error)
    with pytest.raises(SinkUnavailable):
        sink(fake).send(bodies(1))


def test_characters_sqs_refuses_are_escaped_to_the_same_json() -> None:
    fake = FakeSqs()
    body = json.dumps({"v": 1, "events": [{"alias": "a\uffffb\ufffe", "x": "é😀"}]}, ensure_ascii=False).encode()
    sink(fake).send([body])
    (sent,) = fake.delivered
    assert "\uffff" not in sent and "\ufffe" not in sent
    assert "é😀" in sent
    assert json.loads(sent) == json.loads(body)


def test_an_empty_batch_sends_nothing() -> None:
    fake = FakeSqs()
    sink(fake).send([])
    assert fake.calls == []
    assert fake.url_lookups == 0


def test_kafka_checksums_run_in_c_and_a_pure_python_fallback_is_reported_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The project installs kafka-python[crc32c]; without it every Kafka send costs 6x the CPU."""
    from kafka.record import util

    from tollway.audit.ship.sinks import kafka as sinks

    assert util.crc32c_c is not None, "crc32c is not installed: kafka-python checksums in pure Python"
    monkeypatch.setattr(sinks, "_crc32c_checked", False)
    with caplog.at_level("WARNING", logger="tollway.audit"):
        assert sinks._check_crc32c()
        assert not caplog.records
        monkeypatch.setattr(util, "crc32c_c", None)
        monkeypatch.setattr(sinks, "_crc32c_checked", False)
        assert not sinks._check_crc32c()
        assert not sinks._check_crc32c()
    assert [r.getMessage() for r in caplog.records] == [
        "kafka-python is checksumming in pure Python: install kafka-python[crc32c] for the audit sink"
    ]


@pytest.mark.parametrize(
    ("body", "key"),
    [
        # As the shipper writes them: only the first event is decoded.
        (b'{"v":1,"events":[{"requestId":"req_a","kind":"k"},{"requestId":"req_b"}]}', b"req_a"),
        (b'{"v":1,"events":[{"kind":"k","body":{"requestId":"inner"},"requestId":"req_c"}]}', b"req_c"),
        # Any other spelling of the envelope is decoded whole.
        (b'{ "v": 1, "events": [ {"requestId": "req_d"} ] }', b"req_d"),
        (b'{"events":[{"requestId":"req_e"}],"v":1}', b"req_e"),
        # No key: the producer spreads such messages.
        (b'{"v":1,"events":[{"kind":"k"}]}', None),
        (b'{"v":1,"events":[{"requestId":7}]}', None),
        (b'{"v":1,"events":[]}', None),
        (b'{"v":1,"events":[not json', None),
        (b"\xff\xfe", None),
    ],
)
def test_the_kafka_key_is_the_first_events_request_id(body: bytes, key: bytes | None) -> None:
    assert _first_request_id(body) == key


def test_the_kafka_key_of_a_full_shipper_message_is_read_from_its_first_event() -> None:
    payloads = [json.dumps({"requestId": f"req_{n}", "pad": "x" * 3000}).encode() for n in range(64)]
    (message,) = _messages(payloads)
    assert _first_request_id(message) == b"req_0"
