"""Windows, counter keys and lease sizing: pure functions of a clock and a limit."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from tollway.governance.leases import LeasePolicy, Limit, Window, cost_budget, requests_per_minute, window_of


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("window", "now", "window_id", "end"),
    [
        (Window.MINUTE, ts(2026, 11, 29, 18, 56, 59), "2026-11-29T18:56", ts(2026, 11, 29, 18, 57)),
        (Window.MINUTE, ts(2026, 11, 29, 23, 59, 30), "2026-11-29T23:59", ts(2026, 11, 30)),
        (Window.DAY, ts(2026, 11, 29, 23, 59, 59), "2026-11-29", ts(2026, 11, 30)),
        (Window.MONTH, ts(2026, 11, 29, 12), "2026-11", ts(2026, 12, 1)),
        (Window.MONTH, ts(2026, 12, 31, 23, 59, 59), "2026-12", ts(2027, 1, 1)),
        (Window.LIFETIME, ts(2026, 11, 29), "all", math.inf),
    ],
)
def test_window_ids_are_utc_calendar_windows(window: Window, now: float, window_id: str, end: float) -> None:
    assert window_of(window, now) == (window_id, end)


def test_the_next_window_starts_exactly_where_the_last_one_ends() -> None:
    for window in (Window.MINUTE, Window.DAY, Window.MONTH):
        first, end = window_of(window, ts(2026, 11, 30, 23, 59, 59))
        second, _ = window_of(window, end)
        assert first != second
        assert window_of(window, end - 0.001)[0] == first


def test_counter_keys_encode_scope_metric_and_window() -> None:
    budget = cost_budget("tenant:acme", Window.DAY, 100_000_000)
    assert budget.key("2026-11-29") == "budget#tenant:acme#cost#day#2026-11-29"
    assert requests_per_minute("key:k-1", 60).counter == "budget#key:k-1#requests#minute"


@pytest.mark.parametrize(
    ("scope", "metric", "limit"), [("", "cost", 1), ("a#b", "cost", 1), ("t", "", 1), ("t", "c", -1)]
)
def test_a_limit_that_could_not_be_keyed_is_refused(scope: str, metric: str, limit: int) -> None:
    with pytest.raises(ValueError):
        Limit(scope, metric, Window.DAY, limit)


def test_lease_size_is_a_bounded_fraction_of_the_limit() -> None:
    policy = LeasePolicy(fraction=0.1, min_units=5, max_units=1_000)
    assert policy.lease_size(10_000) == 1_000  # 10% capped
    assert policy.lease_size(2_000) == 200
    assert policy.lease_size(20) == 5  # at least min_units
    assert policy.lease_size(3) == 3  # never above the limit
    assert policy.lease_size(0) == 0
