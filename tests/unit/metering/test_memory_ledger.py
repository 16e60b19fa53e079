"""Aggregation on the memory ledger: the same layout and counters the DynamoDB ledger writes."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from tests.unit.metering.usage_events import DAY_MS, finished
from tollway.audit import events as ev
from tollway.metering import ApplyResult, MalformedUsageEvent, MemoryUsageLedger, UsageTotals

DAY = "day#2026-11-29"


def totals(ledger: MemoryUsageLedger, pk: str, sk: str = DAY) -> UsageTotals:
    return UsageTotals.from_item(ledger.items[pk, sk])


def test_one_request_is_one_ledger_item_and_one_increment_per_scope() -> None:
    ledger = MemoryUsageLedger()
    event = finished("req-1", usage={"prompt": 100, "completion": 40, "total": 140, "cached": 20, "reasoning": 5})

    assert ledger.apply(event) is ApplyResult.APPLIED

    assert sorted(ledger.items) == sorted(
        [
            ("req#req-1", "usage"),
            ("agg#tenant:acme#total", DAY),
            ("agg#tenant:acme#alias", f"{DAY}#chat"),
            ("agg#tenant:acme#principal", f"{DAY}#svc-a"),
            ("agg#tenant:acme/team:search#total", DAY),
            ("agg#tenant:acme/principal:svc-a#total", DAY),
            ("agg#tenant:acme/principal:svc-a#alias", f"{DAY}#chat"),
        ]
    )
    expected = UsageTotals(
        requests=1,
        prompt_tokens=100,
        completion_tokens=40,
        total_tokens=140,
        cached_tokens=20,
        reasoning_tokens=5,
        cost_micro_usd=1500,
        evidence_provider_reported=1,
        status_2xx=1,
    )
    for pk, sk in ledger.items:
        if pk.startswith("agg#"):
            assert totals(ledger, pk, sk) == expected, pk
    entry = ledger.items["req#req-1", "usage"]
    assert entry["eventId"] == event.event_id
    assert (entry["tenantId"], entry["principalId"], entry["alias"], entry["day"]) == (
        "acme",
        "svc-a",
        "chat",
        "2026-11-29",
    )
    assert (entry["costMicroUsd"], entry["pricingVersion"], entry["usageEvidence"]) == (
        1500,
        "2026-11-01.1",
        "provider-reported",
    )
    assert entry["usage"] == {"prompt": 100, "completion": 40, "total": 140, "cached": 20, "reasoning": 5}
    labels = ledger.items["agg#tenant:acme/principal:svc-a#alias", f"{DAY}#chat"]
    assert (labels["scope"], labels["dim"], labels["day"], labels["value"]) == (
        "tenant:acme/principal:svc-a",
        "alias",
        "2026-11-29",
        "chat",
    )


def test_aggregates_sum_tokens_cost_evidence_and_status_classes() -> None:
    ledger = MemoryUsageLedger()
    for event in (
        finished("r1", usage={"prompt": 10, "completion": 5, "total": 15}, cost=100),
        finished("r2", usage={"prompt": 20, "completion": 0, "total": 20}, cost=None, evidence="local-estimate"),
        finished("r3", usage=None, cost=None, evidence="unknown", status=499),
        finished("r4", usage={"prompt": 1, "completion": 1, "total": 2}, cost=7, status=503),
        finished("r5", usage=None, cost=0, evidence="unknown", status=429),
    ):
        assert ledger.apply(event) is ApplyResult.APPLIED

    tenant = totals(ledger, "agg#tenant:acme#total")

    assert tenant == UsageTotals(
        requests=5,
        prompt_tokens=31,
        completion_tokens=6,
        total_tokens=37,
        cost_micro_usd=107,
        unknown_cost_requests=2,
        evidence_provider_reported=2,
        evidence_local_estimate=1,
        evidence_unknown=2,
        status_2xx=2,
        status_4xx=1,
        status_5xx=1,
        status_499=1,
    )
    assert tenant.evidence == {"provider-reported": 2, "local-estimate": 1, "unknown": 2}
    assert sum(tenant.statuses.values()) == tenant.requests


def test_scopes_split_by_principal_alias_team_and_tenant() -> None:
    ledger = MemoryUsageLedger()
    ledger.apply(finished("r1", principal="svc-a", alias="chat", cost=10))
    ledger.apply(finished("r2", principal="svc-a", alias="embed", cost=20))
    ledger.apply(finished("r3", principal="svc-b", alias="chat", team=None, cost=40))
    ledger.apply(finished("r4", tenant="other", principal="svc-a", alias="chat", cost=80))

    def cost(pk: str, sk: str = DAY) -> int:
        return totals(ledger, pk, sk).cost_micro_usd

    assert cost("agg#tenant:acme#total") == 70
    assert cost("agg#tenant:acme#alias", f"{DAY}#chat") == 50
    assert cost("agg#tenant:acme#alias", f"{DAY}#embed") == 20
    assert cost("agg#tenant:acme#principal", f"{DAY}#svc-a") == 30
    assert cost("agg#tenant:acme#principal", f"{DAY}#svc-b") == 40
    assert cost("agg#tenant:acme/principal:svc-a#total") == 30
    assert cost("agg#tenant:acme/principal:svc-a#alias", f"{DAY}#chat") == 10
    assert cost("agg#tenant:acme/team:search#total") == 30  # r3 has no team
    assert cost("agg#tenant:other/principal:svc-a#total") == 80  # the same principal id in another tenant


def test_the_day_is_the_utc_day_of_the_event() -> None:
    ledger = MemoryUsageLedger()
    last_ms = int(datetime(2026, 11, 29, 23, 59, 59, 999_000, tzinfo=UTC).timestamp() * 1000)

    ledger.apply(finished("late", ts_ms=last_ms))
    ledger.apply(finished("next", ts_ms=last_ms + 1))

    assert totals(ledger, "agg#tenant:acme#total", "day#2026-11-29").requests == 1
    assert totals(ledger, "agg#tenant:acme#total", "day#2026-11-30").requests == 1


def test_ids_with_separators_cannot_forge_another_scope() -> None:
    ledger = MemoryUsageLedger()

    ledger.apply(finished("r1", tenant="acme/principal:svc-a", principal="x#y", alias="a b"))

    pks = {pk for pk, _ in ledger.items}
    assert "agg#tenant:acme/principal:svc-a#total" not in pks
    assert "agg#tenant:acme%2Fprincipal%3Asvc-a/principal:x%23y#total" in pks
    assert ("agg#tenant:acme%2Fprincipal%3Asvc-a#alias", f"{DAY}#a%20b") in ledger.items


def test_a_redelivered_request_is_a_duplicate_and_changes_nothing() -> None:
    ledger = MemoryUsageLedger()
    event = finished("req-1")
    ledger.apply(event)
    before = copy.deepcopy(ledger.items)

    assert ledger.apply(event) is ApplyResult.DUPLICATE
    # Another request_finished for the same logical request (a resend with a new eventId) counts once too.
    assert ledger.apply(finished("req-1", cost=999_999)) is ApplyResult.DUPLICATE

    assert ledger.items == before


def test_other_kinds_are_skipped_and_write_nothing() -> None:
    ledger = MemoryUsageLedger()
    started = ev.attempt_started(
        request_id="req-1",
        root_digest="d",
        attempt=1,
        route_id="r",
        deployment_id="dep",
        provider_format="openai",
        physical_model="m",
        reason="first",
    )

    assert ledger.apply(started) is ApplyResult.SKIPPED
    assert ledger.items == {}


def test_a_malformed_event_writes_nothing() -> None:
    ledger = MemoryUsageLedger()

    with pytest.raises(MalformedUsageEvent):
        ledger.apply(finished("req-1", omit=("tenantId",)))

    assert ledger.items == {}


def test_ledger_items_expire_after_the_retention_and_aggregates_are_kept_by_default() -> None:
    kept = MemoryUsageLedger()
    kept.apply(finished("r1"))
    assert kept.items["req#r1", "usage"]["expiresAt"] == DAY_MS // 1000 + 400 * 86_400
    assert "expiresAt" not in kept.items["agg#tenant:acme#total", DAY]

    short = MemoryUsageLedger(retention_days=30, aggregate_retention_days=1000)
    short.apply(finished("r1"))
    end_of_day = int(datetime(2026, 11, 30, tzinfo=UTC).timestamp())
    assert short.items["req#r1", "usage"]["expiresAt"] == DAY_MS // 1000 + 30 * 86_400
    assert short.items["agg#tenant:acme#total", DAY]["expiresAt"] == end_of_day + 1000 * 86_400
