"""Per-deployment runtime state that outlives any published root.

Circuit, latency, in-flight and outlier state live here, keyed by deployment id in a
``HealthRegistry`` the publisher owns, so a config reload neither resets an open circuit nor
forgets in-flight counts: a new root's ``RouteTarget`` points at the same ``DeploymentHealth``.
Updates are plain attribute writes on the event loop thread: no lock is needed and nothing here
allocates per request. The clock is injectable so tests drive time by hand.

The attempt lifecycle::

    ticket = health.try_start()          # None: refused (open, ejected, deferred, saturated, probes full)
    ...
    health.observe_ttft(seconds)         # streams: when the first semantic event arrives
    health.on_success(seconds, ticket=ticket)  |  health.on_failure(counts=..., ticket=ticket)
                                               |  health.on_abandon(ticket=ticket)

``on_start()`` (no refusal, no ticket) and ticket-less verdicts remain for callers that have not
moved to ``try_start``; they keep the original semantics.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tollway.routing.circuit import CircuitBreaker, CircuitPolicy, CircuitState

__all__ = [
    "CircuitPolicy",
    "CircuitState",
    "DeploymentHealth",
    "HealthRegistry",
    "OutlierPolicy",
    "eject_outliers",
]

Clock = Callable[[], float]

EWMA_ALPHA = 0.2
"""Weight of the newest sample: about the last ten samples dominate."""


@dataclass(frozen=True, slots=True)
class OutlierPolicy:
    """When a deployment is far enough behind its priority group to be ejected for a while.

    A member is an outlier when, with at least ``min_requests`` verdicts in its rolling window
    (or latency samples since its last ejection), either its failure rate exceeds the group's
    median rate by at least ``error_rate_margin``, or its EWMA total latency is at least
    ``latency_factor`` times the group's median. Ejection lasts ``base_ejection_s`` doubled for
    each consecutive ejection, capped at ``max_ejection_s``. At most
    ``floor(max_ejection_fraction * group size)`` members are ejected at once, so a group of one,
    or of two with the default fraction below 0.5, never ejects.
    """

    enabled: bool = True
    error_rate_margin: float = 0.3
    latency_factor: float = 3.0
    min_requests: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_fraction: float = 0.5


class DeploymentHealth:
    """Circuit breaker, EWMA latencies, in-flight count and outlier ejection of one deployment."""

    __slots__ = (
        "_samples_since_ejection",
        "breaker",
        "clock",
        "deferred_rate_limited",
        "deferred_until",
        "ejected_until",
        "ejection_count",
        "ewma_latency_s",
        "ewma_ttft_s",
        "in_flight",
        "latency_samples",
        "max_in_flight",
        "total_abandoned",
        "total_attempts",
        "total_failures",
        "total_successes",
        "ttft_samples",
    )

    def __init__(self, policy: CircuitPolicy, *, clock: Clock = time.monotonic, max_in_flight: int = 0) -> None:
        self.breaker = CircuitBreaker(policy)
        self.clock = clock
        self.max_in_flight = max_in_flight
        """0 means unbounded; otherwise the target counts as saturated at this many attempts."""
        self.in_flight = 0
        self.ewma_latency_s = 0.0
        self.ewma_ttft_s = 0.0
        self.latency_samples = 0
        self.ttft_samples = 0
        self._samples_since_ejection = 0
        self.total_attempts = 0
        self.total_successes = 0
        self.total_failures = 0
        self.total_abandoned = 0
        self.ejected_until = 0.0
        self.ejection_count = 0
        self.deferred_until = 0.0
        """Out of rotation until then: the provider asked for a longer wait than the gateway waits."""
        self.deferred_rate_limited = False

    # -- compatibility with the original dataclass ------------------------------------------

    @property
    def policy(self) -> CircuitPolicy:
        return self.breaker.policy

    @policy.setter
    def policy(self, policy: CircuitPolicy) -> None:
        self.breaker.set_policy(policy)

    @property
    def consecutive_failures(self) -> int:
        return self.breaker.consecutive_failures

    @property
    def opened_at(self) -> float | None:
        return self.breaker.opened_at

    @property
    def half_open_in_flight(self) -> int:
        return self.breaker.probes_in_flight

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        return self.breaker.state(self.clock()).value

    # -- selection ------------------------------------------------------------------------------

    def circuit_state(self, now: float | None = None) -> CircuitState:
        return self.breaker.state(self.clock() if now is None else now)

    def ejected(self, now: float | None = None) -> bool:
        return (self.clock() if now is None else now) < self.ejected_until

    def saturated(self) -> bool:
        return 0 < self.max_in_flight <= self.in_flight

    def available(self, now: float | None = None) -> bool:
        """Whether a new attempt would be admitted now: not ejected, not deferred, not saturated,
        and the circuit closed or half-open with a probe slot free."""
        now = self.clock() if now is None else now
        if now < self.ejected_until or now < self.deferred_until or self.saturated():
            return False
        return self.breaker.allows(now)

    def defer(self, seconds: float, *, rate_limited: bool, now: float | None = None) -> None:
        """Keep the deployment out of rotation for ``seconds``: its ``Retry-After`` was longer than
        ``routing.maxRetryAfterMs``. Neither the circuit nor the outlier evidence changes."""
        until = (self.clock() if now is None else now) + seconds
        if until > self.deferred_until:
            self.deferred_until = until
            self.deferred_rate_limited = rate_limited

    def deferred_for(self, now: float | None = None) -> float:
        """Seconds left of a deferral (0.0: none)."""
        return max(0.0, self.deferred_until - (self.clock() if now is None else now))

    # -- the attempt lifecycle ------------------------------------------------------------------

    def try_start(self, now: float | None = None) -> int | None:
        """Admit one attempt and count it in flight; ``None`` when it must go elsewhere.

        The gateway calls this right before dispatch: between ordering and dispatch another
        request may have taken the last half-open probe slot.
        """
        now = self.clock() if now is None else now
        if now < self.ejected_until or now < self.deferred_until or self.saturated():
            return None
        ticket = self.breaker.admit(now)
        if ticket is not None:
            self.in_flight += 1
            self.total_attempts += 1
        return ticket

    def on_start(self) -> int:
        """Count an attempt in flight unconditionally (the pre-``try_start`` interface)."""
        self.in_flight += 1
        self.total_attempts += 1
        return self.breaker.force_admit(self.clock())

    def observe_ttft(self, ttft_s: float) -> None:
        """Time to the first semantic event, recorded when it arrives rather than at the end."""
        self.ewma_ttft_s = ttft_s if self.ttft_samples == 0 else _ewma(self.ewma_ttft_s, ttft_s)
        self.ttft_samples += 1

    def on_success(self, latency_s: float, *, ttft_s: float | None = None, ticket: int | None = None) -> None:
        self._end()
        self.total_successes += 1
        if ttft_s is not None:
            self.observe_ttft(ttft_s)
        self.ewma_latency_s = latency_s if self.latency_samples == 0 else _ewma(self.ewma_latency_s, latency_s)
        self.latency_samples += 1
        self._samples_since_ejection += 1
        self.breaker.record_success(self.clock(), ticket)

    def on_failure(self, *, counts: bool = True, ticket: int | None = None) -> None:
        """Record a failed attempt; ``counts`` is False for errors that say nothing of health."""
        if not counts:
            self._end()
            self.breaker.release(ticket)
            return
        self._end()
        self.total_failures += 1
        self.breaker.record_failure(self.clock(), ticket)

    def on_abandon(self, *, ticket: int | None = None) -> None:
        """The attempt ended without a verdict (client cancelled)."""
        self._end()
        self.total_abandoned += 1
        self.breaker.release(ticket)

    def _end(self) -> None:
        if self.in_flight:
            self.in_flight -= 1

    # -- outlier ejection -----------------------------------------------------------------------

    def window_counts(self, now: float | None = None) -> tuple[int, int]:
        """``(verdicts, failures)`` in the circuit's rolling window."""
        return self.breaker.window.counts(self.clock() if now is None else now)

    def eject(self, now: float, policy: OutlierPolicy) -> None:
        """Eject for a bounded, growing time and forget the evidence so that, once back, the
        deployment is judged on fresh samples only."""
        self.ejection_count += 1
        duration = policy.base_ejection_s * 2 ** min(self.ejection_count - 1, 16)
        self.ejected_until = now + min(policy.max_ejection_s, duration)
        self.breaker.window.clear()
        self._samples_since_ejection = 0

    @property
    def samples_since_ejection(self) -> int:
        """Latency samples since the last ejection: the evidence outlier detection may use."""
        return self._samples_since_ejection

    # -- admin view -----------------------------------------------------------------------------

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """A read-only, secret-free view for the admin surface."""
        now = self.clock() if now is None else now
        verdicts, failures = self.breaker.window.counts(now)
        state = self.breaker.state(now)
        return {
            "circuit": state.value,
            "consecutiveFailures": self.breaker.consecutive_failures,
            "openForS": round(max(0.0, self.breaker.retry_at - now), 3) if state is CircuitState.OPEN else 0.0,
            "nextCooldownS": self.breaker.cooldown_s,
            "halfOpenProbesInFlight": self.breaker.probes_in_flight,
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "ewmaTtftS": round(self.ewma_ttft_s, 6) if self.ttft_samples else None,
            "ewmaLatencyS": round(self.ewma_latency_s, 6) if self.latency_samples else None,
            "windowRequests": verdicts,
            "windowFailures": failures,
            "ejected": now < self.ejected_until,
            "ejectedForS": round(max(0.0, self.ejected_until - now), 3),
            "ejectionCount": self.ejection_count,
            "deferredForS": round(max(0.0, self.deferred_until - now), 3),
            "totalAttempts": self.total_attempts,
            "totalSuccesses": self.total_successes,
            "totalFailures": self.total_failures,
            "totalAbandoned": self.total_abandoned,
        }

    as_dict = snapshot

    def __repr__(self) -> str:
        return f"DeploymentHealth({self.state}, in_flight={self.in_flight})"


def _ewma(previous: float, sample: float) -> float:
    return (1 - EWMA_ALPHA) * previous + EWMA_ALPHA * sample


def eject_outliers(
    group: Sequence[DeploymentHealth], policy: OutlierPolicy, now: float | None = None
) -> list[DeploymentHealth]:
    """Eject the members of one priority group that are far worse than its median.

    Call it after recording a retryable failure (before reselection) or periodically. Returns the
    members ejected by this call, worst first. Members already ejected count against the cap and
    are not re-judged; members without ``min_requests`` of evidence are never judged. A member
    judged healthy has its ejection count (and so its next ejection time) reset.
    """
    if not policy.enabled or len(group) < 2:
        return []
    if now is None:
        now = group[0].clock()
    members = list(dict.fromkeys(group))
    active = [h for h in members if not h.ejected(now)]
    budget = int(policy.max_ejection_fraction * len(members)) - (len(members) - len(active))
    if budget <= 0:
        return []
    rates: list[tuple[DeploymentHealth, float]] = []
    for h in active:
        verdicts, failures = h.window_counts(now)
        if verdicts >= policy.min_requests:
            rates.append((h, failures / verdicts))
    latencies = [(h, h.ewma_latency_s) for h in active if h.samples_since_ejection >= policy.min_requests]
    margin, factor = max(policy.error_rate_margin, 1e-9), policy.latency_factor
    scored: dict[DeploymentHealth, float] = {}
    judged = _judge(rates, lambda rate, median: (rate - median) / margin, scored)
    judged |= _judge(latencies, lambda lat, median: lat / (factor * median) if median > 0 else 0.0, scored)
    for h in judged.difference(scored):
        h.ejection_count = 0
    worst = sorted(scored, key=scored.__getitem__, reverse=True)[:budget]
    for h in worst:
        h.eject(now, policy)
    return worst


def _judge(
    values: list[tuple[DeploymentHealth, float]],
    severity: Callable[[float, float], float],
    scored: dict[DeploymentHealth, float],
) -> set[DeploymentHealth]:
    """Compare each value with the group median. ``severity(value, median)`` is scaled so that
    an outlier scores above 1 (error rate) or at least 1 (latency); outliers are recorded in
    ``scored`` by their worst severity. Returns every member judged."""
    if len(values) < 2:
        return set()
    median = statistics.median(v for _, v in values)
    for h, value in values:
        sev = severity(value, median)
        if sev >= 1.0:
            scored[h] = max(scored.get(h, 0.0), sev)
    return {h for h, _ in values}


@dataclass(slots=True)
class HealthRegistry:
    """Stable ``DeploymentHealth`` objects by deployment id, shared across root generations."""

    clock: Clock = time.monotonic
    _by_id: dict[str, DeploymentHealth] = field(default_factory=dict)

    def get(self, deployment_id: str, policy: CircuitPolicy, *, max_in_flight: int | None = None) -> DeploymentHealth:
        """The deployment's health object, created once; a changed policy is adopted in place."""
        health = self._by_id.get(deployment_id)
        if health is None:
            health = DeploymentHealth(policy, clock=self.clock, max_in_flight=max_in_flight or 0)
            self._by_id[deployment_id] = health
        else:
            if health.policy != policy:
                health.policy = policy
            if max_in_flight is not None:
                health.max_in_flight = max_in_flight
        return health

    def retain(self, deployment_ids: Iterable[str]) -> None:
        """Forget deployments no longer published (in-flight attempts keep their own reference)."""
        keep = set(deployment_ids)
        for key in [k for k in self._by_id if k not in keep]:
            del self._by_id[key]

    def snapshot(self) -> dict[str, DeploymentHealth]:
        return dict(self._by_id)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The admin view of every deployment, at one instant."""
        now = self.clock()
        return {key: health.snapshot(now) for key, health in sorted(self._by_id.items())}
