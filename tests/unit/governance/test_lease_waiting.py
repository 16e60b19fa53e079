"""Waiting for a lease: refills coalesce every waiting request into one store call per counter, a
waiter waits until its deadline (however many refills go by), and a spent budget ends the wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

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
)
from tollway.governance.store import LeaseStore, MemoryLeaseStore

T0 = 1_796_000_000.0
POLICY = LeasePolicy(fraction=0.01, low_water=0.0, tick_s=0.01, backoff_s=0.01)
"""A lease of 10 on a limit of 1,000, and no top-up under a low-water mark: every store call is one
that waiting requests asked for."""


class SlowStore:
    """A lease store whose takes wait at a gate (open unless a test closes it) and are recorded.

    ``after_grant`` runs on the loop right after a grant lands, before any waiter it wakes: a rival
    request that gets to the new units first.
    """

    def __init__(self) -> None:
        self.inner = MemoryLeaseStore()
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked: list[tuple[str, int]] = []
        self.blocked = 0
        self.after_grant: Callable[[], None] | None = None

    async def take(self, counter_key: str, amount: int, limit: int, expires_at: int | None) -> int:
        self.asked.append((counter_key, amount))
        self.blocked += 1
        try:
            await self.gate.wait()
        finally:
            self.blocked -= 1
        got = await self.inner.take(counter_key, amount, limit, expires_at)
        if self.after_grant is not None:
            asyncio.get_running_loop().call_soon(self.after_grant)
        return got

    async def give_back(self, counter_key: str, amount: int) -> None:
        await self.inner.give_back(counter_key, amount)

    async def granted(self, counter_key: str) -> int:
        return await self.inner.granted(counter_key)


_slow_is_a_store: type[LeaseStore] = SlowStore


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def ledger_on(store: SlowStore) -> LocalLedger:
    return LocalLedger(store, POLICY, clock=lambda: T0)


async def test_a_burst_of_waiters_is_served_by_one_refill() -> None:
    store = SlowStore()
    store.gate.clear()
    rpm = requests_per_minute("tenant:acme", 1_000)
    async with ledger_on(store) as ledger:
        waiters = [asyncio.ensure_future(ledger.reserve(rpm, 1, timeout=30)) for _ in range(200)]
        assert await eventually(lambda: store.blocked == 1)
        store.gate.set()
        results = await asyncio.gather(*waiters)
        assert all(isinstance(r, Reservation) for r in results), {type(r).__name__ for r in results}
        assert [amount for _, amount in store.asked] == [200]  # one call, sized for every waiter


async def test_requests_arriving_while_a_refill_is_in_flight_join_the_next_one() -> None:
    store = SlowStore()
    store.gate.clear()
    rpm = requests_per_minute("tenant:acme", 1_000)
    async with ledger_on(store) as ledger:
        first = asyncio.ensure_future(ledger.reserve(rpm, 1, timeout=30))
        assert await eventually(lambda: store.blocked == 1)
        later = [asyncio.ensure_future(ledger.reserve(rpm, 1, timeout=30)) for _ in range(199)]
        assert await eventually(lambda: getattr(ledger.stats(rpm), "waiting", 0) == 200)
        assert len(store.asked) == 1  # still the one call in flight: nobody started a second
        store.gate.set()
        results = await asyncio.gather(first, *later)
        assert all(isinstance(r, Reservation) for r in results), {type(r).__name__ for r in results}
        assert [amount for _, amount in store.asked] == [10, 190]  # a lease, then everyone who joined


async def test_a_burst_on_several_counters_makes_one_call_per_counter() -> None:
    store = SlowStore()
    store.gate.clear()
    rpm = requests_per_minute("tenant:acme", 1_000)
    budget = cost_budget("tenant:acme", Window.DAY, 100_000)  # lease 1,000
    async with ledger_on(store) as ledger:
        waiters = [asyncio.ensure_future(ledger.reserve_many([(rpm, 1), (budget, 20)], timeout=30)) for _ in range(100)]
        assert await eventually(lambda: store.blocked == 2)  # both counters' refills at once
        store.gate.set()
        results = await asyncio.gather(*waiters)
        assert all(isinstance(r, Reservation) for r in results), {type(r).__name__ for r in results}
        assert sorted(store.asked) == sorted([(rpm.key("2026-11-30T00:53"), 100), (budget.key("2026-11-30"), 2_000)])


def rival_taking_each_refill(
    ledger: LocalLedger, limit: Limit, rivals: list[Reservation | Denial], times: int, then: Callable[[], None]
) -> Callable[[], None]:
    """A store hook: after each grant a rival takes everything left, ``times`` times, then ``then()``."""

    def rival() -> None:
        stats = ledger.stats(limit)
        assert stats is not None
        rivals.append(ledger.try_reserve(limit, stats.remaining))
        if len(rivals) == times:
            then()

    return rival


async def test_a_waiter_keeps_waiting_through_refills_that_others_take_first() -> None:
    store = SlowStore()
    rpm = requests_per_minute("tenant:acme", 1_000)
    rivals: list[Reservation | Denial] = []
    async with ledger_on(store) as ledger:

        def stop() -> None:
            store.after_grant = None

        store.after_grant = rival_taking_each_refill(ledger, rpm, rivals, 12, stop)
        waiter = await ledger.reserve(rpm, 1, timeout=30)
        assert isinstance(waiter, Reservation), waiter
        assert len(rivals) == 12 and all(isinstance(r, Reservation) for r in rivals)
        assert len(store.asked) == 13  # woken by 12 refills that left it short, served by the 13th


async def test_a_waiter_gives_up_at_its_deadline_and_not_before() -> None:
    store = SlowStore()
    rpm = requests_per_minute("tenant:acme", 1_000)
    rivals: list[Reservation | Denial] = []
    async with ledger_on(store) as ledger:
        # After the 12th refill the store stops answering.
        store.after_grant = rival_taking_each_refill(ledger, rpm, rivals, 12, store.gate.clear)
        timeout = 0.3
        started = time.monotonic()
        waiter = await ledger.reserve(rpm, 1, timeout=timeout)
        waited = time.monotonic() - started
        assert isinstance(waiter, Denial) and waiter.reason is DenyReason.STORE_UNAVAILABLE, waiter
        assert len(rivals) == 12
        assert waited >= timeout  # twelve wake-ups did not end the wait: only the deadline did
        store.after_grant = None
        store.gate.set()


async def test_a_spent_budget_fails_every_waiter_at_once_with_budget_exhausted() -> None:
    store = SlowStore()
    budget = cost_budget("tenant:acme", Window.LIFETIME, 1_000)
    store.inner.counters[budget.key("all")] = 1_000 - 55  # other replicas spent the rest
    store.gate.clear()
    async with ledger_on(store) as ledger:
        waiters = [asyncio.ensure_future(ledger.reserve(budget, 1, timeout=30)) for _ in range(100)]
        assert await eventually(lambda: store.blocked == 1)
        store.gate.set()
        results = await asyncio.gather(*waiters)
        served = [r for r in results if isinstance(r, Reservation)]
        reasons = {r.reason for r in results if isinstance(r, Denial)}
        assert len(served) == 55
        assert reasons == {DenyReason.BUDGET_EXHAUSTED}  # told by the one refill, not by a deadline
        assert [amount for _, amount in store.asked] == [100]
        assert store.inner.counters[budget.key("all")] == 1_000
        for r in served:
            ledger.settle(r, 1)
