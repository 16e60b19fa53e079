"""A traced request's trace id travels in its ``request_admitted`` event into the stored record."""

from __future__ import annotations

from tollway.audit import events
from tollway.audit.store.plan import plan_event
from tollway.audit.store.views import request_record

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _admitted(trace_id: str | None) -> events.AuditEvent:
    return events.request_admitted(
        request_id="req_1",
        root_digest="d",
        principal_id="p",
        tenant="t",
        team=None,
        key_id="k",
        alias="a",
        stream=False,
        content_mode="metadata-only",
        max_attempts=2,
        trace_id=trace_id,
    )


def test_a_traced_requests_trace_id_is_stored_and_read_back() -> None:
    event = _admitted(TRACE)
    assert event.body["traceId"] == TRACE
    write = plan_event(event, retention_s=3600)
    assert write is not None
    assert request_record(write.owned | write.shared).trace_id == TRACE


def test_an_untraced_request_has_no_trace_id() -> None:
    event = _admitted(None)
    assert "traceId" not in event.body
    write = plan_event(event, retention_s=3600)
    assert write is not None
    assert request_record(write.owned | write.shared).trace_id is None
