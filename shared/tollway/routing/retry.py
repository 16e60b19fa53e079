"""The one retry policy: which failed attempts may be tried again, where, and after how long.

The decision reads the attempt's ``UpstreamCategory`` and HTTP status, never an error string.
A retryable category is retried when the attempt has no error status (a connect failure, a
local timeout, a malformed 200) or its status is in ``retry_statuses`` (default 408, 429, 500,
502, 503, 504, 529), so an operator can take 429 or a 5xx out of the list:

============================  ==========  ==========  ============================================
Category                      Retry       Same route  Health
============================  ==========  ==========  ============================================
``rate_limit`` (429)          yes         first       neutral: a quota says nothing of the endpoint
``server``, ``overloaded``    yes         first       counts
``connect``                   yes         first       counts (a reset or refused connection)
``timeout`` (incl. 408)       yes         last        counts
``malformed``, ``truncated``  yes         last        counts (a broken body or stream before output)
``authentication``            never                   counts (a broken credential is the deployment's)
``permission``, ``not_found`` never                   counts
``invalid_request``           never                   neutral: the request's fault, not the deployment's
``context_length``            never       never       neutral; may move to a route with a larger window
``safety``                    never                   neutral
============================  ==========  ==========  ============================================

*Same route*: "first" means a failed route is retried in place (up to ``same_route_retries``
times) before the request moves to a lower-priority route, unless a same-priority alternative is
available; "last" means it is retried in place only when nothing else can answer, because a
provider that went silent or sent garbage is better left for another one. A retry in place never
spends the attempt a remaining fallback would need.

Backoff is exponential with full jitter, ``uniform(0, min(max_backoff, base * 2**(n-1)))``, and
never shorter than the provider's ``Retry-After``. A ``Retry-After`` above ``max_retry_after_s``
is never waited for: the deployment is skipped for that long instead (``defer_s``). A delay that
would end at or past the request deadline means *do not retry this target*; another target needs
no wait. Nothing is retried once a semantic stream event has reached the client; that rule lives
in the attempt loop, which only consults this policy before commitment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tollway.exceptions import UpstreamCategory, UpstreamError

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "HEALTH_NEUTRAL",
    "MAX_DEFER_S",
    "NEVER_RETRY",
    "RETRYABLE",
    "SAME_ROUTE_FIRST",
    "RetryPolicy",
    "affects_health",
]

DEFAULT_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})

RETRYABLE = frozenset(
    {
        UpstreamCategory.RATE_LIMIT,
        UpstreamCategory.SERVER,
        UpstreamCategory.OVERLOADED,
        UpstreamCategory.TIMEOUT,
        UpstreamCategory.CONNECT,
        UpstreamCategory.MALFORMED,
        UpstreamCategory.TRUNCATED,
    }
)
"""Categories another attempt may follow; :meth:`RetryPolicy.retryable` adds the status list. The
only definition of "retryable": an ``UpstreamError`` carries its category, not a verdict."""

NEVER_RETRY = frozenset(set(UpstreamCategory) - RETRYABLE)

SAME_ROUTE_FIRST = frozenset(
    {UpstreamCategory.RATE_LIMIT, UpstreamCategory.SERVER, UpstreamCategory.OVERLOADED, UpstreamCategory.CONNECT}
)
"""Failures a second try on the same deployment usually cures: a short rate limit, one transient
5xx, a reset connection."""

HEALTH_NEUTRAL = frozenset(
    {
        UpstreamCategory.INVALID_REQUEST,
        UpstreamCategory.CONTEXT_LENGTH,
        UpstreamCategory.SAFETY,
        UpstreamCategory.RATE_LIMIT,
    }
)
"""Failures that say nothing about the deployment's health: ``on_failure(counts=False)``."""

MAX_DEFER_S = 600.0
"""The longest a provider's ``Retry-After`` can keep a deployment out of rotation: a buggy or
hostile header must not take a deployment away until the next restart."""


def affects_health(error: UpstreamError) -> bool:
    return error.category not in HEALTH_NEUTRAL


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``routing.maxAttempts``, ``baseBackoffMs``, ``maxBackoffMs``, ``retryStatuses``,
    ``maxRetryAfterMs`` and ``sameRouteRetries``, compiled into seconds at publication."""

    max_attempts: int = 3
    base_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    retry_statuses: frozenset[int] = DEFAULT_RETRY_STATUSES
    max_retry_after_s: float = 5.0
    """The longest ``Retry-After`` the gateway waits for before retrying the same deployment."""
    same_route_retries: int = 1
    """How many times one route may be retried within a request (0: every route is tried once)."""

    def retryable(self, error: UpstreamError) -> bool:
        """Whether another attempt (on this or another target) may follow ``error``."""
        if error.category not in RETRYABLE:
            return False
        status = error.status
        return status is None or status < 400 or status in self.retry_statuses

    def retries_in_place_first(self, error: UpstreamError) -> bool:
        """Whether ``error`` is retried on its own route before a lower-priority route is tried."""
        return error.category in SAME_ROUTE_FIRST

    def defer_s(self, error: UpstreamError) -> float | None:
        """How long to keep the deployment out of rotation, when its ``Retry-After`` is too long to
        wait for; ``None`` when it can be waited for (or there is none)."""
        after = error.retry_after
        if after is None or after <= self.max_retry_after_s:
            return None
        return min(after, MAX_DEFER_S)

    def backoff(self, retry_number: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry ``retry_number`` (1 for the first retry) of one route."""
        ceiling = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(max(0, retry_number - 1), 32))
        delay = rng.uniform(0, ceiling) if ceiling > 0 else 0.0
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.max_retry_after_s))
        return delay
