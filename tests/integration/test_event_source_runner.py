"""The event-source runner against real local queues: batches, partial failures, retries, the DLQ.

Topologies here use 1-second visibility timeouts so that a retry comes back within seconds.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from tollway.cloud.bootstrap import bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import FunctionSpec, QueueSpec, QueueTrigger, ScheduleTrigger, Topology
from tollway.cloud.runner import BatchOutcome, EventSourceRunner, LambdaContext, QueueMapping, RunnerError

pytestmark = pytest.mark.local_cloud

WAIT_S = 10.0
"""Upper bound on any wait for a message to come back (visibility timeouts here are 1 s)."""


def work_topology(prefix: str, *, visibility_s: int = 1, max_receive: int = 2) -> Topology:
    queue = QueueSpec("work", f"{prefix}-work", visibility_timeout_s=visibility_s, max_receive_count=max_receive)
    return Topology(prefix=prefix, queues=(queue,), tables=(), buckets=(), secrets=(), functions=())


def worker(prefix: str, *, batch_size: int = 10, window_s: int = 0, timeout_s: int = 1, **trigger: Any) -> FunctionSpec:
    return FunctionSpec(
        key="worker",
        name=f"{prefix}-worker",
        handler="tests.integration.unused.handler",
        source_dir="functions/worker",
        memory_mb=256,
        timeout_s=timeout_s,
        triggers=(QueueTrigger("work", batch_size=batch_size, max_batching_window_s=window_s, **trigger),),
    )


@dataclass
class Recorder:
    """A handler that records its events and fails the records whose body starts with ``fail``."""

    respond: Callable[[dict[str, Any]], Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    contexts: list[Any] = field(default_factory=list)

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        self.events.append(event)
        self.contexts.append(context)
        if self.respond is not None:
            return self.respond(event)
        failed = [r["messageId"] for r in event["Records"] if r["body"].startswith("fail")]
        return {"batchItemFailures": [{"itemIdentifier": i} for i in failed]}

    @property
    def bodies(self) -> list[list[str]]:
        return [[r["body"] for r in e["Records"]] for e in self.events]


@dataclass
class Rig:
    cloud: LocalCloud
    topo: Topology
    runner: EventSourceRunner
    mapping: QueueMapping
    sqs: Any

    def send(self, *bodies: str, **attributes: Any) -> list[str]:
        ids = []
        for body in bodies:
            request: dict[str, Any] = {"QueueUrl": self.mapping.queue_url, "MessageBody": body}
            if attributes:
                request["MessageAttributes"] = attributes
            ids.append(self.sqs.send_message(**request)["MessageId"])
        return ids

    def poll_until_received(self) -> BatchOutcome:
        """Poll until a batch arrives (a retried message reappears after the visibility timeout)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            outcome = self.runner.poll_once(self.mapping, wait_s=1)
            if outcome.received:
                return outcome
        raise AssertionError(f"nothing received within {WAIT_S} s")

    def counts(self, url: str | None = None) -> tuple[int, int]:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.mapping.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def drain(self, url: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for _ in range(10):
            got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
            if not got.get("Messages"):
                break
            messages += got["Messages"]
        return messages

    def dlq_url(self) -> str:
        return str(self.sqs.get_queue_url(QueueName=self.topo.queue("work").dlq_name)["QueueUrl"])


@pytest.fixture
def make_rig(cloud: LocalCloud, prefix: str) -> Iterator[Callable[..., Rig]]:
    runners: list[EventSourceRunner] = []

    def make(handler: Callable[..., Any], *, visibility_s: int = 1, max_receive: int = 2, **fn: Any) -> Rig:
        topo = work_topology(prefix, visibility_s=visibility_s, max_receive=max_receive)
        bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
        runner = EventSourceRunner(
            topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), load_functions=False
        )
        runners.append(runner)
        (mapping,) = runner.add_function(worker(prefix, **fn), handler).mappings
        env = cloud.env()
        sqs = boto3.client(
            "sqs",
            endpoint_url=cloud.endpoint,
            region_name=cloud.region,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        return Rig(cloud, topo, runner, mapping, sqs)

    yield make
    for runner in runners:
        assert runner.stop(timeout_s=5)


def test_reported_failures_are_retried_then_dead_lettered(make_rig: Callable[..., Rig]) -> None:
    handler = Recorder()
    rig = make_rig(handler, max_receive=2)
    ok_ids = rig.send("ok-1", "ok-2", "ok-3")
    fail_ids = rig.send("fail-1", "fail-2")

    first = rig.poll_until_received()
    assert first.received == 5 and first.error is None
    assert first.deleted == 3
    assert set(first.retried) == set(fail_ids)
    assert rig.counts() == (0, 2)  # only the failed ones remain, in flight

    second = rig.poll_until_received()
    assert set(second.retried) == set(fail_ids)
    (retry_event,) = handler.events[1:]
    assert sorted(r["body"] for r in retry_event["Records"]) == ["fail-1", "fail-2"]
    assert {r["attributes"]["ApproximateReceiveCount"] for r in retry_event["Records"]} == {"2"}

    # Received twice (maxReceiveCount): the next receive redrives them to the DLQ.
    dlq = rig.dlq_url()
    deadline = time.monotonic() + WAIT_S
    while rig.counts(dlq)[0] < 2 and time.monotonic() < deadline:
        assert not rig.runner.poll_once(rig.mapping, wait_s=1).invoked
    assert rig.counts() == (0, 0)
    dead = rig.drain(dlq)
    assert sorted(m["Body"] for m in dead) == ["fail-1", "fail-2"]
    assert len(handler.events) == 2
    assert not set(ok_ids) & {r["messageId"] for r in retry_event["Records"]}


def test_a_raised_exception_fails_the_whole_batch(
    make_rig: Callable[..., Rig], caplog: pytest.LogCaptureFixture
) -> None:
    secret_body = "metadata-" + uuid.uuid4().hex

    def explode(event: dict[str, Any]) -> Any:
        raise ValueError(f"cannot handle {event['Records'][0]['body']}")

    handler = Recorder(respond=explode)
    rig = make_rig(handler)
    ids = rig.send(secret_body, "ok")

    with caplog.at_level(logging.DEBUG, logger="tollway.cloud.runner"):
        outcome = rig.poll_until_received()
    assert outcome.error == "ValueError"
    assert outcome.deleted == 0 and set(outcome.retried) == set(ids)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert rig.mapping.function.name in logged and "ValueError" in logged
    assert secret_body not in logged and secret_body not in caplog.text

    again = rig.poll_until_received()
    assert {r["attributes"]["ApproximateReceiveCount"] for r in handler.events[-1]["Records"]} == {"2"}
    assert set(again.retried) == set(ids)


@pytest.mark.parametrize(
    "response",
    [
        {"batchItemFailures": [{"itemIdentifier": "not-a-message-id"}]},
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"id": "wrong key"}]},
        {"batchItemFailures": "not a list"},
        "not an object",
    ],
    ids=["unknown-id", "empty-id", "null-id", "bad-key", "not-a-list", "not-an-object"],
)
def test_an_invalid_response_fails_the_whole_batch(make_rig: Callable[..., Rig], response: Any) -> None:
    rig = make_rig(Recorder(respond=lambda event: response))
    ids = rig.send("a", "b", "c")

    outcome = rig.poll_until_received()

    assert outcome.error == "invalid response"
    assert outcome.deleted == 0 and set(outcome.retried) == set(ids)
    assert rig.counts() == (0, 3)


@pytest.mark.parametrize(
    "response",
    [None, {}, {"batchItemFailures": []}, {"batchItemFailures": None}, {"statusCode": 200}],
    ids=["none", "empty-object", "empty-list", "null-list", "other-keys"],
)
def test_no_reported_failures_deletes_the_whole_batch(make_rig: Callable[..., Rig], response: Any) -> None:
    rig = make_rig(Recorder(respond=lambda event: response))
    rig.send("a", "b", "c")

    outcome = rig.poll_until_received()

    assert (outcome.error, outcome.deleted, outcome.retried) == (None, 3, ())
    assert rig.counts() == (0, 0)


def test_a_function_past_its_timeout_fails_the_batch(make_rig: Callable[..., Rig]) -> None:
    def slow(event: dict[str, Any]) -> Any:
        time.sleep(1.2)
        return None

    rig = make_rig(Recorder(respond=slow), visibility_s=5, timeout_s=1)
    ids = rig.send("slow")

    outcome = rig.poll_until_received()

    assert outcome.error == "timeout" and outcome.retried == tuple(ids)
    assert rig.counts() == (0, 1)


def test_batches_never_exceed_the_batch_size(make_rig: Callable[..., Rig]) -> None:
    handler = Recorder(respond=lambda event: None)
    rig = make_rig(handler, visibility_s=30, batch_size=10, window_s=1)
    sent = rig.send(*(f"m{i}" for i in range(25)))

    outcomes = [rig.poll_until_received() for _ in range(3)]

    sizes = [len(e["Records"]) for e in handler.events]
    assert sizes == [10, 10, 5]
    assert all(max(o.batch_sizes) <= 10 for o in outcomes)
    handled = [r["messageId"] for e in handler.events for r in e["Records"]]
    assert sorted(handled) == sorted(sent)
    assert rig.counts() == (0, 0)


def test_a_batch_fills_across_receives_up_to_its_size(make_rig: Callable[..., Rig]) -> None:
    handler = Recorder(respond=lambda event: None)
    rig = make_rig(handler, visibility_s=30, batch_size=25, window_s=5)
    rig.send(*(f"m{i}" for i in range(25)))

    outcome = rig.poll_until_received()

    assert [len(e["Records"]) for e in handler.events] == [25]
    assert len(outcome.batch_sizes) >= 3 and max(outcome.batch_sizes) <= 10 and sum(outcome.batch_sizes) == 25


def test_the_batching_window_bounds_the_wait_for_a_full_batch(make_rig: Callable[..., Rig]) -> None:
    handler = Recorder(respond=lambda event: None)
    rig = make_rig(handler, visibility_s=30, batch_size=20, window_s=1)
    rig.send(*(f"m{i}" for i in range(5)))

    started = time.monotonic()
    outcome = rig.poll_until_received()
    elapsed = time.monotonic() - started

    assert outcome.received == 5 and [len(e["Records"]) for e in handler.events] == [5]
    assert 0.9 <= elapsed < 3.0


def test_events_and_context_have_lambdas_shapes(make_rig: Callable[..., Rig], cloud: LocalCloud) -> None:
    handler = Recorder(respond=lambda event: None)
    rig = make_rig(handler)
    blob = bytes(range(7))
    (message_id,) = rig.send(
        '{"eventId": "e-1"}',
        kind={"DataType": "String", "StringValue": "audit"},
        count={"DataType": "Number", "StringValue": "3"},
        blob={"DataType": "Binary", "BinaryValue": blob},
    )

    rig.poll_until_received()

    (event,) = handler.events
    assert set(event) == {"Records"}
    (record,) = event["Records"]
    assert set(record) == {
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "md5OfMessageAttributes",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    }
    assert record["messageId"] == message_id
    assert isinstance(record["receiptHandle"], str) and record["receiptHandle"]
    assert record["body"] == '{"eventId": "e-1"}'
    assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()
    assert isinstance(record["md5OfMessageAttributes"], str)
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == rig.mapping.queue_arn
    assert record["eventSourceARN"].startswith(f"arn:aws:sqs:{cloud.region}:")
    assert record["eventSourceARN"].endswith(":" + rig.mapping.queue.name)
    assert record["awsRegion"] == cloud.region

    attributes = record["attributes"]
    for key in ("ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"):
        assert isinstance(attributes[key], str) and attributes[key]
    assert attributes["ApproximateReceiveCount"] == "1"
    assert all(isinstance(v, str) for v in attributes.values())
    sent_ms = int(attributes["SentTimestamp"])
    assert abs(sent_ms / 1000 - time.time()) < 60

    shaped = record["messageAttributes"]
    assert shaped["kind"] == {
        "stringValue": "audit",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }
    assert shaped["count"] == {"stringValue": "3", "stringListValues": [], "binaryListValues": [], "dataType": "Number"}
    assert set(shaped["blob"]) == {"binaryValue", "stringListValues", "binaryListValues", "dataType"}
    assert shaped["blob"]["dataType"] == "Binary"
    assert base64.b64decode(shaped["blob"]["binaryValue"]) == blob

    (context,) = handler.contexts
    assert isinstance(context, LambdaContext)
    uuid.UUID(context.aws_request_id)
    assert context.function_name == rig.mapping.function.name
    assert context.memory_limit_in_mb == "256"
    assert context.invoked_function_arn.startswith(f"arn:aws:lambda:{cloud.region}:")
    assert context.invoked_function_arn.endswith(f":function:{rig.mapping.function.name}")
    remaining = context.get_remaining_time_in_millis()
    assert isinstance(remaining, int) and 0 <= remaining <= 1000


def test_the_runner_redrives_itself_when_the_queue_has_no_policy(make_rig: Callable[..., Rig]) -> None:
    """An emulator that ignores RedrivePolicy: the runner moves the message after maxReceiveCount."""
    handler = Recorder()
    rig = make_rig(handler, max_receive=1)
    rig.sqs.set_queue_attributes(QueueUrl=rig.mapping.queue_url, Attributes={"RedrivePolicy": ""})
    attrs = rig.sqs.get_queue_attributes(QueueUrl=rig.mapping.queue_url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in attrs
    (message_id,) = rig.send("fail-once", kind={"DataType": "String", "StringValue": "k"})

    first = rig.poll_until_received()
    assert first.retried == (message_id,)
    second = rig.poll_until_received()

    assert second.redriven == (message_id,) and not second.invoked
    assert len(handler.events) == 1
    (dead,) = rig.drain(rig.dlq_url())
    assert dead["Body"] == "fail-once"
    assert rig.counts() == (0, 0)


def test_the_background_runner_survives_handler_errors_and_stops_promptly(make_rig: Callable[..., Rig]) -> None:
    done = threading.Event()
    seen: list[str] = []

    def handle(event: dict[str, Any]) -> Any:
        bodies = [r["body"] for r in event["Records"]]
        seen.extend(bodies)
        if "boom" in bodies:
            raise RuntimeError("handler bug")
        if "last" in bodies:
            done.set()
        return None

    rig = make_rig(Recorder(respond=handle), visibility_s=30, batch_size=1)
    rig.runner.start()
    rig.send("boom")
    deadline = time.monotonic() + WAIT_S
    while "boom" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    rig.send("last")
    assert done.wait(WAIT_S)

    started = time.monotonic()
    assert rig.runner.stop(timeout_s=5)
    assert time.monotonic() - started < 3
    assert seen == ["boom", "last"]


@pytest.mark.parametrize("max_concurrency", [None, 2])
def test_invocations_per_mapping_are_bounded_by_max_concurrency(
    make_rig: Callable[..., Rig], max_concurrency: int | None
) -> None:
    lock = threading.Lock()
    active = peak = handled = 0

    def handle(event: dict[str, Any]) -> Any:
        nonlocal active, peak, handled
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.2)
        with lock:
            active -= 1
            handled += len(event["Records"])
        return None

    rig = make_rig(Recorder(respond=handle), visibility_s=30, batch_size=1, max_concurrency=max_concurrency)
    rig.send(*(f"m{i}" for i in range(6)))
    rig.runner.start()
    deadline = time.monotonic() + WAIT_S
    while handled < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rig.runner.stop(timeout_s=5)

    assert handled == 6
    assert peak == (max_concurrency or 1)


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self._now = now
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, now: datetime) -> None:
        with self._lock:
            self._now = now


def scheduled(prefix: str, *schedules: ScheduleTrigger) -> FunctionSpec:
    return FunctionSpec(
        "refresh", f"{prefix}-refresh", "tests.unused.handler", "functions/refresh", schedules=schedules
    )


def test_schedules_fire_at_their_times_with_the_scheduled_event_shape(cloud: LocalCloud, prefix: str) -> None:
    start = datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC)  # a Tuesday
    clock = FakeClock(start)
    runner = EventSourceRunner(
        work_topology(prefix), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), clock=clock
    )
    handler = Recorder(respond=lambda event: None)
    rate = ScheduleTrigger(f"{prefix}-every-5", "rate(5 minutes)")
    cron = ScheduleTrigger(f"{prefix}-office", "cron(0,30 8-10/2 ? * MON-FRI *)")
    runner.add_function(scheduled(prefix, rate, cron), handler)

    assert runner.fire_due(start + timedelta(minutes=4, seconds=59)) == []
    (first,) = runner.fire_due(start + timedelta(minutes=5))
    assert (first.rule, first.scheduled_time, first.error) == (
        rate.name,
        datetime(2030, 1, 1, 0, 5, 30, tzinfo=UTC),
        None,
    )

    fired = runner.fire_due(datetime(2030, 1, 1, 8, 0, tzinfo=UTC))
    # The rate's missed slots are not backfilled: one event for the earliest, then it resumes after now.
    assert [(f.rule, f.event["time"]) for f in fired] == [
        (rate.name, "2030-01-01T00:10:30Z"),
        (cron.name, "2030-01-01T08:00:00Z"),
    ]
    later = [runner.fire_due(datetime(2030, 1, 1, h, m, tzinfo=UTC)) for h, m in ((8, 29), (8, 30), (9, 30), (10, 0))]
    assert [[f.event["time"] for f in batch if f.rule == cron.name] for batch in later] == [
        [],
        ["2030-01-01T08:30:00Z"],
        [],
        ["2030-01-01T10:00:00Z"],
    ]
    cron_rule = next(r for r in runner.schedules if r.trigger.name == cron.name)
    runner.fire_due(datetime(2030, 1, 1, 10, 30, tzinfo=UTC))
    assert cron_rule.next_fire == datetime(2030, 1, 2, 8, 0, tzinfo=UTC)  # Wednesday morning
    runner.fire_due(datetime(2030, 1, 4, 10, 30, tzinfo=UTC))  # Friday's last slot
    assert cron_rule.next_fire == datetime(2030, 1, 7, 8, 0, tzinfo=UTC)  # skips the weekend

    event = first.event
    assert set(event) == {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
    assert event["version"] == "0"
    uuid.UUID(event["id"])
    assert (event["detail-type"], event["source"], event["detail"]) == ("Scheduled Event", "aws.events", {})
    assert event["account"] == runner.account and event["region"] == cloud.region
    assert event["resources"] == [f"arn:aws:events:{cloud.region}:{runner.account}:rule/{rate.name}"]
    assert handler.events[0] == event
    assert handler.contexts[0].function_name == f"{prefix}-refresh"


def test_the_background_scheduler_follows_the_injected_clock(cloud: LocalCloud, prefix: str) -> None:
    start = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
    clock = FakeClock(start)
    runner = EventSourceRunner(
        work_topology(prefix), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), clock=clock
    )
    fired = threading.Event()
    times: list[str] = []

    def handle(event: dict[str, Any]) -> Any:
        times.append(event["time"])
        fired.set()
        return None

    runner.add_function(
        scheduled(prefix, ScheduleTrigger(f"{prefix}-hourly", "rate(1 hour)")), Recorder(respond=handle)
    )
    runner.start(schedule_tick_s=0.05)
    try:
        assert not fired.wait(0.3)
        clock.set(start + timedelta(hours=1))
        assert fired.wait(WAIT_S)
    finally:
        assert runner.stop(timeout_s=5)
    assert times == ["2030-06-01T13:00:00Z"]


def test_mappings_fail_fast_on_what_aws_would_reject(cloud: LocalCloud, prefix: str) -> None:
    topo = work_topology(prefix, visibility_s=1)
    runner = EventSourceRunner(
        topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), load_functions=False
    )
    with pytest.raises(RunnerError, match="has the bootstrap run") as missing:
        runner.add_function(worker(prefix), lambda e, c: None)
    assert cloud.endpoint in str(missing.value) and topo.queue("work").name in str(missing.value)

    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    with pytest.raises(RunnerError, match="visibility timeout 1 s is less than the function timeout 5 s"):
        runner.add_function(worker(prefix, timeout_s=5), lambda e, c: None)
    with pytest.raises(RunnerError, match="batching window of at least 1 s"):
        runner.add_function(worker(prefix, batch_size=11, window_s=0), lambda e, c: None)
    with pytest.raises(RunnerError, match="cannot load handler"):
        runner.add_function(worker(prefix))
