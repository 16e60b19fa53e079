"""The per-deployment circuit breaker: a pure state machine over caller-supplied times.

::

    CLOSED ──(consecutive failures ≥ failure_threshold, or
              failure rate ≥ failure_rate_threshold over ≥ min_requests in the window)──▶ OPEN
    OPEN ──(cool-down elapsed)──▶ HALF_OPEN
    HALF_OPEN ──(a probe succeeds)──▶ CLOSED            cool-down back to reset_timeout_s
    HALF_OPEN ──(a probe fails)──▶ OPEN                  cool-down * backoff_multiplier,
                                                         capped at max_reset_timeout_s

The cap is what brings a recovered deployment back: once the cool-down has grown to it, a
probe is admitted every ``max_reset_timeout_s`` for as long as the deployment stays down, so
traffic returns at most that long after it recovers (10 s by default), however long the outage.

HALF_OPEN admits at most ``half_open_requests`` concurrent probes. Every transition starts a
new *epoch*; an attempt is admitted under the epoch current at its start, and its verdict only
moves the state machine if that epoch is still current. A slow request started before the
circuit opened therefore cannot close it, and cannot free a probe slot it never held.

The breaker takes ``now`` from its caller and keeps no clock of its own, so it is trivially
testable; ``DeploymentHealth`` owns the clock. State changes are plain attribute writes on the
event loop thread, and the rolling window is a fixed ring of buckets: nothing allocates per
request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["CircuitBreaker", "CircuitPolicy", "CircuitState", "RollingWindow"]


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class CircuitPolicy:
    """Breaker parameters; the first three are ``routing.circuitBreaker`` in ``llm-router.yml``.

    The failure-rate trip needs ``min_requests`` verdicts inside ``window_s`` so one failure in
    a quiet minute does not open a circuit; set ``failure_rate_threshold`` to 1.0 or more to
    disable it and keep only the consecutive-failure trip.
    """

    failure_threshold: int = 5
    reset_timeout_s: float = 5.0
    half_open_requests: int = 1
    failure_rate_threshold: float = 0.5
    min_requests: int = 20
    window_s: float = 30.0
    max_reset_timeout_s: float = 10.0
    backoff_multiplier: float = 2.0


class RollingWindow:
    """Success/failure counts over the last ``window_s`` seconds in ``buckets`` fixed slots.

    Resolution is ``window_s / buckets``: a verdict ages out between one and one-plus-a-slot
    windows after it was recorded.
    """

    __slots__ = ("_failures", "_slot_s", "_stamps", "_successes")

    def __init__(self, window_s: float, buckets: int = 10) -> None:
        self._slot_s = max(window_s, 1e-3) / buckets
        self._stamps = [-1] * buckets
        self._successes = [0] * buckets
        self._failures = [0] * buckets

    def record(self, now: float, failed: bool) -> None:
        stamp = int(now // self._slot_s)
        i = stamp % len(self._stamps)
        if self._stamps[i] != stamp:
            self._stamps[i] = stamp
            self._successes[i] = 0
            self._failures[i] = 0
        if failed:
            self._failures[i] += 1
        else:
            self._successes[i] += 1

    def counts(self, now: float) -> tuple[int, int]:
        """``(total, failures)`` inside the window ending at ``now``."""
        oldest = int(now // self._slot_s) - len(self._stamps) + 1
        total = failures = 0
        for i, stamp in enumerate(self._stamps):
            if stamp >= oldest:
                total += self._successes[i] + self._failures[i]
                failures += self._failures[i]
        return total, failures

    def failure_rate(self, now: float) -> float:
        total, failures = self.counts(now)
        return failures / total if total else 0.0

    def clear(self) -> None:
        for i in range(len(self._stamps)):
            self._stamps[i] = -1
            self._successes[i] = 0
            self._failures[i] = 0


class CircuitBreaker:
    """Closed / open / half-open with bounded probes and a bounded exponential cool-down."""

    __slots__ = (
        "_cooldown_s",
        "_epoch",
        "_state",
        "consecutive_failures",
        "opened_at",
        "policy",
        "probes_in_flight",
        "reopen_count",
        "retry_at",
        "transitions",
        "window",
    )

    def __init__(self, policy: CircuitPolicy) -> None:
        self.policy = policy
        self.window = RollingWindow(policy.window_s)
        self._state = CircuitState.CLOSED
        self._epoch = 0
        self._cooldown_s = policy.reset_timeout_s
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.retry_at = 0.0
        """When an open circuit turns half-open."""
        self.probes_in_flight = 0
        self.reopen_count = 0
        """Half-open probes that failed since the circuit last closed."""
        self.transitions = dict.fromkeys(CircuitState, 0)
        """Entries into each state since start: a metrics sampler reads the deltas, so a transition
        costs one increment here and nothing on the request path."""

    def set_policy(self, policy: CircuitPolicy) -> None:
        """Adopt a reloaded policy without forgetting state; a new window length restarts the window."""
        if policy.window_s != self.policy.window_s:
            self.window = RollingWindow(policy.window_s)
        self.policy = policy
        if self._state is CircuitState.CLOSED:
            self._cooldown_s = policy.reset_timeout_s

    def state(self, now: float) -> CircuitState:
        if self._state is CircuitState.OPEN and now >= self.retry_at:
            self._enter(CircuitState.HALF_OPEN)
        return self._state

    @property
    def cooldown_s(self) -> float:
        """The cool-down the next (or current) open period uses."""
        return self._cooldown_s

    def allows(self, now: float) -> bool:
        state = self.state(now)
        if state is CircuitState.CLOSED:
            return True
        return state is CircuitState.HALF_OPEN and self.probes_in_flight < self.policy.half_open_requests

    def admit(self, now: float) -> int | None:
        """Admit one attempt: its epoch ticket, or ``None`` when the circuit refuses it."""
        if not self.allows(now):
            return None
        if self._state is CircuitState.HALF_OPEN:
            self.probes_in_flight += 1
        return self._epoch

    def force_admit(self, now: float) -> int:
        """Admit regardless (the legacy ``on_start`` path): a refused attempt runs outside the
        probe budget, under an epoch no verdict can move."""
        ticket = self.admit(now)
        return ticket if ticket is not None else -1

    def release(self, ticket: int | None) -> None:
        """An admitted attempt ended with no verdict (cancelled)."""
        if self._current(ticket) and self._state is CircuitState.HALF_OPEN and self.probes_in_flight:
            self.probes_in_flight -= 1

    def record_success(self, now: float, ticket: int | None) -> None:
        self.window.record(now, failed=False)
        if not self._current(ticket):
            return
        self.consecutive_failures = 0
        if self._state is CircuitState.HALF_OPEN or (ticket is None and self._state is CircuitState.OPEN):
            self.reopen_count = 0
            self._cooldown_s = self.policy.reset_timeout_s
            self._enter(CircuitState.CLOSED)

    def record_failure(self, now: float, ticket: int | None) -> None:
        self.window.record(now, failed=True)
        self.consecutive_failures += 1
        if not self._current(ticket):
            return
        state = self.state(now)
        if state is CircuitState.HALF_OPEN:
            self.reopen_count += 1
            self._cooldown_s = min(
                max(self.policy.max_reset_timeout_s, self.policy.reset_timeout_s),
                self._cooldown_s * self.policy.backoff_multiplier,
            )
            self._open(now)
        elif state is CircuitState.CLOSED and self._should_trip(now):
            self._open(now)

    def trip(self, now: float) -> None:
        """Open now (an operator action or an external health signal)."""
        self._open(now)

    def _should_trip(self, now: float) -> bool:
        if self.consecutive_failures >= self.policy.failure_threshold:
            return True
        threshold = self.policy.failure_rate_threshold
        if threshold >= 1.0:
            return False
        total, failures = self.window.counts(now)
        return total >= self.policy.min_requests and failures >= threshold * total

    def _open(self, now: float) -> None:
        self.opened_at = now
        self.retry_at = now + self._cooldown_s
        self._enter(CircuitState.OPEN)

    def _enter(self, state: CircuitState) -> None:
        self._state = state
        self.transitions[state] += 1
        self._epoch += 1
        self.probes_in_flight = 0
        if state is CircuitState.CLOSED:
            self.opened_at = None
            self.consecutive_failures = 0
            self.window.clear()

    def _current(self, ticket: int | None) -> bool:
        """A verdict moves the state machine only from the epoch it was admitted in;
        ``None`` (a caller that keeps no ticket) is taken as current."""
        return ticket is None or ticket == self._epoch
