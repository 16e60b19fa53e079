"""The recorder's ``request_rejected``: one metadata-only event per rejected request, and it never raises.

A 4xx must stay a 4xx: a WAL that is full, closed or broken makes the rejection go unrecorded
(counted, on ``/healthz``), never a 5xx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.audit.test_wal_fs import fill_until_full, open_writer
from tollway.audit.events import decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalReader, WalWriter
from tollway.governance.principals import Principal

PRINCIPAL = Principal(
    id="svc-search",
    tenant="acme",
    team="search",
    kind="service",
    roles=frozenset({"caller"}),
    allowed_aliases=frozenset({"chat-fast-v1"}),
    key_id="key-7",
)
DIGEST = "sha256:" + "ef" * 32


def recorder(writer: WalWriter, *, content_mode: Any = "metadata-only", durable: bool = False) -> AuditRecorder:
    return AuditRecorder(writer, durable=durable, terminal_commit=True, commit_timeout_s=1.0, content_mode=content_mode)


def reject(rec: AuditRecorder, **overrides: Any) -> None:
    args: dict[str, Any] = {
        "request_id": "req-rejected-1",
        "principal": PRINCIPAL,
        "alias": "chat-fast-v1",
        "status": 429,
        "code": "rate_limited",
        "stream": True,
        "root_digest": DIGEST,
    }
    rec.request_rejected(**(args | overrides))


@pytest.mark.parametrize("durable", [False, True], ids=["bounded-async", "local-durable"])
def test_a_rejection_is_one_metadata_only_event_in_the_wal(tmp_path: Path, durable: bool) -> None:
    writer = open_writer(tmp_path, durable=durable)
    rec = recorder(writer, durable=durable)

    reject(rec)
    reject(rec, request_id="req-rejected-2", alias=None, status=404, code="model_not_found", stream=None)
    writer.close()

    first, second = (decode_event(r.payload) for r in WalReader(tmp_path).read(0, 10, 1 << 20))
    assert (first.kind, first.request_id, first.attempt, first.root_digest) == (
        "request_rejected",
        "req-rejected-1",
        None,
        DIGEST,
    )
    assert dict(first.body) == {
        "principalId": "svc-search",
        "tenantId": "acme",
        "teamId": "search",
        "keyId": "key-7",
        "alias": "chat-fast-v1",
        "operation": "chat.completions",
        "stream": True,
        "status": 429,
        "outcome": "rejected",
        "errorCode": "rate_limited",
        "attempts": 0,
    }
    assert (second.body["alias"], second.body["status"], second.body["stream"]) == (None, 404, None)
    assert rec.rejected_unrecorded == 0


def test_a_full_wal_leaves_the_rejection_unrecorded_and_counted_never_raised(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    rec = recorder(writer)
    pipeline = AuditPipeline(recorder=rec, writer=writer, shipper=None, directory=tmp_path)
    fill_until_full(writer, payload=b"e" * 100, most=10_000)

    reject(rec)  # raises nothing

    assert rec.rejected_unrecorded == 1
    assert pipeline.stats()["rejected_unrecorded"] == 1
    writer.close()
    reject(rec)  # a closed writer: still nothing raised
    assert rec.rejected_unrecorded == 2


def test_a_broken_writer_leaves_the_rejection_unrecorded_and_counted_never_raised() -> None:
    class Broken:
        def append(self, payload: bytes) -> int:
            raise OSError("the disk went away")

    rec = recorder(Broken())  # type: ignore[arg-type]

    reject(rec)

    assert rec.rejected_unrecorded == 1


def test_content_mode_disabled_records_no_rejection(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    rec = recorder(writer, content_mode="disabled")

    reject(rec)

    assert writer.appended == 0 and rec.rejected_unrecorded == 0
    writer.close()


def test_attempt_events_carry_the_continuation_reason_and_skipped_events() -> None:
    from tollway.audit import events

    started = events.attempt_started(
        request_id="req_1",
        root_digest="d",
        attempt=2,
        route_id="r",
        deployment_id="p",
        provider_format="openai-chat-completions",
        physical_model="m",
        reason="continuation",
    )
    finished = events.attempt_finished(
        request_id="req_1",
        root_digest="d",
        attempt=2,
        route_id="r",
        deployment_id="p",
        outcome="ok",
        error_category=None,
        upstream_status=200,
        first_token_ms=1.0,
        total_ms=2.0,
        skipped_events=1,
    )
    assert decode_event(started.encode()).body["reason"] == "continuation"
    assert decode_event(finished.encode()).body["skippedEvents"] == 1
