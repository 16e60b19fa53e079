"""Hand-driven clock and minimal targets for routing unit tests."""

from __future__ import annotations

from dataclasses import dataclass

from tollway.routing.circuit import CircuitPolicy
from tollway.routing.health import DeploymentHealth


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True, slots=True, eq=False)
class FakeTarget:
    route_id: str
    weight: int
    priority: int
    health: DeploymentHealth


def target(
    route_id: str,
    weight: int = 1,
    priority: int = 0,
    *,
    clock: FakeClock | None = None,
    policy: CircuitPolicy | None = None,
) -> FakeTarget:
    health = DeploymentHealth(policy or CircuitPolicy(), clock=clock or FakeClock())
    return FakeTarget(route_id, weight, priority, health)


def trip(t: FakeTarget) -> None:
    """Open ``t``'s circuit through its consecutive-failure threshold."""
    for _ in range(t.health.policy.failure_threshold):
        ticket = t.health.try_start()
        t.health.on_failure(ticket=ticket)
