"""Typed retry classification and deadline-bounded backoff."""

from __future__ import annotations

import random

import pytest

from tollway.exceptions import UpstreamCategory as C
from tollway.exceptions import UpstreamError
from tollway.routing.retry import HEALTH_NEUTRAL, NEVER_RETRY, RETRYABLE, RetryRules, affects_health

RULES = RetryRules(max_attempts=3, base_backoff_s=0.1, max_backoff_s=2.0, max_retry_after_s=30.0)


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
        (UpstreamError(C.AUTHENTICATION, status=401), False),
        (UpstreamError(C.PERMISSION, status=403), False),
        (UpstreamError(C.INVALID_REQUEST, status=400), False),
        (UpstreamError(C.CONTEXT_LENGTH, status=400), False),
        (UpstreamError(C.SAFETY, status=400), False),
    ],
)
def test_retry_classification(error: UpstreamError, retry: bool) -> None:
    assert RULES.retryable(error) is retry


def test_every_category_is_classified_once() -> None:
    assert RETRYABLE.isdisjoint(NEVER_RETRY)
    assert RETRYABLE | NEVER_RETRY == set(C)


def test_an_operator_can_take_429_out_of_the_retry_list() -> None:
    rules = RetryRules(retry_statuses=frozenset({503}))
    assert not rules.retryable(UpstreamError(C.RATE_LIMIT, status=429))


def test_health_neutral_errors() -> None:
    assert not affects_health(UpstreamError(C.RATE_LIMIT, status=429))
    assert not affects_health(UpstreamError(C.CONTEXT_LENGTH))
    assert affects_health(UpstreamError(C.SERVER, status=500))
    assert C.SAFETY in HEALTH_NEUTRAL


def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    rng = random.Random(4)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (10, 2.0), (1000, 2.0)]:
        delays = [RULES.backoff(n, None, rng) for _ in range(500)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > 0.8 * ceiling, "jitter spans the range"


def test_retry_after_is_honoured_and_capped() -> None:
    rng = random.Random(0)
    assert RULES.backoff(1, 5.0, rng) == 5.0
    assert RULES.backoff(1, 600.0, rng) == 30.0


def test_backoff_is_bounded_by_the_deadline() -> None:
    rng = random.Random(0)
    assert RULES.delay_within(1, 5.0, rng, now=100.0, deadline=104.0) is None
    assert RULES.delay_within(1, 5.0, rng, now=100.0, deadline=106.0) == 5.0


def test_attempts_are_bounded_by_count_and_deadline() -> None:
    assert RULES.may_attempt(2, now=1.0, deadline=2.0)
    assert not RULES.may_attempt(3, now=1.0, deadline=2.0)
    assert not RULES.may_attempt(0, now=2.0, deadline=2.0)
