"""The local ledger on the memory store: atomic reservations, settlement, refresh off the request path,
window rollover, fail-closed denials and give-back."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tollway.governance.leases import (
    Denial,
    DenyReason,
    LeasePolicy,
    Limit,
    LocalLedger,
    Reservation,
    Window,
    cost_budget,
    requests_per_minute,
    tokens_per_minute,
)
from tollway.governance.store import LeaseStoreUnavailable, MemoryLeaseStore

T0 = 1_796_000_000.0
"""2026-11-30T00:53:20Z, for a fake clock."""
POLICY = LeasePolicy(fraction=0.1, low_water=0.5, tick_s=0.01, backoff_s=0.01, wait_s=1.0)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class GatedStore(MemoryLeaseStore):
    """A memory store whose takes wait at a gate, and that can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0
        self.failing = False

    async def take(self, counter_key: str, amount: int, limit: int, expires_at: int | None) -> int:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        if self.failing:
            raise LeaseStoreUnavailable("quota-leases table test: UpdateItem failed: ServiceUnavailable")
        return await super().take(counter_key, amount, limit, expires_at)

    async def give_back(self, counter_key: str, amount: int) -> None:
        if self.failing:
            raise LeaseStoreUnavailable("quota-leases table test: UpdateItem failed: ServiceUnavailable")
        await super().give_back(counter_key, amount)


@pytest.fixture
async def ledger() -> AsyncIterator[LocalLedger]:
    async with LocalLedger(MemoryLeaseStore(), POLICY) as running:
        yield running


def reserved(result: Reservation | Denial) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


async def eventually(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes (the refresher runs on its own task)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def invariant_holds(ledger: LocalLedger) -> bool:
    return all(s.granted == s.remaining + s.reserved + s.spent - s.debt for s in ledger.all_stats())


async def test_concurrent_tasks_on_one_ledger_never_over_grant() -> None:
    store = MemoryLeaseStore()
    budget = cost_budget("tenant:acme", Window.LIFETIME, 1_000)
    rng = random.Random(7)
    async with LocalLedger(store, POLICY) as ledger:

        async def request() -> int:
            r = await ledger.reserve(budget, rng.randint(1, 10))
            if isinstance(r, Denial):
                return 0
            await asyncio.sleep(0)
            used = rng.randint(0, r.amounts[budget])
            ledger.settle(r, used)
            return used

        spent = sum(await asyncio.gather(*(request() for _ in range(400))))
        stats = ledger.stats(budget)
        assert stats is not None and stats.spent == spent
        assert store.counters[budget.key("all")] <= 1_000
        assert spent <= 1_000
        assert invariant_holds(ledger)


async def test_replicas_sharing_a_store_stop_at_the_limit_together() -> None:
    store = MemoryLeaseStore()
    rpm = requests_per_minute("quota-group:openai-tier-primary", 100)
    clock = Clock()
    ledgers = [LocalLedger(store, POLICY, clock=clock) for _ in range(4)]
    results = await asyncio.gather(*(ledgers[i % 4].reserve(rpm, 1) for i in range(300)))
    admitted = [r for r in results if isinstance(r, Reservation)]
    denied = {r.reason for r in results if isinstance(r, Denial)}
    assert len(admitted) <= 100
    assert denied == {DenyReason.BUDGET_EXHAUSTED}
    (key,) = store.counters
    assert store.counters[key] <= 100
    for ledger in ledgers:
        await ledger.aclose()
    assert store.counters[key] == len(admitted)  # every unused lease came back


async def test_settlement_returns_the_unused_part_to_the_local_lease(ledger: LocalLedger) -> None:
    tpm = tokens_per_minute("key:k-1", 1_000)  # lease 100
    r = reserved(await ledger.reserve(tpm, 80))
    before = ledger.stats(tpm)
    assert before is not None and before.reserved == 80
    ledger.settle(r, 30)
    after = ledger.stats(tpm)
    assert after is not None
    assert (after.reserved, after.spent) == (0, 30)
    assert after.remaining == before.remaining + 50
    ledger.settle(r, 999)  # a second settlement changes nothing
    assert ledger.stats(tpm) == after


async def test_overshoot_comes_from_the_remainder_then_becomes_debt_that_blocks_and_is_repaid() -> None:
    store = MemoryLeaseStore()
    budget = cost_budget("tenant:acme", Window.DAY, 1_000)
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        r = reserved(await ledger.reserve(budget, 10))
        stats = ledger.stats(budget)
        assert stats is not None and stats.remaining == 90
        ledger.settle(r, 10 + 90 + 25)  # far above the reservation
        stats = ledger.stats(budget)
        assert stats is not None and (stats.remaining, stats.debt, stats.overshoot) == (0, 25, 115)
        assert not ledger.try_reserve(budget, 1)  # in debt: nothing is admitted
        r2 = reserved(await ledger.reserve(budget, 1))  # the refill repays the debt first
        stats = ledger.stats(budget)
        assert stats is not None and stats.debt == 0
        ledger.settle(r2, 1)
        assert invariant_holds(ledger)


async def test_debt_left_when_the_budget_is_gone_is_the_reported_overshoot() -> None:
    store = MemoryLeaseStore()
    budget = cost_budget("tenant:acme", Window.LIFETIME, 100)
    async with LocalLedger(store, LeasePolicy(fraction=1.0, tick_s=0.01), clock=Clock()) as ledger:
        r = reserved(await ledger.reserve(budget, 100))
        ledger.settle(r, 130)
        denial = await ledger.reserve(budget, 1)
        assert isinstance(denial, Denial) and denial.reason is DenyReason.BUDGET_EXHAUSTED
    stats = ledger.all_stats()
    assert sum(s.spent for s in stats) == 130 == store.counters[budget.key("all")] + ledger.unpaid_overshoot
    assert ledger.unpaid_overshoot == 30


async def test_a_reservation_with_room_never_waits_for_the_store() -> None:
    store = GatedStore()
    tpm = tokens_per_minute("key:k-1", 1_000)  # lease 100, low water 50
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        reserved(await ledger.reserve(tpm, 10))
        takes = store.takes
        store.gate.clear()  # from now on, every take blocks
        for _ in range(8):  # 90 -> 10 remaining, well under the low-water mark
            assert isinstance(ledger.try_reserve(tpm, 10), Reservation)  # synchronous: no await in between
        assert await eventually(lambda: store.waiting == 1)  # the refresher is stuck in a take, off the request path
        assert isinstance(ledger.try_reserve(tpm, 10), Reservation)  # the last 10 of the lease
        pending = ledger.try_reserve(tpm, 10)
        assert isinstance(pending, Denial) and pending.reason is DenyReason.LEASE_PENDING
        store.gate.set()
        reserved(await ledger.reserve(tpm, 10))
        assert store.takes > takes


async def test_the_refresher_tops_up_under_the_low_water_mark() -> None:
    store = MemoryLeaseStore()
    tpm = tokens_per_minute("key:k-1", 1_000)
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        reserved(await ledger.reserve(tpm, 60))  # 40 left of a 100 lease: under the low water
        assert await eventually(lambda: getattr(ledger.stats(tpm), "remaining", 0) >= 100)
        stats = ledger.stats(tpm)
        assert stats is not None and (stats.remaining, stats.granted) == (100, 160)


async def test_fail_closed_once_the_local_lease_is_spent_while_the_store_is_down() -> None:
    store = GatedStore()
    rpm = requests_per_minute("key:k-1", 100)  # lease 10
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        reserved(await ledger.reserve(rpm, 1))
        store.failing = True
        admitted = 1
        for _ in range(20):
            if not isinstance(ledger.try_reserve(rpm, 1), Reservation):
                break
            admitted += 1
        assert admitted <= 10 + 10  # at most what was leased before the failure (one top-up in flight)
        denial = await ledger.reserve(rpm, 1, timeout=0.2)
        assert isinstance(denial, Denial) and denial.reason is DenyReason.STORE_UNAVAILABLE
        assert not ledger.try_reserve(rpm, 1)  # a store known to be down is not waited for
        store.failing = False  # the store is back: the refresher's next retry resumes admission
        results: list[Reservation | Denial] = []

        def admitted_again() -> bool:
            results.append(ledger.try_reserve(rpm, 1))
            return isinstance(results[-1], Reservation)

        assert await eventually(admitted_again)
        ledger.settle(reserved(results[-1]), 1)


async def test_a_store_that_never_answers_fails_closed_within_the_wait() -> None:
    store = GatedStore()
    store.gate.clear()
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        denial = await ledger.reserve(requests_per_minute("key:k-1", 100), 1, timeout=0.05)
        assert isinstance(denial, Denial) and denial.reason is DenyReason.STORE_UNAVAILABLE
        store.gate.set()


async def test_exhausted_and_unavailable_are_different_reasons(ledger: LocalLedger) -> None:
    too_big = await ledger.reserve(cost_budget("tenant:acme", Window.MONTH, 5), 6)
    assert isinstance(too_big, Denial) and too_big.reason is DenyReason.BUDGET_EXHAUSTED
    budget = cost_budget("tenant:acme", Window.MONTH, 5)
    ledger.settle(reserved(await ledger.reserve(budget, 5)), 5)
    gone = await ledger.reserve(budget, 1)
    assert isinstance(gone, Denial) and gone.reason is DenyReason.BUDGET_EXHAUSTED


async def test_reserving_several_counters_is_all_or_nothing(ledger: LocalLedger) -> None:
    rpm = requests_per_minute("key:k-1", 100)
    tight = cost_budget("tenant:acme", Window.DAY, 3)
    reserved(await ledger.reserve_many([(rpm, 1), (tight, 3)]))
    before = ledger.stats(rpm)
    denial = await ledger.reserve_many([(rpm, 1), (tight, 1)])
    assert isinstance(denial, Denial) and denial.limit == tight
    assert ledger.stats(rpm) == before  # nothing was held on the counter that had room


async def test_a_mapping_settles_each_counter_and_missing_ones_keep_their_reservation(ledger: LocalLedger) -> None:
    rpm = requests_per_minute("key:k-1", 100)
    tpm = tokens_per_minute("key:k-1", 10_000)
    r = reserved(await ledger.reserve_many([(rpm, 1), (tpm, 500)]))
    ledger.settle(r, {tpm: 120})
    rpm_stats, tpm_stats = ledger.stats(rpm), ledger.stats(tpm)
    assert rpm_stats is not None and tpm_stats is not None
    assert (rpm_stats.spent, tpm_stats.spent) == (1, 120)


async def test_window_rollover_starts_a_new_counter_and_gives_the_old_lease_back() -> None:
    store = MemoryLeaseStore()
    clock = Clock(T0 - T0 % 60 + 10)
    rpm = requests_per_minute("key:k-1", 100)
    async with LocalLedger(store, POLICY, clock=clock) as ledger:
        first = reserved(await ledger.reserve(rpm, 1))
        old_key = first.holds[0].counter.key
        clock.now += 60
        second = reserved(await ledger.reserve(rpm, 1))
        new_key = second.holds[0].counter.key
        assert new_key != old_key and new_key.startswith(rpm.counter)
        ledger.settle(first, 1)  # settles in the window it was made in
        await ledger.refresh()
        assert store.counters[old_key] == 1  # the rest of the old lease is back
        assert store.expires[old_key] == int(first.holds[0].counter.window_end) + 3_600
        assert [s.key for s in ledger.all_stats()] == [new_key]
        ledger.settle(second, 1)


async def test_close_gives_every_unused_unit_back() -> None:
    store = MemoryLeaseStore()
    budget = cost_budget("tenant:acme", Window.DAY, 10_000)
    ledger = LocalLedger(store, POLICY, clock=Clock())
    ledger.settle(reserved(await ledger.reserve(budget, 40)), 25)
    (key,) = store.counters
    assert store.counters[key] > 25
    await ledger.aclose()
    assert store.counters[key] == 25
    assert invariant_holds(ledger)


async def test_an_idle_lease_is_given_back() -> None:
    store = MemoryLeaseStore()
    rpm = requests_per_minute("key:k-1", 100)
    policy = LeasePolicy(fraction=0.1, tick_s=0.01, idle_give_back_s=0.05)
    async with LocalLedger(store, policy, clock=Clock()) as ledger:
        ledger.settle(reserved(await ledger.reserve(rpm, 1)), 1)
        (key,) = store.counters
        assert await eventually(lambda: store.counters[key] == 1)
        stats = ledger.stats(rpm)
        assert stats is not None and stats.remaining == 0


async def test_a_failed_give_back_is_never_spent_again() -> None:
    store = GatedStore()
    budget = cost_budget("tenant:acme", Window.DAY, 1_000)
    ledger = LocalLedger(store, POLICY, clock=Clock())
    ledger.settle(reserved(await ledger.reserve(budget, 10)), 10)
    store.failing = True
    await ledger.aclose()
    assert all(s.remaining == 0 for s in ledger.all_stats())
    assert invariant_holds(ledger)


def test_try_reserve_works_without_a_running_loop() -> None:
    ledger = LocalLedger(MemoryLeaseStore(), POLICY, clock=Clock())
    denial = ledger.try_reserve(requests_per_minute("key:k-1", 10), 1)
    assert isinstance(denial, Denial) and denial.reason is DenyReason.LEASE_PENDING and not denial
    with pytest.raises(ValueError):
        ledger.try_reserve(requests_per_minute("key:k-1", 10), -1)


def test_a_limit_value_is_not_part_of_the_counter_identity() -> None:
    assert Limit("t", "cost", Window.DAY, 5).counter == Limit("t", "cost", Window.DAY, 6).counter


async def test_units_returned_beyond_one_lease_go_back_to_the_store() -> None:
    store = MemoryLeaseStore()
    tpm = tokens_per_minute("key:k-1", 1_000)  # lease 100
    async with LocalLedger(store, POLICY, clock=Clock()) as ledger:
        big = reserved(await ledger.reserve(tpm, 90))
        assert await eventually(lambda: getattr(ledger.stats(tpm), "remaining", 0) == 100)  # topped up
        ledger.settle(big, 5)  # 85 unused come back: 185 unreserved
        (key,) = store.counters
        assert await eventually(lambda: store.counters[key] == 105)
        stats = ledger.stats(tpm)
        assert stats is not None and (stats.remaining, stats.spent, stats.granted) == (100, 5, 105)
