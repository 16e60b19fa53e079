"""Typed retry rules: which failed attempts may be tried again, and how long to wait first.

The decision reads the attempt's ``UpstreamCategory`` and HTTP status, never an error string.
A retryable category is retried when the attempt has no error status (a connect failure, a
local timeout, a malformed 200) or its status is in ``retry_statuses`` (default 408, 429, 500,
502, 503, 504, 529), so an operator can take 429 or a 5xx out of the list:

============================  ==========  ===================================================
Category                      Retry       Health
============================  ==========  ===================================================
``connect``, ``timeout``      yes         counts against the deployment (408 maps to timeout)
``rate_limit`` (429)          yes         neutral: a quota says nothing of the endpoint
``server``, ``overloaded``    yes         counts
``malformed``                 yes         counts (a broken body or stream before any output)
``authentication``            never       counts (a broken credential is the deployment's)
``permission``, ``not_found`` never       counts
``invalid_request``           never       neutral: the request's fault, not the deployment's
``context_length``            never       neutral
``safety``                    never       neutral
============================  ==========  ===================================================

The gateway's own ``UnsupportedParameter`` is raised before dispatch and never reaches here.
Nothing is retried once a semantic stream event has reached the client; that rule lives in the
attempt loop, which only consults this policy before commitment.

Backoff is exponential with full jitter, ``uniform(0, min(max_backoff, base * 2**(n-1)))``, and
never shorter than the provider's ``Retry-After`` (itself capped at ``max_retry_after_s``). A
delay that would end at or past the request deadline means *do not retry this target*.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tollway.exceptions import UpstreamCategory, UpstreamError

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "HEALTH_NEUTRAL",
    "NEVER_RETRY",
    "RETRYABLE",
    "RetryRules",
    "affects_health",
]

DEFAULT_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})

RETRYABLE = frozenset(
    {
        UpstreamCategory.CONNECT,
        UpstreamCategory.TIMEOUT,
        UpstreamCategory.RATE_LIMIT,
        UpstreamCategory.SERVER,
        UpstreamCategory.OVERLOADED,
        UpstreamCategory.MALFORMED,
    }
)

NEVER_RETRY = frozenset(
    {
        UpstreamCategory.AUTHENTICATION,
        UpstreamCategory.PERMISSION,
        UpstreamCategory.NOT_FOUND,
        UpstreamCategory.INVALID_REQUEST,
        UpstreamCategory.CONTEXT_LENGTH,
        UpstreamCategory.SAFETY,
    }
)

HEALTH_NEUTRAL = frozenset(
    {
        UpstreamCategory.INVALID_REQUEST,
        UpstreamCategory.CONTEXT_LENGTH,
        UpstreamCategory.SAFETY,
        UpstreamCategory.RATE_LIMIT,
    }
)
"""Failures that say nothing about the deployment's health: ``on_failure(counts=False)``."""


def affects_health(error: UpstreamError) -> bool:
    return error.category not in HEALTH_NEUTRAL


@dataclass(frozen=True, slots=True)
class RetryRules:
    """``routing.maxAttempts``, ``baseBackoffMs``, ``maxBackoffMs``, ``retryStatuses`` and
    ``maxRetryAfterMs``, compiled into seconds."""

    max_attempts: int = 3
    base_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    retry_statuses: frozenset[int] = DEFAULT_RETRY_STATUSES
    max_retry_after_s: float = 30.0
    """A longer provider ``Retry-After`` is capped here (the deadline still bounds the wait)."""

    def retryable(self, error: UpstreamError) -> bool:
        """Whether another attempt (on this or another target) may follow ``error``."""
        if error.category not in RETRYABLE:
            return False
        status = error.status
        return status is None or status < 400 or status in self.retry_statuses

    def backoff(self, retry_number: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry ``retry_number`` (1 for the first retry) of one target."""
        ceiling = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(max(0, retry_number - 1), 32))
        delay = rng.uniform(0, ceiling) if ceiling > 0 else 0.0
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.max_retry_after_s))
        return delay

    def delay_within(
        self, retry_number: int, retry_after: float | None, rng: random.Random, *, now: float, deadline: float
    ) -> float | None:
        """``backoff`` when waiting it still leaves time before ``deadline``; otherwise ``None``
        (do not retry this target; another target needs no wait)."""
        delay = self.backoff(retry_number, retry_after, rng)
        return delay if now + delay < deadline else None

    def may_attempt(self, attempts_made: int, *, now: float, deadline: float) -> bool:
        """The single request-scoped budget: count and deadline."""
        return attempts_made < self.max_attempts and now < deadline
