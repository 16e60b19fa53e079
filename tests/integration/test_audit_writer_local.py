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
from collections.abc import Iterator
from typing import Any

import pytest

from functions.audit_writer import handler as handler_module
from tests.support.audit_events import admitted, attempt_done, finished, message, started
from tests.support.local_queue import WAIT_S, QueueRig, queue_rig
from tollway.audit import cli
from tollway.audit.events import AuditEvent
from tollway.audit.store import DEFAULT_RETENTION_DAYS, AuditStore, DynamoDBAuditStore, iso_ts
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud


def lifecycle(rid: str, principal: str, *, complete: bool, later_ms: int = 0) -> list[AuditEvent]:
    """A request whose first attempt fails and whose fallback succeeds; or, incomplete, a crash mid-fallback.

    ``later_ms`` shifts every timestamp, so that requests built together list in a known order.
    """
    events = [
        admitted(rid, principal_id=principal, team=None, max_attempts=2),
        started(rid, 1, deployment_id="dep-a"),
        attempt_done(rid, 1, outcome="error", status=503, deployment_id="dep-a"),
        started(rid, 2, reason="fallback", deployment_id="dep-b"),
    ]
    if complete:
        # Usage under OpenAI's names, which the readers accept beside the recorder's.
        usage = {"prompt_tokens": 21, "completion_tokens": 34, "total_tokens": 55}
        events += [
            attempt_done(rid, 2, first_token_ms=80.25, total_ms=412.0, deployment_id="dep-b"),
            finished(rid, attempts=2, total_ms=450.5, usage=usage),
        ]
    return [dataclasses.replace(e, ts_ms=e.ts_ms + later_ms) for e in events]


@pytest.fixture
def rig(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[QueueRig]:
    full = topology(prefix)
    writer = full.function("audit-writer")
    with queue_rig(cloud, monkeypatch, full, queue="audit", table="audit", function=writer) as rig:
        assert rig.mapping.handler is handler_module.handler  # the deployed entry point, from the spec's dotted path
        yield rig


def test_batches_become_one_request_item_and_one_item_per_attempt(rig: QueueRig) -> None:
    done = lifecycle("req-done", "principal-a", complete=True)
    crashed = lifecycle("req-crashed", "principal-a", complete=False, later_ms=1000)
    rig.send(message(done[:3]), message(done[3:]), message(crashed))

    rig.deliver(3)

    items = rig.items()
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


def test_duplicate_and_reordered_delivery_creates_nothing_new(rig: QueueRig, caplog: pytest.LogCaptureFixture) -> None:
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


def test_a_poison_message_fails_alone_then_lands_in_the_dead_letter_queue(rig: QueueRig) -> None:
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
    rig: QueueRig, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.send(message(lifecycle("req-cli", "principal-c", complete=True)))
    rig.send(message(lifecycle("req-cli-crash", "principal-c", complete=False, later_ms=1000)))
    rig.deliver(2)
    capsys.readouterr()  # what the handler printed (its EMF metrics document) is not the CLI's answer

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


def test_a_batch_is_one_write_per_item_and_a_replay_one_failed_write_per_item(rig: QueueRig) -> None:
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
    calls.take()  # the read-back shares the handler's client (one per setting): its reads are not the writer's

    # Redelivered in another batching: every event is a duplicate, found by one failed write per item.
    rig.send(message([e for r in requests for e in r][::-1]), message(requests[0][:1] + requests[2][::-1]))
    replay = rig.runner.poll_once(rig.mapping, wait_s=1)
    assert (replay.received, replay.deleted, replay.retried) == (2, 2, ())
    assert calls.take() == {"PutItem": 9}
    assert rig.items() == before


def test_an_item_partly_stored_is_completed_by_one_update_of_what_it_lacks(rig: QueueRig) -> None:
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
    request = rig.items()[("REQ#req-half", "REQUEST")]
    assert sorted(request["eventIds"]["SS"]) == sorted([events[0].event_id, events[-1].event_id])
