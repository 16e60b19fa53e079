"""The audit store's contract on the in-memory fake: item layout, idempotency, convergence, incompleteness.

The fake shares the planning (event → item update) and the views with the DynamoDB store; the
integration tier runs the same behaviours against DynamoDB on moto server.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest

from tests.support.audit_events import DIGEST, admitted, attempt_done, finished, rejected, started
from tollway.audit.events import AuditEvent
from tollway.audit.store import (
    DEFAULT_RETENTION_DAYS,
    AuditStore,
    AuditStoreError,
    MalformedEvent,
    MemoryAuditStore,
    StoreSettings,
    iso_ts,
)

T0 = 1_764_400_000_000
"""2025-11-29T07:06:40Z, in epoch milliseconds."""


def retried_request(rid: str) -> list[AuditEvent]:
    """A request whose first attempt failed and whose second (a fallback) succeeded."""
    return [
        admitted(rid, T0),
        started(rid, 1, T0 + 1),
        attempt_done(rid, 1, T0 + 20, outcome="error", status=503),
        started(rid, 2, T0 + 21, reason="fallback"),
        attempt_done(rid, 2, T0 + 60),
        finished(rid, T0 + 61, attempts=2),
    ]


def test_a_request_is_one_request_item_and_one_item_per_attempt() -> None:
    store = MemoryAuditStore()
    events = retried_request("r-1")

    result = store.apply(events)

    assert (result.applied, result.duplicates, result.unknown) == (6, 0, 0)
    assert sorted(store.items) == [("REQ#r-1", "ATTEMPT#0001"), ("REQ#r-1", "ATTEMPT#0002"), ("REQ#r-1", "REQUEST")]
    request = store.items[("REQ#r-1", "REQUEST")]
    assert request["eventIds"] == {events[0].event_id, events[5].event_id}
    assert request["principalId"] == "p-1" and request["ts"] == "2025-11-29T07:06:40.000Z"
    assert request["expiresAt"] == T0 // 1000 + DEFAULT_RETENTION_DAYS * 86_400
    assert store.items[("REQ#r-1", "ATTEMPT#0002")]["eventIds"] == {events[3].event_id, events[4].event_id}

    view = store.get_request("r-1")
    assert view is not None and not view.incomplete
    r = view.request
    assert (r.request_id, r.admitted_at_ms, r.finished_at_ms) == ("r-1", T0, T0 + 61)
    assert (r.principal_id, r.tenant_id, r.team_id, r.key_id, r.alias) == ("p-1", "t-1", "core", "k-1", "chat")
    assert (r.stream, r.content_mode, r.max_attempts, r.root_digest) == (True, "metadata-only", 3, DIGEST)
    assert (r.status, r.outcome, r.attempt_count, r.admission_ms, r.total_ms) == (200, "ok", 2, 0.5, 99.75)
    assert r.usage == {"promptTokens": 11, "completionTokens": 7, "totalTokens": 18}
    assert r.usage_evidence == "provider-reported"
    assert [a.number for a in view.attempts] == [1, 2]
    first, second = view.attempts
    assert (first.outcome, first.upstream_status, first.error_category, first.reason) == (
        "error",
        503,
        "overloaded",
        "first",
    )
    assert (second.outcome, second.reason, second.route_id, second.deployment_id) == (
        "ok",
        "fallback",
        "route-2",
        "dep-2",
    )
    assert (second.started_at_ms, second.finished_at_ms, second.first_token_ms, second.total_ms) == (
        T0 + 21,
        T0 + 60,
        12.5,
        40.25,
    )
    assert second.expires_at == (T0 + 21) // 1000 + DEFAULT_RETENTION_DAYS * 86_400
    assert store.get_request("r-other") is None


def test_applying_the_same_batch_twice_leaves_the_same_items() -> None:
    store = MemoryAuditStore()
    events = retried_request("r-dup")
    store.apply(events)
    before = copy.deepcopy(store.items)

    again = store.apply(events)
    partial = store.apply(events[2:4])

    assert (again.applied, again.duplicates) == (0, 6)
    assert (partial.applied, partial.duplicates) == (0, 2)
    assert store.items == before


def test_a_duplicate_inside_one_batch_is_applied_once() -> None:
    store = MemoryAuditStore()
    event = admitted("r-twice", T0)

    result = store.apply([event, event])

    assert (result.applied, result.duplicates) == (1, 1)
    assert store.items[("REQ#r-twice", "REQUEST")]["eventIds"] == {event.event_id}


def test_every_delivery_order_converges_to_the_same_items() -> None:
    rid = "r-order"
    events = [admitted(rid, T0), started(rid, 1, T0 + 1), attempt_done(rid, 1, T0 + 30), finished(rid, T0 + 31)]
    in_order = MemoryAuditStore()
    in_order.apply(events)

    for order in itertools.permutations(events):
        one_batch, one_by_one = MemoryAuditStore(), MemoryAuditStore()
        one_batch.apply(order)
        for event in order:
            one_by_one.apply([event])
        assert one_batch.items == in_order.items, [e.kind for e in order]
        assert one_by_one.items == in_order.items, [e.kind for e in order]


def test_the_start_event_owns_the_fields_both_events_carry() -> None:
    """Were a terminal event to disagree with its start, the start would win, whatever the order."""
    rid = "r-own"
    start = started(rid, 1, T0)
    done = dataclasses.replace(
        attempt_done(rid, 1, T0 + 500_000_000),  # expires later: still the start's TTL
        root_digest="sha256:other",
        body={**attempt_done(rid, 1, 0).body, "routeId": "route-other"},
    )
    for order in ([start, done], [done, start]):
        store = MemoryAuditStore()
        for event in order:
            store.apply([event])
        item = store.items[("REQ#r-own", "ATTEMPT#0001")]
        assert (item["routeId"], item["rootDigest"]) == ("route-1", DIGEST)
        assert item["expiresAt"] == T0 // 1000 + DEFAULT_RETENTION_DAYS * 86_400


def test_a_started_attempt_without_its_finish_is_incomplete() -> None:
    store = MemoryAuditStore()
    rid = "r-crash"
    store.apply([admitted(rid, T0), started(rid, 1, T0 + 1), attempt_done(rid, 1, T0 + 5, "error", 500)])
    store.apply([started(rid, 2, T0 + 6, reason="retry")])

    view = store.get_request(rid)

    assert view is not None and view.incomplete
    assert view.request.incomplete and view.request.finished_at_ms is None
    assert [(a.number, a.incomplete) for a in view.attempts] == [(1, False), (2, True)]
    assert view.attempts[1].started_at_ms == T0 + 6 and view.attempts[1].outcome is None


def test_a_finish_that_arrives_before_its_start_is_kept_until_the_start_completes_it() -> None:
    store = MemoryAuditStore()
    rid = "r-late-start"
    store.apply([attempt_done(rid, 1, T0 + 9), finished(rid, T0 + 10)])

    early = store.get_request(rid)
    assert early is not None
    assert early.request.admitted_at_ms is None and early.request.principal_id is None
    (attempt,) = early.attempts
    assert attempt.started_at_ms is None and not attempt.incomplete and attempt.reason is None
    assert store.list_requests(0) == []  # not admitted yet: not in the time index

    store.apply([admitted(rid, T0), started(rid, 1, T0 + 1)])
    late = store.get_request(rid)
    assert late is not None and not late.incomplete
    assert late.attempts[0].reason == "first" and late.request.principal_id == "p-1"


def test_unknown_kinds_are_skipped_and_counted() -> None:
    store = MemoryAuditStore()
    unknown = dataclasses.replace(admitted("r-new-kind", T0), kind="request_rerouted")

    result = store.apply([unknown, admitted("r-known", T0)])

    assert (result.applied, result.unknown) == (1, 1)
    assert list(store.items) == [("REQ#r-known", "REQUEST")]


def test_only_the_known_metadata_fields_reach_an_item() -> None:
    canary = "CANARY-prompt-text-never-stored"
    store = MemoryAuditStore()
    event = admitted("r-extra", T0)
    event = dataclasses.replace(event, body={**event.body, "prompt": canary, "pk": "REQ#hijack", "eventIds": [1]})

    store.apply([event])

    (item,) = store.items.values()
    assert (item["pk"], item["eventIds"]) == ("REQ#r-extra", {event.event_id})
    assert "prompt" not in item and canary not in repr(item)


def _malformed_cases() -> dict[str, AuditEvent]:
    a = admitted("r-bad", T0)
    s = started("r-bad", 1, T0)
    f = finished("r-bad", T0)
    d = attempt_done("r-bad", 1, T0)
    return {
        "attempt-missing": dataclasses.replace(s, attempt=None),
        "attempt-zero": dataclasses.replace(d, attempt=0),
        "attempt-too-big": dataclasses.replace(s, attempt=10_000),
        "principal-missing": dataclasses.replace(a, body={k: v for k, v in a.body.items() if k != "principalId"}),
        "principal-empty": dataclasses.replace(a, body={**a.body, "principalId": ""}),
        "principal-not-string": dataclasses.replace(a, body={**a.body, "principalId": 7}),
        "principal-too-long": dataclasses.replace(a, body={**a.body, "principalId": "CANARY" * 50}),
        "stream-not-bool": dataclasses.replace(a, body={**a.body, "stream": "CANARY"}),
        "status-is-bool": dataclasses.replace(f, body={**f.body, "status": True}),
        "total-not-number": dataclasses.replace(d, body={**d.body, "totalMs": "CANARY"}),
        "usage-not-counts": dataclasses.replace(f, body={**f.body, "usage": {"prompt_tokens": "CANARY"}}),
        "request-id-empty": dataclasses.replace(a, request_id=""),
        "ts-negative": dataclasses.replace(a, ts_ms=-1),
    }


@pytest.mark.parametrize("case", sorted(_malformed_cases()))
def test_a_malformed_event_fails_its_batch_before_anything_is_written(case: str) -> None:
    store = MemoryAuditStore()
    good = admitted("r-good", T0)

    with pytest.raises(MalformedEvent) as raised:
        store.apply([good, _malformed_cases()[case]])

    assert store.items == {}
    assert "CANARY" not in str(raised.value)
    assert store.apply([good]).applied == 1  # the next message is unaffected


def test_list_is_newest_first_since_a_time_by_principal_and_bounded() -> None:
    store: AuditStore = MemoryAuditStore()
    for i in range(5):
        store.apply([admitted(f"r-{i}", ts=T0 + i * 60_000, principal_id="p-a" if i % 2 == 0 else "p-b")])
    store.apply([finished("r-unadmitted", T0 + 999_999)])

    assert [r.request_id for r in store.list_requests(T0 + 60_000)] == ["r-4", "r-3", "r-2", "r-1"]
    assert [r.request_id for r in store.list_requests(T0, principal_id="p-a")] == ["r-4", "r-2", "r-0"]
    assert [r.request_id for r in store.list_requests(T0, limit=2)] == ["r-4", "r-3"]
    assert store.list_requests(T0 + 10 * 60_000) == []
    (r,) = store.list_requests(T0 + 4 * 60_000)
    assert r.incomplete and r.admitted_at_ms == T0 + 4 * 60_000
    with pytest.raises(ValueError, match="limit"):
        store.list_requests(T0, limit=0)


def test_retention_comes_from_the_environment() -> None:
    settings = StoreSettings.from_env({"TOLLWAY_TABLE_AUDIT": "s-audit", "TOLLWAY_AUDIT_RETENTION_DAYS": "7"})
    assert (settings.table, settings.retention_days, settings.endpoint) == ("s-audit", 7, None)
    store = MemoryAuditStore(retention_days=settings.retention_days)
    store.apply([admitted("r-ttl", T0)])
    assert store.items[("REQ#r-ttl", "REQUEST")]["expiresAt"] == T0 // 1000 + 7 * 86_400

    local = StoreSettings.from_env({"TOLLWAY_TABLE_AUDIT": "t", "AWS_ENDPOINT_URL": "http://127.0.0.1:4566"})
    assert (local.retention_days, local.endpoint) == (DEFAULT_RETENTION_DAYS, "http://127.0.0.1:4566")
    with pytest.raises(AuditStoreError, match="TOLLWAY_TABLE_AUDIT"):
        StoreSettings.from_env({})
    with pytest.raises(AuditStoreError, match="TOLLWAY_AUDIT_RETENTION_DAYS"):
        StoreSettings.from_env({"TOLLWAY_TABLE_AUDIT": "t", "TOLLWAY_AUDIT_RETENTION_DAYS": "ninety"})


def test_index_timestamps_are_fixed_width_so_string_order_is_time_order() -> None:
    samples = [0, 999, 1_000, 59_999, T0, T0 + 1, 4_102_444_800_000]
    rendered = [iso_ts(ms) for ms in samples]
    assert rendered[0] == "1970-01-01T00:00:00.000Z" and rendered[4] == "2025-11-29T07:06:40.000Z"
    assert len({len(s) for s in rendered}) == 1
    assert sorted(rendered) == rendered


def test_a_rejected_request_is_a_complete_request_without_attempts() -> None:
    store = MemoryAuditStore()
    event = rejected("r-429", T0 + 5)

    assert store.apply([event]).applied == 1
    assert store.apply([event]).duplicates == 1

    (item,) = store.items.values()
    assert (item["rejectedAt"], item["ts"], item["principalId"]) == (T0 + 5, iso_ts(T0 + 5), "p-1")
    assert "admittedAt" not in item and "finishedAt" not in item
    view = store.get_request("r-429")
    assert view is not None and view.attempts == () and not view.incomplete
    r = view.request
    assert (r.rejected, r.rejected_at_ms, r.at_ms, r.status, r.error_code) == (
        True,
        T0 + 5,
        T0 + 5,
        429,
        "rate_limited",
    )
    assert (r.outcome, r.attempt_count, r.alias, r.stream, r.key_id) == ("rejected", 0, "chat", None, "k-1")
    assert [x.request_id for x in store.list_requests(T0, principal_id="p-1")] == ["r-429"]


def test_a_rejected_request_lists_among_admitted_ones_by_time() -> None:
    store = MemoryAuditStore()
    store.apply([admitted("r-ok", ts=T0), rejected("r-404", T0 + 1000, alias=None, status=404)])

    listed = store.list_requests(T0)

    assert [(r.request_id, r.rejected, r.alias) for r in listed] == [("r-404", True, None), ("r-ok", False, "chat")]


def test_a_rejection_never_overrides_the_admitted_lifecycle_of_the_same_id() -> None:
    """Should one request id ever carry both, what admission and the finish recorded wins, in any order."""
    rid = "r-both"
    events = [admitted(rid, T0), rejected(rid, T0 + 500, status=400), finished(rid, T0 + 9)]
    for order in itertools.permutations(events):
        store = MemoryAuditStore()
        for event in order:
            store.apply([event])
        item = store.items[("REQ#r-both", "REQUEST")]
        assert (item["status"], item["outcome"], item["ts"]) == (200, "ok", iso_ts(T0)), [e.kind for e in order]
