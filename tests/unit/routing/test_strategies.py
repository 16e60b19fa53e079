"""Selection within and across priority groups.

Statistical checks use a fixed seed and enough samples that the bound is many standard
deviations wide: they are deterministic, and a failure means the distribution is wrong.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from tests.unit.routing.fakes import FakeClock, FakeTarget, target, trip
from tollway.routing.plan import RouteTarget
from tollway.routing.strategies import (
    BASIS_POINTS,
    STRATEGIES,
    Canary,
    CanarySplit,
    LatencyAware,
    LeastInFlight,
    Ordered,
    Routable,
    SelectionInput,
    Sticky,
    WeightedRandom,
    basis_point,
    decide,
    order_targets,
)

CHI2_DF2_P001 = 13.816
"""Chi-square critical value, 2 degrees of freedom, p = 0.001."""

ANON = SelectionInput(principal_id="p")


def _route_target_is_routable(t: RouteTarget) -> Routable:
    """Type-level check (mypy): the published ``RouteTarget`` satisfies the selection protocol."""
    return t


def test_weighted_random_first_pick_follows_weights_within_chi_square_bound() -> None:
    targets = [target("a", 1), target("b", 2), target("c", 7)]
    n = 30_000
    rng = random.Random(20261129)
    counts = Counter(order_targets([targets], WeightedRandom(), ANON, rng)[0].route_id for _ in range(n))
    expected = {"a": n * 0.1, "b": n * 0.2, "c": n * 0.7}
    chi2 = sum((counts[k] - e) ** 2 / e for k, e in expected.items())
    assert chi2 < CHI2_DF2_P001, (counts, chi2)


def test_every_available_target_appears_once_pick_first_then_fallbacks() -> None:
    groups = [[target("a", 3), target("b", 1)], [target("c", 1, 1), target("d", 0, 1)]]
    for strategy in STRATEGIES.values():
        order = order_targets(groups, strategy, SelectionInput("p", session_id="s"), random.Random(1))
        ids = [t.route_id for t in order]
        assert sorted(ids[:2]) == ["a", "b"] and ids[2:] == ["c"], (strategy.name, ids)


def test_a_target_listed_twice_is_ordered_once() -> None:
    a = target("a")
    assert [t.route_id for t in order_targets([[a], [a, target("b")]], Ordered(), ANON, random.Random(0))] == [
        "a",
        "b",
    ]


def test_priority_group_failover_when_the_first_group_is_all_open() -> None:
    clock = FakeClock()
    first = [target("a", clock=clock), target("b", clock=clock)]
    second = [target("c", priority=1, clock=clock)]
    for t in first:
        trip(t)
    decision = decide([first, second], WeightedRandom(), ANON, random.Random(3))
    assert [t.route_id for t in decision.targets] == ["c"]
    clock.advance(first[0].health.policy.reset_timeout_s)
    assert decide([first, second], WeightedRandom(), ANON, random.Random(3)).targets[0].route_id in {"a", "b"}


def test_ejected_and_saturated_targets_are_skipped() -> None:
    clock = FakeClock()
    ejected, saturated, fine = target("x", clock=clock), target("y", clock=clock), target("z", clock=clock)
    ejected.health.ejected_until = clock.now + 10
    saturated.health.max_in_flight = 1
    saturated.health.try_start()
    assert [t.route_id for t in order_targets([[ejected, saturated, fine]], Ordered(), ANON, random.Random())] == ["z"]


def test_least_in_flight_picks_the_idle_target() -> None:
    busy, idle = target("busy", 5), target("idle", 1)
    busy.health.try_start()
    for seed in range(50):
        assert order_targets([[busy, idle]], LeastInFlight(), ANON, random.Random(seed))[0] is idle


def test_least_in_flight_weight_bias_is_bounded() -> None:
    heavy, light = target("heavy", 1000), target("light", 1)
    strategy = LeastInFlight(max_weight_bias=4)
    light.health.try_start()
    for _ in range(3):
        heavy.health.try_start()
    assert order_targets([[heavy, light]], strategy, ANON, random.Random())[0] is heavy
    for _ in range(2):
        heavy.health.try_start()
    # light's weight counts as 1000 / 4: at 5 in flight, heavy carries more than 4x light's load
    assert order_targets([[heavy, light]], strategy, ANON, random.Random())[0] is light


def test_least_in_flight_ties_break_by_weight() -> None:
    targets = [target("a", 1), target("b", 3)]
    rng = random.Random(11)
    counts = Counter(order_targets([targets], LeastInFlight(), ANON, rng)[0].route_id for _ in range(8000))
    # binomial(8000, 0.75): sd ~ 39; the bound is about 5 sd
    assert abs(counts["b"] - 6000) < 200, counts


def _measure(t: FakeTarget, ttft: float, latency: float, n: int = 5) -> None:
    for _ in range(n):
        ticket = t.health.try_start()
        t.health.observe_ttft(ttft)
        t.health.on_success(latency, ticket=ticket)


def test_latency_aware_prefers_the_faster_and_still_explores() -> None:
    fast, slow = target("fast"), target("slow")
    _measure(fast, 0.1, 1.0)
    _measure(slow, 0.5, 4.0)
    strategy = LatencyAware(explore_probability=0.1)
    rng = random.Random(5)
    n = 10_000
    counts = Counter(order_targets([[fast, slow]], strategy, ANON, rng)[0].route_id for _ in range(n))
    # slow is first only when exploring (p = 0.1) and the weighted draw picks it (1/2): 5%
    assert 350 < counts["slow"] < 650, counts
    assert counts["fast"] > 9000


def test_latency_aware_explores_unmeasured_targets_first_when_exploring() -> None:
    fast, new = target("fast"), target("new")
    _measure(fast, 0.1, 1.0)
    rng = random.Random(9)
    n = 10_000
    counts = Counter(
        order_targets([[fast, new]], LatencyAware(explore_probability=0.2), ANON, rng)[0].route_id for _ in range(n)
    )
    assert 1700 < counts["new"] < 2300, counts
    assert order_targets([[new, fast]], LatencyAware(explore_probability=0.0), ANON, random.Random())[0] is fast


def test_latency_aware_rejects_unbounded_exploration() -> None:
    with pytest.raises(ValueError):
        LatencyAware(explore_probability=0.9)


def test_sticky_sessions_stay_on_their_route() -> None:
    targets = [target(f"r{i}", w) for i, w in enumerate((1, 2, 3, 4))]
    for s in range(200):
        sel = SelectionInput("tenant-a", session_id=f"session-{s}")
        picks = {order_targets([targets], Sticky(), sel, random.Random(r))[0].route_id for r in range(5)}
        assert len(picks) == 1


def test_sticky_removing_a_target_moves_only_its_sessions() -> None:
    targets = [target(f"r{i}", w) for i, w in enumerate((1, 2, 3, 4))]
    sessions = [SelectionInput("tenant-a", session_id=f"session-{s}") for s in range(4000)]
    before = {s.session_id: order_targets([targets], Sticky(), s, random.Random())[0].route_id for s in sessions}
    trip_target = targets[2]
    trip(trip_target)
    after = {s.session_id: order_targets([targets], Sticky(), s, random.Random())[0].route_id for s in sessions}
    moved = {sid for sid in before if before[sid] != after[sid]}
    assert moved == {sid for sid, rid in before.items() if rid == "r2"}
    assert all(after[sid] != "r2" for sid in moved)
    share = Counter(before.values())
    # weighted rendezvous: shares follow weights 1:2:3:4 (binomial sd <= 31 at n = 4000)
    for i, w in enumerate((1, 2, 3, 4)):
        assert abs(share[f"r{i}"] - 400 * w) < 160, share


def test_sticky_placement_is_isolated_per_principal() -> None:
    targets = [target(f"r{i}") for i in range(8)]
    same = sum(
        order_targets([targets], Sticky(), SelectionInput("tenant-a", session_id=f"s{i}"), random.Random())[0]
        is order_targets([targets], Sticky(), SelectionInput("tenant-b", session_id=f"s{i}"), random.Random())[0]
        for i in range(800)
    )
    assert same < 200, "one session id must not place two tenants together beyond chance (1/8)"


def test_sticky_without_a_session_falls_back_to_weighted_random() -> None:
    targets = [target("a"), target("b")]
    rng = random.Random(2)
    assert {order_targets([targets], Sticky(), ANON, rng)[0].route_id for _ in range(50)} == {"a", "b"}


def _expected_basis_point(key: str, alias: str, salt: str) -> int:
    h = hashlib.blake2b(digest_size=8, person=b"tollway-canary")
    for part in (key, alias, salt):
        raw = part.encode()
        h.update(len(raw).to_bytes(4, "big") + raw)
    return int.from_bytes(h.digest(), "big") % BASIS_POINTS


def test_canary_basis_point_is_a_documented_stable_hash() -> None:
    assert basis_point("principal-1", "chat-fast-v1", "salt-2026") == 7828
    for key in ("principal-1", "p-2", ""):
        assert basis_point(key, "chat-fast-v1", "s") == _expected_basis_point(key, "chat-fast-v1", "s")


def test_canary_allocation_is_stable_across_processes() -> None:
    code = (
        "from tollway.routing.strategies import basis_point;"
        "print(basis_point('principal-1', 'chat-fast-v1', 'salt-2026'))"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "7828"


def _canary(salt: str = "salt-2026") -> Canary:
    return Canary(
        alias="chat-fast-v1",
        salt=salt,
        splits=(
            CanarySplit("control", 9000, frozenset({"stable"})),
            CanarySplit("canary", 1000, frozenset({"candidate"})),
        ),
    )


def test_canary_bucket_is_fixed_for_fixed_inputs_and_its_routes_lead() -> None:
    stable, candidate = target("stable"), target("candidate")
    sel = SelectionInput("principal-1", request_id="r1")
    decision = decide([[stable, candidate]], _canary(), sel, random.Random())
    assert decision.bucket == "control"  # 7828 < 9000
    assert [t.route_id for t in decision.targets] == ["stable", "candidate"]
    for r in range(20):
        assert decide([[stable, candidate]], _canary(), sel, random.Random(r)).bucket == "control"


def test_canary_split_proportion_within_binomial_bound() -> None:
    stable, candidate = target("stable"), target("candidate")
    n = 20_000
    counts = Counter(
        decide([[stable, candidate]], _canary(), SelectionInput(f"principal-{i}"), random.Random()).bucket
        for i in range(n)
    )
    # binomial(20000, 0.1): sd ~ 42; the bound is about 5 sd
    assert abs(counts["canary"] - 2000) < 210, counts


def test_canary_falls_back_when_its_bucket_routes_are_unavailable() -> None:
    stable, candidate = target("stable"), target("candidate")
    trip(stable)
    decision = decide([[stable, candidate]], _canary(), SelectionInput("principal-1"), random.Random())
    assert decision.bucket == "control"
    assert [t.route_id for t in decision.targets] == ["candidate"]


def test_canary_splits_must_cover_every_basis_point() -> None:
    with pytest.raises(ValueError):
        Canary("a", "s", (CanarySplit("x", 5000, frozenset()),))


def test_request_keyed_canary_varies_by_request() -> None:
    canary = Canary(
        "chat",
        "s",
        (CanarySplit("a", 5000, frozenset({"x"})), CanarySplit("b", 5000, frozenset({"y"}))),
        key="request",
    )
    buckets = {canary.assign(SelectionInput("same-principal", request_id=f"req-{i}")) for i in range(64)}
    assert buckets == {"a", "b"}
