"""``GET /v1/usage``: scopes, grouping, the date range, parameter parsing and the response body."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from tests.unit.metering.usage_events import finished
from tollway.governance.principals import Principal
from tollway.metering import (
    InvalidUsageQuery,
    MemoryUsageLedger,
    UsageQuery,
    UsageScope,
    UsageTotals,
    caller_scope,
    parse_usage_query,
    usage_response,
)
from tollway.metering.query import UsageRow

D1, D2, D3 = date(2026, 11, 28), date(2026, 11, 29), date(2026, 11, 30)
ACME = UsageScope("acme")
ALICE = UsageScope("acme", "alice")
BOB = UsageScope("acme", "bob")


def at(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, 9, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
def ledger() -> MemoryUsageLedger:
    """alice: chat on D1 and D2, embed on D2; bob: chat on D2 and D3; another tenant's alice on D2."""
    ledger = MemoryUsageLedger()
    for rid, principal, alias, day, cost in (
        ("a1", "alice", "chat", D1, 100),
        ("a2", "alice", "chat", D2, 200),
        ("a3", "alice", "embed", D2, 5),
        ("b1", "bob", "chat", D2, 1000),
        ("b2", "bob", "chat", D3, 3000),
    ):
        ledger.apply(finished(rid, principal=principal, alias=alias, ts_ms=at(day), cost=cost))
    ledger.apply(finished("x1", tenant="globex", principal="alice", alias="chat", ts_ms=at(D2), cost=77))
    return ledger


def table(
    ledger: MemoryUsageLedger, scope: UsageScope, group_by: str, lo: date = D1, hi: date = D3
) -> dict[str, tuple[int, int]]:
    rows = ledger.query(UsageQuery(scope, lo, hi, group_by))  # type: ignore[arg-type]
    return {r.key: (r.totals.requests, r.totals.cost_micro_usd) for r in rows}


def test_a_tenant_grouped_by_day_alias_and_principal(ledger: MemoryUsageLedger) -> None:
    assert table(ledger, ACME, "day") == {
        "2026-11-28": (1, 100),
        "2026-11-29": (3, 1205),
        "2026-11-30": (1, 3000),
    }
    assert table(ledger, ACME, "alias") == {"chat": (4, 4300), "embed": (1, 5)}
    assert table(ledger, ACME, "principal") == {"alice": (3, 305), "bob": (2, 4000)}


def test_a_principal_sees_only_its_own_usage(ledger: MemoryUsageLedger) -> None:
    assert table(ledger, ALICE, "day") == {"2026-11-28": (1, 100), "2026-11-29": (2, 205)}
    assert table(ledger, ALICE, "alias") == {"chat": (2, 300), "embed": (1, 5)}
    assert table(ledger, ALICE, "principal") == {"alice": (3, 305)}
    assert table(ledger, BOB, "principal") == {"bob": (2, 4000)}
    assert table(ledger, UsageScope("acme", "carol"), "day") == {}


def test_the_same_principal_id_in_another_tenant_is_another_scope(ledger: MemoryUsageLedger) -> None:
    assert table(ledger, UsageScope("globex", "alice"), "alias") == {"chat": (1, 77)}
    assert table(ledger, UsageScope("globex"), "principal") == {"alice": (1, 77)}


def test_the_range_is_inclusive_and_limits_every_grouping(ledger: MemoryUsageLedger) -> None:
    assert table(ledger, ACME, "day", D2, D2) == {"2026-11-29": (3, 1205)}
    assert table(ledger, ACME, "alias", D2, D3) == {"chat": (3, 4200), "embed": (1, 5)}
    assert table(ledger, ACME, "principal", D3, D3) == {"bob": (1, 3000)}
    assert table(ledger, ACME, "day", D3 + timedelta(days=1), D3 + timedelta(days=5)) == {}


def principal(*roles: str) -> Principal:
    return Principal("alice", "acme", "search", "service", frozenset(roles), frozenset({"chat"}), "key-1")


def test_an_admin_sees_its_tenant_and_anyone_else_itself() -> None:
    assert caller_scope(principal("admin")) == UsageScope("acme")
    assert caller_scope(principal()) == UsageScope("acme", "alice")
    assert caller_scope(principal("reader")) == UsageScope("acme", "alice")


def test_query_parameters_default_to_thirty_days_up_to_today_by_day() -> None:
    query = parse_usage_query({}, scope=ALICE, today=D3)

    assert query == UsageQuery(ALICE, D3 - timedelta(days=29), D3, "day")
    assert parse_usage_query({"from": "2026-11-01", "to": "2026-11-29", "group_by": "alias"}, scope=ACME, today=D3) == (
        UsageQuery(ACME, date(2026, 11, 1), D2, "alias")
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "29/11/2026"}, "'from' must be a date as YYYY-MM-DD"),
        ({"to": "20261129"}, "'to' must be a date as YYYY-MM-DD"),
        ({"from": "2026-02-30"}, "'from' is not a calendar date"),
        ({"from": "2026-11-30", "to": "2026-11-29"}, "'from' is after 'to'"),
        ({"from": "2024-01-01", "to": "2026-11-29"}, "at most 366 days"),
        ({"group_by": "model"}, "group_by must be one of day, alias, principal"),
        ({"tenant": "globex"}, "unknown query parameter(s): 'tenant'"),
    ],
)
def test_bad_query_parameters_are_rejected(params: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidUsageQuery, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_usage_query(params, scope=ALICE, today=D3)


def test_the_response_is_an_openai_style_list_of_buckets(ledger: MemoryUsageLedger) -> None:
    query = UsageQuery(ALICE, D1, D3, "alias")

    body = usage_response(query, ledger.query(query))

    assert {k: body[k] for k in ("object", "from", "to", "group_by", "scope")} == {
        "object": "list",
        "from": "2026-11-28",
        "to": "2026-11-30",
        "group_by": "alias",
        "scope": {"tenant": "acme", "principal": "alice"},
    }
    assert [b["alias"] for b in body["data"]] == ["chat", "embed"]
    assert body["data"][0] == {
        "object": "usage.bucket",
        "alias": "chat",
        "requests": 2,
        "prompt_tokens": 200,
        "completion_tokens": 80,
        "total_tokens": 280,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "cost_usd": "0.000300",
        "cost_micro_usd": 300,
        "unknown_cost_requests": 0,
        "usage_evidence": {"provider-reported": 2, "local-estimate": 0, "unknown": 0},
        "status": {"2xx": 2, "4xx": 0, "5xx": 0, "499": 0, "other": 0},
    }


def test_a_bucket_is_keyed_by_its_grouping() -> None:
    rows = [UsageRow("2026-11-29", UsageTotals(requests=1))]

    body = usage_response(UsageQuery(ACME, D2, D2, "day"), rows)

    assert body["data"][0]["day"] == "2026-11-29" and "alias" not in body["data"][0]
    assert usage_response(UsageQuery(ACME, D2, D2, "principal"), [])["data"] == []
