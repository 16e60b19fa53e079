"""How a circuit comes back: the failure-rate switch, the default cool-down cap, deferrals."""

from __future__ import annotations

import itertools

from tests.unit.routing.fakes import FakeClock
from tollway.config.loader import parse_config
from tollway.config.root import DEFAULT_MAX_RESET_TIMEOUT_MS
from tollway.routing.circuit import CircuitPolicy
from tollway.routing.health import DeploymentHealth


def _attempt(h: DeploymentHealth, ok: bool) -> bool:
    """One request's attempt on ``h`` if it is admitted; whether it was."""
    ticket = h.try_start()
    if ticket is None:
        return False
    if ok:
        h.on_success(0.1, ticket=ticket)
    else:
        h.on_failure(ticket=ticket)
    return True


def test_a_failure_rate_threshold_of_one_turns_the_rate_trip_off() -> None:
    policy = CircuitPolicy(failure_threshold=1000, failure_rate_threshold=1.0, min_requests=5, window_s=30)
    h = DeploymentHealth(policy, clock=FakeClock())
    for _ in range(50):
        assert _attempt(h, ok=False)
    assert h.state == "closed", "a 100 % failure rate must not trip a rate threshold of 1.0"
    below = DeploymentHealth(
        CircuitPolicy(failure_threshold=1000, failure_rate_threshold=0.99, min_requests=5), clock=FakeClock()
    )
    for _ in range(5):
        _attempt(below, ok=False)
    assert below.state == "open"


def test_the_default_policy_probes_a_down_deployment_at_a_capped_interval() -> None:
    cfg = parse_config({}).routing.circuitBreaker
    assert cfg.resetTimeoutMs <= DEFAULT_MAX_RESET_TIMEOUT_MS <= 30000
    clock = FakeClock(0.0)
    h = DeploymentHealth(CircuitPolicy(), clock=clock)
    probes: list[float] = []
    while clock.now < 600:
        was = h.state
        if _attempt(h, ok=False) and was == "half-open":
            probes.append(clock.now)
        clock.advance(0.5)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps and max(gaps) <= CircuitPolicy().max_reset_timeout_s + 0.5
    assert gaps[-1] == gaps[-2], "the schedule settles at the cap and keeps probing there"


def test_a_deployment_down_for_a_minute_is_used_again_within_ten_seconds() -> None:
    """Requests every 0.5 s; the deployment fails for 60 s and then recovers."""
    clock = FakeClock(0.0)
    h = DeploymentHealth(CircuitPolicy(), clock=clock)
    back_at = None
    while clock.now < 200:
        if _attempt(h, ok=clock.now >= 60.0) and clock.now >= 60.0:
            back_at = clock.now
            break
        clock.advance(0.5)
    assert back_at is not None and back_at - 60.0 <= 10.0


def test_a_deferred_deployment_is_unavailable_until_the_deferral_ends() -> None:
    clock = FakeClock()
    h = DeploymentHealth(CircuitPolicy(), clock=clock)
    h.defer(30.0, rate_limited=True)
    assert not h.available() and h.try_start() is None
    assert h.snapshot()["deferredForS"] == 30.0
    assert h.state == "closed", "a deferral is not a circuit verdict"
    clock.advance(30.0)
    assert h.available() and h.deferred_for() == 0.0
