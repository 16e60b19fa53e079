"""Per-deployment runtime state that outlives any published root.

Circuit and health live here, keyed by deployment id, so a config reload neither resets an
open circuit nor forgets in-flight counts. Updates are plain attribute writes on the event
loop thread: no lock is needed and nothing here allocates per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["CircuitPolicy", "DeploymentHealth", "HealthRegistry"]


@dataclass(frozen=True, slots=True)
class CircuitPolicy:
    failure_threshold: int = 5
    reset_timeout_s: float = 30.0
    half_open_requests: int = 1


@dataclass(slots=True)
class DeploymentHealth:
    """Consecutive-failure circuit breaker with bounded half-open probing."""

    policy: CircuitPolicy
    consecutive_failures: int = 0
    opened_at: float | None = None
    half_open_in_flight: int = 0
    in_flight: int = 0
    ewma_latency_s: float = 0.0
    total_attempts: int = 0
    total_failures: int = 0

    def available(self, now: float | None = None) -> bool:
        if self.opened_at is None:
            return True
        now = time.monotonic() if now is None else now
        if now - self.opened_at < self.policy.reset_timeout_s:
            return False
        return self.half_open_in_flight < self.policy.half_open_requests

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if time.monotonic() - self.opened_at >= self.policy.reset_timeout_s else "open"

    def on_start(self) -> None:
        self.in_flight += 1
        self.total_attempts += 1
        if self.opened_at is not None:
            self.half_open_in_flight += 1

    def on_success(self, latency_s: float) -> None:
        self._end()
        self.consecutive_failures = 0
        self.opened_at = None
        self.half_open_in_flight = 0
        self.ewma_latency_s = latency_s if self.ewma_latency_s == 0.0 else 0.8 * self.ewma_latency_s + 0.2 * latency_s

    def on_failure(self, *, counts: bool = True) -> None:
        """Record a failed attempt; ``counts`` is False for errors that say nothing of health."""
        self._end()
        if not counts:
            return
        self.total_failures += 1
        self.consecutive_failures += 1
        if self.opened_at is not None or self.consecutive_failures >= self.policy.failure_threshold:
            self.opened_at = time.monotonic()
            self.half_open_in_flight = 0

    def on_abandon(self) -> None:
        """The attempt ended without a verdict (client cancelled)."""
        self._end()

    def _end(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if self.half_open_in_flight:
            self.half_open_in_flight -= 1


@dataclass(slots=True)
class HealthRegistry:
    """Stable ``DeploymentHealth`` objects by deployment id, shared across root generations."""

    _by_id: dict[str, DeploymentHealth] = field(default_factory=dict)

    def get(self, deployment_id: str, policy: CircuitPolicy) -> DeploymentHealth:
        health = self._by_id.get(deployment_id)
        if health is None:
            health = DeploymentHealth(policy)
            self._by_id[deployment_id] = health
        elif health.policy != policy:
            health.policy = policy
        return health

    def snapshot(self) -> dict[str, DeploymentHealth]:
        return dict(self._by_id)
