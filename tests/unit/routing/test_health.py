"""Circuit breaker, EWMA, outlier ejection and the registry that outlives roots."""

from __future__ import annotations

from tests.unit.routing.fakes import FakeClock
from tollway.routing.circuit import CircuitPolicy, CircuitState, RollingWindow
from tollway.routing.health import DeploymentHealth, HealthRegistry, OutlierPolicy, eject_outliers

POLICY = CircuitPolicy(
    failure_threshold=3, reset_timeout_s=10.0, half_open_requests=2, max_reset_timeout_s=35.0, min_requests=1000
)


def _health(policy: CircuitPolicy = POLICY) -> tuple[DeploymentHealth, FakeClock]:
    clock = FakeClock()
    return DeploymentHealth(policy, clock=clock), clock


def _fail(h: DeploymentHealth, n: int = 1) -> None:
    for _ in range(n):
        ticket = h.try_start()
        assert ticket is not None
        h.on_failure(ticket=ticket)


def _succeed(h: DeploymentHealth, n: int = 1, latency: float = 1.0) -> None:
    for _ in range(n):
        ticket = h.try_start()
        assert ticket is not None
        h.on_success(latency, ticket=ticket)


def _open_to_half_open(h: DeploymentHealth, clock: FakeClock) -> None:
    _fail(h, POLICY.failure_threshold)
    clock.advance(h.breaker.cooldown_s)
    assert h.circuit_state() is CircuitState.HALF_OPEN


def test_circuit_opens_on_consecutive_failure_threshold() -> None:
    h, clock = _health()
    _fail(h, 2)
    _succeed(h)
    _fail(h, 2)
    assert h.state == "closed", "a success resets the consecutive count"
    _fail(h)
    assert h.state == "open"
    assert not h.available()
    assert h.try_start() is None
    clock.advance(9.9)
    assert not h.available()


def test_circuit_opens_on_failure_rate_within_the_window() -> None:
    policy = CircuitPolicy(failure_threshold=100, failure_rate_threshold=0.5, min_requests=10, window_s=30)
    h, _ = _health(policy)
    for _ in range(5):
        _succeed(h)
        _fail(h)
    assert h.state == "open", "5 of 10 failed"
    h2, clock2 = _health(policy)
    for _ in range(4):
        _fail(h2)
        clock2.advance(10)
    for _ in range(6):
        _succeed(h2)
    assert h2.state == "closed", "failures older than the window have aged out"


def test_failure_rate_needs_min_requests() -> None:
    h, _ = _health(CircuitPolicy(failure_threshold=100, failure_rate_threshold=0.5, min_requests=10))
    _fail(h, 4)
    assert h.state == "closed"


def test_half_open_admits_only_n_concurrent_probes() -> None:
    h, clock = _health()
    _open_to_half_open(h, clock)
    first, second = h.try_start(), h.try_start()
    assert first is not None and second is not None
    assert not h.available()
    assert h.try_start() is None, "a third concurrent probe is refused"
    h.on_abandon(ticket=first)
    assert h.available(), "a cancelled probe frees its slot without a verdict"
    assert h.state == "half-open"


def test_half_open_probe_success_closes_and_resets_cool_down() -> None:
    h, clock = _health()
    _open_to_half_open(h, clock)
    _fail(h)
    clock.advance(20)
    _succeed(h)
    assert h.state == "closed"
    assert h.breaker.cooldown_s == POLICY.reset_timeout_s
    assert h.consecutive_failures == 0


def test_half_open_probe_failure_reopens_with_a_longer_bounded_cool_down() -> None:
    h, clock = _health()
    _open_to_half_open(h, clock)
    cooldowns = []
    for _ in range(4):
        _fail(h)
        assert h.state == "open"
        cooldowns.append(h.breaker.cooldown_s)
        clock.advance(h.breaker.cooldown_s - 0.01)
        assert h.state == "open"
        clock.advance(0.01)
        assert h.state == "half-open"
    assert cooldowns == [20.0, 35.0, 35.0, 35.0]


def test_a_stale_attempt_cannot_close_or_free_a_probe() -> None:
    h, clock = _health()
    stale = h.try_start()
    _open_to_half_open(h, clock)
    probe = h.try_start()
    assert probe is not None
    h.on_success(5.0, ticket=stale)
    assert h.state == "half-open", "a request admitted before the circuit opened proves nothing"
    assert h.half_open_in_flight == 1
    h.on_success(1.0, ticket=probe)
    assert h.state == "closed"


def test_health_neutral_failures_do_not_trip() -> None:
    h, _ = _health()
    for _ in range(10):
        ticket = h.try_start()
        h.on_failure(counts=False, ticket=ticket)
    assert h.state == "closed" and h.in_flight == 0 and h.total_failures == 0


def test_legacy_interface_keeps_its_semantics() -> None:
    h, clock = _health()
    for _ in range(3):
        h.on_start()
        h.on_failure()
    assert h.state == "open" and h.opened_at == clock.now
    clock.advance(10)
    assert h.available(clock.now)
    h.on_start()
    h.on_start()
    assert not h.available(), "two legacy probes fill the half-open budget"
    h.on_success(0.5)
    assert h.state == "closed" and h.in_flight == 1


def test_ewma_ttft_latency_and_in_flight() -> None:
    h, _ = _health()
    a, b = h.try_start(), h.try_start()
    assert h.in_flight == 2
    h.observe_ttft(0.2)
    h.on_success(1.0, ticket=a)
    h.on_success(2.0, ttft_s=0.4, ticket=b)
    assert h.in_flight == 0
    assert h.ewma_latency_s == 0.8 * 1.0 + 0.2 * 2.0
    assert h.ewma_ttft_s == 0.8 * 0.2 + 0.2 * 0.4


def test_snapshot_is_a_secret_free_admin_view() -> None:
    h, _ = _health()
    _succeed(h, latency=0.25)
    _fail(h, 3)
    snap = h.snapshot()
    assert snap["circuit"] == "open"
    assert snap["openForS"] == 10.0
    assert snap["ewmaLatencyS"] == 0.25 and snap["ewmaTtftS"] is None
    assert snap["totalAttempts"] == 4 and snap["totalFailures"] == 3
    assert snap == h.as_dict()
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in snap.values())


def test_rolling_window_ages_out() -> None:
    w = RollingWindow(10.0, buckets=10)
    w.record(100.0, failed=True)
    w.record(105.0, failed=False)
    assert w.counts(105.0) == (2, 1)
    assert w.counts(110.5) == (1, 0)
    assert w.counts(200.0) == (0, 0)


def _group(n: int, clock: FakeClock) -> list[DeploymentHealth]:
    return [DeploymentHealth(CircuitPolicy(failure_threshold=1000), clock=clock) for _ in range(n)]


def test_outlier_ejection_by_latency_and_back_after_bounded_time() -> None:
    clock = FakeClock()
    group = _group(4, clock)
    for h in group[:3]:
        _succeed(h, 10, latency=1.0)
    _succeed(group[3], 10, latency=5.0)
    policy = OutlierPolicy(base_ejection_s=30, max_ejection_s=50)
    assert eject_outliers(group, policy) == [group[3]]
    assert not group[3].available()
    assert eject_outliers(group, policy) == [], "ejected members are not judged again"
    clock.advance(30)
    assert group[3].available()
    _succeed(group[3], 10, latency=5.0)
    assert eject_outliers(group, policy) == [group[3]]
    assert group[3].ejected_until == clock.now + 50, "doubled, capped at max_ejection_s"


def test_outlier_ejection_by_error_rate() -> None:
    clock = FakeClock()
    group = _group(3, clock)
    for h in group[:2]:
        _succeed(h, 10)
    _succeed(group[2], 4)
    _fail(group[2], 6)
    assert eject_outliers(group, OutlierPolicy(max_ejection_fraction=0.34)) == [group[2]]


def test_outlier_ejection_respects_the_max_fraction() -> None:
    clock = FakeClock()
    group = _group(5, clock)
    for h in group[:3]:
        _succeed(h, 10, latency=1.0)
    _succeed(group[3], 10, latency=9.0)
    _succeed(group[4], 10, latency=12.0)
    policy = OutlierPolicy(max_ejection_fraction=0.2)
    assert eject_outliers(group, policy) == [group[4]], "two outliers, room for one: the worst goes"
    assert eject_outliers(group, policy) == [], "the cap counts members already ejected"
    assert [h.ejected() for h in group] == [False, False, False, False, True]
    assert eject_outliers(group, OutlierPolicy(max_ejection_fraction=0.4)) == [group[3]]


def test_a_group_too_small_for_the_fraction_never_ejects() -> None:
    clock = FakeClock()
    group = _group(2, clock)
    _succeed(group[0], 10, latency=1.0)
    _succeed(group[1], 10, latency=100.0)
    assert eject_outliers(group, OutlierPolicy(max_ejection_fraction=0.4)) == []


def test_health_state_survives_a_simulated_reload() -> None:
    clock = FakeClock()
    registry = HealthRegistry(clock=clock)
    before = registry.get("openai-primary", POLICY)
    _fail(before, POLICY.failure_threshold)
    inflight = before.try_start()
    assert inflight is None
    _succeed(registry.get("other", POLICY))
    reloaded_policy = CircuitPolicy(failure_threshold=7, reset_timeout_s=10.0, half_open_requests=2)
    after = registry.get("openai-primary", reloaded_policy)
    assert after is before
    assert after.state == "open", "a reload does not reset an open circuit"
    assert after.policy == reloaded_policy
    view = registry.as_dict()
    assert list(view) == ["openai-primary", "other"]
    assert view["openai-primary"]["circuit"] == "open"
    registry.retain(["other"])
    assert registry.get("openai-primary", POLICY) is not before
