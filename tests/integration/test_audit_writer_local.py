"""The audit writer on the local cloud: audit queue → event-source runner → the real handler → DynamoDB.

Each test bootstraps the audit queue and table of a fresh stage from ``topology()`` and runs the
runner with the topology's own ``audit-writer`` spec, so the handler is imported from its dotted
path and builds its DynamoDB store from the environment, as on Lambda. Only two settings change,
so that a retry comes back within seconds: the queue's visibility timeout (3 s, and the function
timeout with it, which the runner checks against it) and maxReceiveCount (2).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from functions.audit_writer import handler as handler_module
from tollway.audit import cli
from tollway.audit import events as ev
from tollway.audit.events import AuditEvent
from tollway.audit.store import DEFAULT_RETENTION_DAYS, AuditStore, DynamoDBAuditStore, iso_ts
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import Topology, topology
from tollway.cloud.runner import EventSourceRunner, QueueMapping

pytestmark = pytest.mark.local_cloud

VISIBILITY_S = 3
WAIT_S = 30.0
DIGEST = "sha256:" + "cd" * 32


def message(events: Sequence[AuditEvent]) -> str:
    """A message as the WAL shipper packs it: the events' own JSON, in order."""
    return '{"v":1,"events":[' + ",".join(e.encode().decode() for e in events) + "]}"


def lifecycle(rid: str, principal: str, *, complete: bool, later_ms: int = 0) -> list[AuditEvent]:
    """A request whose first attempt fails and whose fallback succeeds; or, incomplete, a crash mid-fallback.

    ``later_ms`` shifts every timestamp, so that requests built together list in a known order.
    """
    common: dict[str, Any] = {"request_id": rid, "root_digest": DIGEST}
    route: dict[str, Any] = {"route_id": "chat/primary", "deployment_id": "dep-a"}
    fallback: dict[str, Any] = {"route_id": "chat/secondary", "deployment_id": "dep-b"}
    events = [
        ev.request_admitted(
            **common,
            principal_id=principal,
            tenant="tenant-1",
            team=None,
            key_id="key-1",
            alias="chat",
            stream=True,
            content_mode="metadata-only",
            max_attempts=2,
        ),
        ev.attempt_started(
            **common,
            **route,
            attempt=1,
            provider_format="openai-chat-completions",
            physical_model="m-a",
            reason="first",
        ),
        ev.attempt_finished(
            **common,
            **route,
            attempt=1,
            outcome="error",
            error_category="overloaded",
            upstream_status=503,
            first_token_ms=None,
            total_ms=31.5,
        ),
        ev.attempt_started(
            **common,
            **fallback,
            attempt=2,
            provider_format="anthropic-messages",
            physical_model="m-b",
            reason="fallback",
        ),
    ]
    if complete:
        events += [
            ev.attempt_finished(
                **common,
                **fallback,
                attempt=2,
                outcome="ok",
                error_category=None,
                upstream_status=200,
                first_token_ms=80.25,
                total_ms=412.0,
            ),
            ev.request_finished(
                **common,
                status=200,
                outcome="ok",
                error_code=None,
                attempts=2,
                admission_ms=0.75,
                total_ms=450.5,
                usage={"prompt_tokens": 21, "completion_tokens": 34, "total_tokens": 55},
                usage_evidence="provider-reported",
                cancellation=None,
                principal_id="p-1",
                tenant="t-1",
                team=None,
                key_id="k-1",
                alias="chat-fast-v1",
            ),
        ]
    return [dataclasses.replace(e, ts_ms=e.ts_ms + later_ms) for e in events]


@dataclass
class Rig:
    topo: Topology
    runner: EventSourceRunner
    mapping: QueueMapping
    sqs: Any
    ddb: Any

    @property
    def table(self) -> str:
        return self.topo.table("audit").name

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
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.mapping.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def items(self) -> list[dict[str, Any]]:
        """Every item of the table, raw (DynamoDB's typed JSON), in key order."""
        found = self.ddb.scan(TableName=self.table, ConsistentRead=True)["Items"]
        return sorted(found, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))


@pytest.fixture
def rig(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    full = topology(prefix)
    queue = dataclasses.replace(full.queue("audit"), visibility_timeout_s=VISIBILITY_S, max_receive_count=2)
    writer = dataclasses.replace(full.function("audit-writer"), timeout_s=VISIBILITY_S)
    topo = dataclasses.replace(
        full, queues=(queue,), tables=(full.table("audit"),), buckets=(), secrets=(), functions=(writer,)
    )
    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    # What the function's Lambda environment holds (tollway.cloud's `up` exports the same).
    for key, value in {**cloud.env(), **topo.environment(report.account, cloud.region)}.items():
        monkeypatch.setenv(key, value)
    runner = EventSourceRunner(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    (mapping,) = runner.mappings
    assert mapping.handler is handler_module.handler  # the deployed entry point, from the spec's dotted path
    clients = Clients(cloud.endpoint, cloud.region, cloud.env())
    yield Rig(topo, runner, mapping, clients.client("sqs"), clients.client("dynamodb"))
    assert runner.stop(timeout_s=5)


def test_batches_become_one_request_item_and_one_item_per_attempt(rig: Rig) -> None:
    done = lifecycle("req-done", "principal-a", complete=True)
    crashed = lifecycle("req-crashed", "principal-a", complete=False, later_ms=1000)
    rig.send(message(done[:3]), message(done[3:]), message(crashed))

    rig.deliver(3)

    items = {(i["pk"]["S"], i["sk"]["S"]): i for i in rig.items()}
    assert sorted(items) == [
        ("REQ#req-crashed", "ATTEMPT#0001"),
        ("REQ#req-crashed", "ATTEMPT#0002"),
        ("REQ#req-crashed", "REQUEST"),
        ("REQ#req-done", "ATTEMPT#0001"),
        ("REQ#req-done", "ATTEMPT#0002"),
        ("REQ#req-done", "REQUEST"),
    ]
    request = items[("REQ#req-done", "REQUEST")]
    admitted, finished = done[0], done[-1]
    assert sorted(request["eventIds"]["SS"]) == sorted([admitted.event_id, finished.event_id])
    assert request["principalId"] == {"S": "principal-a"}
    assert request["ts"] == {"S": iso_ts(admitted.ts_ms)}
    assert request["expiresAt"] == {"N": str(admitted.ts_ms // 1000 + DEFAULT_RETENTION_DAYS * 86_400)}
    assert request["usage"]["M"]["total_tokens"] == {"N": "55"} and request["teamId"] == {"NULL": True}
    attempt = items[("REQ#req-done", "ATTEMPT#0002")]
    assert sorted(attempt["eventIds"]["SS"]) == sorted([done[3].event_id, done[4].event_id])
    assert attempt["expiresAt"] == {"N": str(done[3].ts_ms // 1000 + DEFAULT_RETENTION_DAYS * 86_400)}
    assert (attempt["totalMs"], attempt["upstreamStatus"]) == ({"N": "412.0"}, {"N": "200"})

    store = DynamoDBAuditStore.from_env()
    view = store.get_request("req-done")
    assert view is not None and not view.incomplete
    assert [(a.number, a.outcome, a.reason, a.deployment_id) for a in view.attempts] == [
        (1, "error", "first", "dep-a"),
        (2, "ok", "fallback", "dep-b"),
    ]
    assert (view.request.status, view.request.usage, view.request.total_ms) == (
        200,
        {"prompt_tokens": 21, "completion_tokens": 34, "total_tokens": 55},
        450.5,
    )
    partial = store.get_request("req-crashed")
    assert partial is not None and partial.request.incomplete
    assert [(a.number, a.incomplete) for a in partial.attempts] == [(1, False), (2, True)]
    listed = store.list_requests(admitted.ts_ms - 60_000, principal_id="principal-a")
    assert [r.request_id for r in listed] == ["req-crashed", "req-done"]  # newest first, through the index
    assert [r.request_id for r in store.list_requests(admitted.ts_ms - 60_000)] == ["req-crashed", "req-done"]


def test_duplicate_and_reordered_delivery_creates_nothing_new(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    events = lifecycle("req-dup", "principal-d", complete=True)
    rig.send(message(events))
    rig.deliver(1)
    before = rig.items()
    assert len(before) == 3

    # The shipper resends after a lost acknowledgement: same events, other batching and order.
    ids = rig.send(message(events), message(events[::-1]), message(events[2:4]))
    with caplog.at_level(logging.INFO, logger="tollway.audit_writer"):
        rig.deliver(3)

    assert rig.items() == before
    counts = {i: m for r in caplog.records for i in ids if i in (m := r.getMessage())}
    assert counts == {
        ids[0]: f"message {ids[0]}: 0 event(s) applied, 6 duplicate(s), 0 of unknown kind",
        ids[1]: f"message {ids[1]}: 0 event(s) applied, 6 duplicate(s), 0 of unknown kind",
        ids[2]: f"message {ids[2]}: 0 event(s) applied, 2 duplicate(s), 0 of unknown kind",
    }


def test_a_poison_message_fails_alone_then_lands_in_the_dead_letter_queue(rig: Rig) -> None:
    good = lifecycle("req-ok", "principal-p", complete=True)
    poison = '{"v":1,"events":[{"kind":"attempt_started","requestId":"req-poison"}]}'
    poison_id, _ = rig.send(poison, message(good))

    first = rig.runner.poll_once(rig.mapping, wait_s=1)
    assert first.received == 2 and first.error is None
    assert first.retried == (poison_id,) and first.deleted == 1
    view = DynamoDBAuditStore.from_env().get_request("req-ok")
    assert view is not None and not view.incomplete

    dlq = str(rig.sqs.get_queue_url(QueueName=rig.mapping.queue.dlq_name)["QueueUrl"])
    deadline = time.monotonic() + WAIT_S
    receives = 1
    while rig.visible(dlq)[0] < 1:
        assert time.monotonic() < deadline, "the poison message never reached the dead-letter queue"
        outcome = rig.runner.poll_once(rig.mapping, wait_s=1)
        if outcome.invoked:
            assert outcome.retried == (poison_id,)
            receives += 1
    assert receives == rig.mapping.queue.max_receive_count
    assert rig.visible() == (0, 0)
    (dead,) = rig.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    assert dead["Body"] == poison
    assert DynamoDBAuditStore.from_env().get_request("req-poison") is None


def test_the_cli_shows_a_request_with_its_ordered_attempts_from_dynamodb(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.send(message(lifecycle("req-cli", "principal-c", complete=True)))
    rig.send(message(lifecycle("req-cli-crash", "principal-c", complete=False, later_ms=1000)))
    rig.deliver(2)

    assert cli.main(["show", "req-cli"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("request req-cli  complete  status 200  outcome ok  attempts 2  total 450.5 ms")
    assert "usage prompt=21 completion=34 total=55 (provider-reported)" in lines[0]
    attempts = [line for line in lines if line.startswith("  attempt ")]
    assert attempts[0].startswith("  attempt 1  error  status 503  error overloaded")
    assert attempts[1].startswith("  attempt 2  ok  status 200") and "first-token 80.2 ms" in attempts[1]

    assert cli.main(["show", "req-cli-crash"]) == 0
    crashed = capsys.readouterr().out
    assert "INCOMPLETE (no request_finished)" in crashed.splitlines()[0]
    assert "  attempt 2  INCOMPLETE (no attempt_finished)" in crashed

    assert cli.main(["list", "--since", "1h", "--principal", "principal-c", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["request_id"], r["incomplete"]) for r in listed] == [("req-cli-crash", True), ("req-cli", False)]

    assert cli.main(["show", "req-never"]) == 1
    assert "no audit record for request req-never" in capsys.readouterr().err


class WriteCalls:
    """The audit store's DynamoDB calls by operation, counted with a botocore ``before-call`` hook."""

    def __init__(self, store: AuditStore) -> None:
        assert isinstance(store, DynamoDBAuditStore)
        self.ops: list[str] = []
        store.client.meta.events.register("before-call.dynamodb", self)

    def __call__(self, model: Any, **_: Any) -> None:
        self.ops.append(model.name)

    def take(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op] = counts.get(op, 0) + 1
        self.ops.clear()
        return counts


def test_a_batch_is_one_write_per_item_and_a_replay_one_failed_write_per_item(rig: Rig) -> None:
    calls = WriteCalls(handler_module.default_store())  # the store the handler builds and keeps
    requests = [lifecycle(f"req-merge-{n}", "principal-m", complete=True, later_ms=n) for n in range(3)]
    # Each request's start in one message and its end in another, as the shipper cuts a busy WAL.
    bodies = [message([e for r in requests for e in r[:3]]), message([e for r in requests for e in r[3:]])]
    rig.send(*bodies)

    outcome = rig.runner.poll_once(rig.mapping, wait_s=1)

    assert (outcome.received, outcome.deleted, outcome.retried, outcome.error) == (2, 2, (), None)
    assert calls.take() == {"PutItem": 9}  # a request item and two attempt items each, one write apiece
    before = rig.items()
    assert len(before) == 9
    store = DynamoDBAuditStore.from_env()
    for r in requests:
        view = store.get_request(r[0].request_id)
        assert view is not None and not view.incomplete
        assert [(a.number, a.outcome) for a in view.attempts] == [(1, "error"), (2, "ok")]

    # Redelivered in another batching: every event is a duplicate, found by one failed write per item.
    rig.send(message([e for r in requests for e in r][::-1]), message(requests[0][:1] + requests[2][::-1]))
    replay = rig.runner.poll_once(rig.mapping, wait_s=1)
    assert (replay.received, replay.deleted, replay.retried) == (2, 2, ())
    assert calls.take() == {"PutItem": 9}
    assert rig.items() == before


def test_an_item_partly_stored_is_completed_by_one_update_of_what_it_lacks(rig: Rig) -> None:
    calls = WriteCalls(handler_module.default_store())
    events = lifecycle("req-half", "principal-h", complete=True)
    rig.send(message(events[:2]))  # admitted, attempt 1 started
    rig.deliver(1)
    calls.take()

    rig.send(message(events))
    rig.deliver(1)

    # The request and attempt 1 exist: a failed create each, then one update with the rest.
    # Attempt 2 is new: one create.
    assert calls.take() == {"PutItem": 3, "UpdateItem": 2}
    view = DynamoDBAuditStore.from_env().get_request("req-half")
    assert view is not None and not view.incomplete and len(view.attempts) == 2
    request = next(i for i in rig.items() if i["sk"]["S"] == "REQUEST")
    assert sorted(request["eventIds"]["SS"]) == sorted([events[0].event_id, events[-1].event_id])
