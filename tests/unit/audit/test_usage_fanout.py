"""The usage queue's share of each shipped batch: request_finished events only, all-or-nothing."""

from __future__ import annotations

import json

import pytest

from tollway.audit.sinks import SinkUnavailable, UsageFanOut, usage_messages


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[bytes]] = []
        self.fail = fail

    def send(self, batch: list[bytes]) -> None:
        if self.fail:
            raise SinkUnavailable("queue down")
        self.batches.append(batch)


def message(*kinds: str) -> bytes:
    events = [{"kind": k, "eventId": f"e{i}", "requestId": f"r{i}"} for i, k in enumerate(kinds)]
    return json.dumps({"v": 1, "events": events}).encode()


def test_only_request_finished_events_go_to_the_usage_queue() -> None:
    audit, usage = Recorder(), Recorder()
    batch = [message("request_admitted", "attempt_started"), message("attempt_finished", "request_finished")]
    UsageFanOut(audit, usage).send(batch)
    assert audit.batches == [batch]
    [sent] = usage.batches
    [body] = sent
    assert [e["kind"] for e in json.loads(body)["events"]] == ["request_finished"]


def test_a_batch_without_terminal_events_sends_nothing_to_the_usage_queue() -> None:
    audit, usage = Recorder(), Recorder()
    UsageFanOut(audit, usage).send([message("request_admitted")])
    assert len(audit.batches) == 1
    assert usage.batches == []


def test_a_usage_queue_failure_fails_the_whole_batch_so_it_is_resent() -> None:
    with pytest.raises(SinkUnavailable):
        UsageFanOut(Recorder(), Recorder(fail=True)).send([message("request_finished")])


def test_bodies_that_are_not_envelopes_are_skipped() -> None:
    assert usage_messages([b"not json", b'{"v":1}', message("request_finished")]) == usage_messages(
        [message("request_finished")]
    )
