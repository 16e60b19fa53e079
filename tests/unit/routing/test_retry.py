"""The one retry policy: typed classification, in-place retries, capped Retry-After, backoff."""

from __future__ import annotations

import random

import pytest

from tollway.exceptions import UpstreamCategory as C
from tollway.exceptions import UpstreamError
from tollway.routing import plan
from tollway.routing.retry import (
    HEALTH_NEUTRAL,
    MAX_DEFER_S,
    NEVER_RETRY,
    RETRYABLE,
    SAME_ROUTE_FIRST,
    RetryPolicy,
    affects_health,
)

POLICY = RetryPolicy(max_attempts=3, base_backoff_s=0.1, max_backoff_s=2.0, max_retry_after_s=5.0)


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (UpstreamError(C.CONNECT), True),
        (UpstreamError(C.TIMEOUT), True),
        (UpstreamError(C.TIMEOUT, status=408), True),
        (UpstreamError(C.RATE_LIMIT, status=429), True),
        (UpstreamError(C.SERVER, status=500), True),
        (UpstreamError(C.SERVER, status=501), False),
        (UpstreamError(C.OVERLOADED, status=529), True),
        (UpstreamError(C.MALFORMED, status=200), True),
        (UpstreamError(C.TRUNCATED), True),
        (UpstreamError(C.AUTHENTICATION, status=401), False),
        (UpstreamError(C.PERMISSION, status=403), False),
        (UpstreamError(C.INVALID_REQUEST, status=400), False),
        (UpstreamError(C.CONTEXT_LENGTH, status=400), False),
        (UpstreamError(C.SAFETY, status=400), False),
    ],
)
def test_retry_classification(error: UpstreamError, retry: bool) -> None:
    assert POLICY.retryable(error) is retry


def test_every_category_is_classified_once() -> None:
    assert RETRYABLE.isdisjoint(NEVER_RETRY)
    assert RETRYABLE | NEVER_RETRY == set(C)
    assert SAME_ROUTE_FIRST <= RETRYABLE


def test_there_is_one_retry_policy() -> None:
    assert plan.RetryPolicy is RetryPolicy
    assert not hasattr(__import__("tollway.routing.retry", fromlist=["x"]), "RetryRules")


def test_an_operator_can_take_429_out_of_the_retry_list() -> None:
    policy = RetryPolicy(retry_statuses=frozenset({503}))
    assert not policy.retryable(UpstreamError(C.RATE_LIMIT, status=429))


def test_health_neutral_errors() -> None:
    assert not affects_health(UpstreamError(C.RATE_LIMIT, status=429))
    assert not affects_health(UpstreamError(C.CONTEXT_LENGTH))
    assert affects_health(UpstreamError(C.SERVER, status=500))
    assert affects_health(UpstreamError(C.TRUNCATED))
    assert C.SAFETY in HEALTH_NEUTRAL


@pytest.mark.parametrize(
    ("category", "first"),
    [
        (C.RATE_LIMIT, True),
        (C.SERVER, True),
        (C.OVERLOADED, True),
        (C.CONNECT, True),
        (C.TIMEOUT, False),
        (C.MALFORMED, False),
        (C.TRUNCATED, False),
    ],
)
def test_which_failures_retry_in_place_before_a_fallback(category: C, first: bool) -> None:
    assert POLICY.retries_in_place_first(UpstreamError(category)) is first


def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    rng = random.Random(4)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (10, 2.0), (1000, 2.0)]:
        delays = [POLICY.backoff(n, None, rng) for _ in range(500)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > 0.8 * ceiling, "jitter spans the range"


def test_a_short_retry_after_is_waited_for_and_a_long_one_defers_the_deployment() -> None:
    rng = random.Random(0)
    assert POLICY.backoff(1, 4.0, rng) == 4.0
    assert POLICY.backoff(1, 600.0, rng) == 5.0, "never waits past the cap"
    assert POLICY.defer_s(UpstreamError(C.RATE_LIMIT, status=429, retry_after=4.0)) is None
    assert POLICY.defer_s(UpstreamError(C.RATE_LIMIT, status=429)) is None
    assert POLICY.defer_s(UpstreamError(C.RATE_LIMIT, status=429, retry_after=30.0)) == 30.0
    assert POLICY.defer_s(UpstreamError(C.OVERLOADED, status=503, retry_after=1e9)) == MAX_DEFER_S


def test_the_defaults_match_the_configuration_defaults() -> None:
    default = RetryPolicy()
    assert (default.max_retry_after_s, default.same_route_retries, default.max_attempts) == (5.0, 1, 3)
