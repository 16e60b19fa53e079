"""Hard limits and budgets across replicas: leases taken from a shared store, spent from local counters.

The model
---------
Every limit (a cost budget per day, tokens per minute, ...) is a global counter in the
:class:`~tollway.governance.store.LeaseStore`, one per scope and window::

    budget#<scope>#<metric>#<window>#<window id>     budget#tenant:acme#cost#day#2026-11-29

A replica does not touch that counter per request. Its :class:`LocalLedger` takes a *lease* (a
block of units, at most :meth:`LeasePolicy.lease_size`) with one conditional update, and admission
then spends from the lease's local remainder in :meth:`LocalLedger.try_reserve`: plain arithmetic
on the event loop, with no await, so concurrent requests on one replica cannot interleave inside a
reservation. A background refresher tops the lease up when the remainder drops under the low-water
mark, so a request with room never waits for the store. :meth:`LocalLedger.settle` returns a
reservation's unused part to the remainder, or charges what went over it.

The bound
---------
Per window and counter, with ``L`` its limit:

* **Total granted ≤ L, always.** A take is ``ADD granted :n`` conditioned on ``granted <= L - n``
  (the remainder on a second try); a give-back only lowers ``granted``. Each replica's own tally
  of what it holds is never above what the store counted for it: a take whose answer was lost
  counts in the store but not locally (units lost, never over-granted), and a give-back is
  attempted once and its units are forgotten even when it fails, so no unit is both given back
  and kept. Every reservation is carved out of granted units, so **admission never goes past L**.
* **Total settled spend ≤ L + Σ_r D_r**, where ``D_r`` is replica ``r``'s unpaid overshoot: the
  part of its settlements above their reservations (``actual - reserved``) that neither its lease
  remainder nor a later grant in the same window covered. In each replica's books
  ``granted = remaining + reserved + spent - debt`` holds exactly, so summed over replicas and
  with every lease given back, ``settled = store counter + Σ_r D_r ≤ L + Σ_r D_r``.
* **D_r is bounded by what was in flight, not by time.** An overshoot is charged first to the
  replica's lease remainder (units already granted), and the rest becomes debt that the next grant
  repays before anything else. A replica with debt admits nothing on that counter. So debt only
  comes from reservations already admitted when the counter ran dry, and all of those were carved
  from this replica's lease: ``D_r ≤ Σ (actual - reserved)`` over at most one lease's worth of
  reservations. When admission reserves the worst case (input plus ``max_tokens``; cost at the
  pricing snapshot's rates) actual never exceeds reserved, ``D_r = 0`` and settled spend ≤ L
  exactly: tighter than the "one lease per replica" over-run of lease schemes that add first and
  check afterwards, which this design never has.

The price is paid the other way: units leased to a replica that no longer needs them are
*stranded* until it gives them back (at window end, after ``leaseIdleGiveBackS`` without use, or on
shutdown), so another replica may be denied while at most one lease per other replica sits idle.
A replica that dies without giving back strands its lease until the window ends (for a lifetime
counter, until an operator lowers ``granted``). Keep the lease a small fraction of the limit.

Refills and waiting
-------------------
Each counter has at most one call to the store in flight (``busy``). A request that the remainder
cannot cover starts that counter's refill at once, unless one is already in flight, and the refill
asks for enough to bring the remainder up to one lease, or up to what every request waiting on the
counter needs when that is more (``want``, ``waiting``). It is sent on the loop's next turn, so
every request already runnable when it starts is counted in it, and requests arriving while it is
in flight are counted in the next one: a burst costs about one store call per counter per round
trip it lasts, however many requests it holds. Units asked for waiting requests are reserved by
them at once, so the unreserved remainder still stays within one lease (the refresher trims what
settlements, or waiters that left, push above it). A request on several counters waits on all the
short ones at once.

:meth:`LocalLedger.reserve` waits on the counter's ``filled`` event, which every call to the store
for it sets when it ends, and tries again. It stops at its deadline, and only there: a wake-up
that leaves it short (others took the units first, the grant went to earlier waiters) just makes
it wait again for the next refill.

Fail closed
-----------
A reservation that the local remainder cannot cover fails with a :class:`Denial` whose
:class:`DenyReason` tells why: ``budget exhausted`` (the store granted less than asked, so the
counter is at its limit; or the amount exceeds the limit), ``store unavailable`` (the last call to
the store failed: nothing is admitted on credit), or, from the synchronous path only, ``lease
pending`` (a refill is in flight and has not answered). :meth:`LocalLedger.reserve` waits for the
pending lease until its deadline and turns one that does not come into ``store unavailable``;
exhaustion and a failed store end the wait as soon as the refill says so.

Windows
-------
UTC calendar windows from an injectable clock: ``minute`` (``2026-11-29T18:56``), ``day``
(``2026-11-29``), ``month`` (``2026-11``) and ``lifetime`` (``all``). Requests and tokens per
minute are counters in the minute window, with the same machinery. A window's counter item expires
(TTL ``expiresAt``) a retention period after the window ends; a lifetime counter never does.
Reservations made in a window settle in that window even when they finish after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tollway.governance.store.base import LeaseStore, LeaseStoreUnavailable

__all__ = [
    "CounterStats",
    "Denial",
    "DenyReason",
    "LeasePolicy",
    "Limit",
    "LocalLedger",
    "Reservation",
    "Window",
    "cost_budget",
    "requests_per_minute",
    "tokens_per_minute",
    "window_of",
]

log = logging.getLogger("tollway.governance.leases")

_DRAIN_TRIES: Final = 3
"""Attempts to repay a closed window's debt before it is booked as unpaid overshoot."""


class Window(StrEnum):
    MINUTE = "minute"
    DAY = "day"
    MONTH = "month"
    LIFETIME = "lifetime"


_RETENTION_S: Final = {Window.MINUTE: 3_600, Window.DAY: 7 * 86_400, Window.MONTH: 400 * 86_400}
"""How long a closed window's counter item stays readable (usage views, reconciliation)."""


def window_of(window: Window, now: float) -> tuple[str, float]:
    """The id of the UTC window holding epoch second ``now``, and when it ends (``inf`` for lifetime)."""
    if window is Window.LIFETIME:
        return "all", math.inf
    t = datetime.fromtimestamp(now, UTC)
    if window is Window.MINUTE:
        return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}", (now // 60 + 1) * 60
    if window is Window.DAY:
        return f"{t.year:04d}-{t.month:02d}-{t.day:02d}", (now // 86_400 + 1) * 86_400
    following = datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=UTC)
    return f"{t.year:04d}-{t.month:02d}", following.timestamp()


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``limit`` units of ``metric`` per ``window`` for ``scope``.

    ``scope`` names who is limited (``tenant:acme``, ``key:k-1``, ``quota-group:openai-tier-primary``),
    ``metric`` the unit (``requests``, ``tokens``, ``cost`` in integer micro-units of currency).
    """

    scope: str
    metric: str
    window: Window
    limit: int

    def __post_init__(self) -> None:
        for name, value in (("scope", self.scope), ("metric", self.metric)):
            if not value or "#" in value or len(value) > 512:
                raise ValueError(f"{name} must be 1-512 characters without '#'")
        if self.limit < 0:
            raise ValueError("limit must not be negative")

    @property
    def counter(self) -> str:
        """The counter's name without its window id."""
        return f"budget#{self.scope}#{self.metric}#{self.window.value}"

    def key(self, window_id: str) -> str:
        """The store key of the counter in window ``window_id``."""
        return f"{self.counter}#{window_id}"


def requests_per_minute(scope: str, limit: int) -> Limit:
    return Limit(scope, "requests", Window.MINUTE, limit)


def tokens_per_minute(scope: str, limit: int) -> Limit:
    return Limit(scope, "tokens", Window.MINUTE, limit)


def cost_budget(scope: str, window: Window, micros: int) -> Limit:
    """A cost budget in micro-units of currency (1 USD = 1,000,000), so counters stay exact integers."""
    return Limit(scope, "cost", window, micros)


class LeasePolicy(BaseModel):
    """How big a lease is and when it is refreshed. Field docs give the ``llm-router.yml`` key."""

    model_config = ConfigDict(frozen=True)

    fraction: float = Field(default=0.02, gt=0, le=1)
    """``leaseFraction``: a lease is this share of the limit..."""
    min_units: int = Field(default=1, ge=1)
    """``leaseMinUnits``: ...but at least this many units..."""
    max_units: int | None = Field(default=None, ge=1)
    """``leaseMaxUnits``: ...and at most this many (and never more than the limit)."""
    low_water: float = Field(default=0.5, ge=0, lt=1)
    """``leaseLowWater``: refresh when the remainder drops under this share of a lease."""
    tick_s: float = Field(default=1.0, gt=0, le=60)
    """``leaseTickS``: how often the refresher looks at idle counters and closed windows."""
    exhausted_retry_s: float = Field(default=5.0, gt=0, le=3_600)
    """``leaseExhaustedRetryS``: how long after a short grant to ask again (others may give back)."""
    backoff_s: float = Field(default=0.2, gt=0, le=60)
    """``leaseBackoffS``: first retry delay after a store failure, doubling up to ``backoff_max_s``."""
    backoff_max_s: float = Field(default=5.0, gt=0, le=300)
    idle_give_back_s: float | None = Field(default=300.0, gt=0)
    """``leaseIdleGiveBackS``: give an unused lease back after this long without a reservation."""
    wait_s: float = Field(default=1.0, ge=0, le=30)
    """``leaseWaitS``: how long :meth:`LocalLedger.reserve` waits for a lease before failing closed."""

    def lease_size(self, limit: int) -> int:
        size = max(self.min_units, math.ceil(limit * self.fraction))
        if self.max_units is not None:
            size = min(size, self.max_units)
        return min(size, limit)


class DenyReason(StrEnum):
    BUDGET_EXHAUSTED = "budget exhausted"
    STORE_UNAVAILABLE = "store unavailable"
    LEASE_PENDING = "lease pending"
    """Only from :meth:`LocalLedger.try_reserve`: no lease yet, and the store has not said no."""


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a reservation failed, and on which limit. Falsy, so ``if ledger.try_reserve(...)`` reads well."""

    reason: DenyReason
    limit: Limit

    def __bool__(self) -> bool:
        return False


class _Counter:
    """One counter in one window, as this replica sees it.

    ``granted == remaining + reserved + spent - debt`` holds after every synchronous step.
    """

    __slots__ = (
        "busy",
        "debt",
        "drains",
        "exhausted",
        "exhausted_until",
        "expires_at",
        "failures",
        "filled",
        "granted",
        "inflight",
        "key",
        "last_used",
        "lease",
        "limit",
        "overshoot",
        "remaining",
        "reserved",
        "retry_at",
        "spent",
        "unavailable",
        "waiting",
        "want",
        "window_end",
    )

    def __init__(self, key: str, limit: int, lease: int, window_end: float, expires_at: int | None) -> None:
        self.key = key
        self.limit = limit
        self.lease = lease
        self.window_end = window_end
        self.expires_at = expires_at
        self.granted = self.remaining = self.reserved = self.spent = self.debt = self.overshoot = 0
        self.want = self.waiting = self.inflight = self.failures = self.drains = 0
        """``want``: the largest amount refused since the last refill; ``waiting``: the sum of the
        amounts :meth:`LocalLedger.reserve` calls are waiting for on this counter."""
        self.exhausted = self.unavailable = False
        self.exhausted_until = self.retry_at = 0.0
        self.last_used = time.monotonic()
        self.filled = asyncio.Event()
        """Set (and replaced) when a call to the store for this counter ends."""
        self.busy = False
        """A call to the store for this counter is in flight (at most one is)."""

    def notify(self) -> None:
        done, self.filled = self.filled, asyncio.Event()
        done.set()

    def failed(self, policy: LeasePolicy) -> None:
        self.unavailable = True
        self.failures += 1
        delay = min(policy.backoff_max_s, policy.backoff_s * 2 ** min(self.failures - 1, 16))
        self.retry_at = time.monotonic() + delay


@dataclass(frozen=True, slots=True)
class _Hold:
    limit: Limit
    counter: _Counter
    amount: int

    def short(self) -> bool:
        """The counter's remainder cannot cover this hold now (or the counter is in debt)."""
        return bool(self.counter.debt) or self.counter.remaining < self.amount


class Reservation:
    """Units held for one request on one or more counters, until :meth:`LocalLedger.settle`."""

    __slots__ = ("holds", "settled")

    def __init__(self, holds: tuple[_Hold, ...]) -> None:
        self.holds = holds
        self.settled = False

    @property
    def amounts(self) -> dict[Limit, int]:
        return {h.limit: h.amount for h in self.holds}

    def __repr__(self) -> str:
        held = ", ".join(f"{h.counter.key}={h.amount}" for h in self.holds)
        return f"Reservation({held}{', settled' if self.settled else ''})"


@dataclass(frozen=True, slots=True)
class CounterStats:
    key: str
    limit: int
    granted: int
    """Units this replica holds from the store (taken minus given back)."""
    remaining: int
    reserved: int
    spent: int
    """Settled spend."""
    debt: int
    """Overshoot not yet covered by granted units."""
    overshoot: int
    """All settlement above reservation, covered or not."""
    exhausted: bool
    unavailable: bool
    waiting: int = 0
    """Units that :meth:`LocalLedger.reserve` calls are waiting for on this counter."""


def _stats(c: _Counter) -> CounterStats:
    return CounterStats(
        c.key,
        c.limit,
        c.granted,
        c.remaining,
        c.reserved,
        c.spent,
        c.debt,
        c.overshoot,
        c.exhausted,
        c.unavailable,
        c.waiting,
    )


class LocalLedger:
    """One replica's counters: synchronous reservations, settlement, and the lease refresher.

    Use it from one event loop. ``clock`` gives epoch seconds and decides the window; retries and
    idleness use the monotonic clock.
    """

    def __init__(
        self, store: LeaseStore, policy: LeasePolicy | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.policy = policy or LeasePolicy()
        self._clock = clock
        self._counters: dict[str, _Counter] = {}
        """``Limit.counter`` → the counter of the current window."""
        self._retired: list[_Counter] = []
        """Closed windows still holding units, reservations or debt."""
        self._pruned_debt = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        """Calls to the store in flight, one at most per counter."""
        self._closing = False
        self.on_wait: Callable[[str, float], None] | None = None
        """Told of each reservation that had to wait for a lease: its outcome (``granted``,
        ``denied``, ``timed_out``) and how long it waited (the runtime's metrics)."""

    def now(self) -> float:
        """The ledger's clock (epoch seconds): what decides the window."""
        return self._clock()

    # ------------------------------------------------------------ request path (synchronous)

    def try_reserve(self, limit: Limit, amount: int) -> Reservation | Denial:
        """Reserve ``amount`` units of ``limit`` from the local lease, or say why not. Never awaits."""
        return self.try_reserve_many(((limit, amount),))

    def try_reserve_many(self, charges: Iterable[tuple[Limit, int]]) -> Reservation | Denial:
        """Reserve on every counter or on none (a request's RPM, TPM and budgets together). Never awaits.

        A counter that cannot cover its part starts its refill; ``lease pending`` is returned only
        when every short counter is waiting for one (any other reason wins, and nothing waits for it).
        """
        return self._try(self._holds(charges))

    def _holds(self, charges: Iterable[tuple[Limit, int]]) -> tuple[_Hold, ...]:
        now = self._clock()
        merged: dict[str, _Hold] = {}
        for limit, amount in charges:
            if amount < 0:
                raise ValueError("a reservation amount must not be negative")
            same = merged.get(limit.counter)
            if same is None:
                merged[limit.counter] = _Hold(limit, self._current(limit, now), amount)
            else:
                merged[limit.counter] = _Hold(same.limit, same.counter, same.amount + amount)
        return tuple(merged.values())

    def _try(self, holds: tuple[_Hold, ...]) -> Reservation | Denial:
        pending: Denial | None = None
        for h in holds:
            if h.short():
                c = h.counter
                if h.amount <= c.limit:
                    c.want = max(c.want, h.amount)
                self._kick(c)
                reason = self._reason(c, h.amount)
                if reason is not DenyReason.LEASE_PENDING:
                    return Denial(reason, h.limit)
                pending = pending or Denial(reason, h.limit)
        if pending is not None:
            return pending
        mono = time.monotonic()
        for h in holds:
            c = h.counter
            c.remaining -= h.amount
            c.reserved += h.amount
            c.inflight += 1
            c.last_used = mono
            if c.remaining < c.lease * self.policy.low_water:
                self._kick(c)
        return Reservation(holds)

    def settle(self, reservation: Reservation, actual: int | Mapping[Limit, int]) -> None:
        """Charge what the request really used; return the unused part of the reservation to the lease.

        ``actual`` is one amount for every counter, or one per :class:`Limit`; a limit missing from
        the mapping keeps its reserved amount (a conservative charge). Above the reservation, the
        excess comes out of the lease remainder, and what that cannot cover becomes debt. Settling
        twice does nothing the second time.
        """
        if reservation.settled:
            return
        charges = []
        for h in reservation.holds:
            used = actual if isinstance(actual, int) else actual.get(h.limit, h.amount)
            if used < 0:
                raise ValueError("an actual amount must not be negative")
            charges.append((h, used))
        reservation.settled = True
        for h, used in charges:
            c = h.counter
            c.reserved -= h.amount
            c.inflight -= 1
            c.spent += used
            if used <= h.amount:
                c.remaining += h.amount - used
                continue
            extra = used - h.amount
            covered = min(extra, c.remaining)
            c.remaining -= covered
            c.debt += extra - covered
            c.overshoot += extra
            if c.debt:
                self._kick(c)

    def release(self, reservation: Reservation) -> None:
        """Settle at zero: the request never reached a provider."""
        self.settle(reservation, 0)

    def _current(self, limit: Limit, now: float) -> _Counter:
        c = self._counters.get(limit.counter)
        if c is not None and now < c.window_end:
            if c.limit != limit.limit:
                c.limit, c.lease = limit.limit, self.policy.lease_size(limit.limit)
            return c
        if c is not None:
            self._retired.append(c)
        window_id, end = window_of(limit.window, now)
        expires = None if limit.window is Window.LIFETIME else int(end) + _RETENTION_S[limit.window]
        c = _Counter(limit.key(window_id), limit.limit, self.policy.lease_size(limit.limit), end, expires)
        self._counters[limit.counter] = c
        self._wake_refresher()
        return c

    @staticmethod
    def _reason(c: _Counter, amount: int) -> DenyReason:
        if amount > c.limit:
            return DenyReason.BUDGET_EXHAUSTED
        if c.unavailable:
            return DenyReason.STORE_UNAVAILABLE
        if c.exhausted:
            return DenyReason.BUDGET_EXHAUSTED
        return DenyReason.LEASE_PENDING

    def _wake_refresher(self) -> None:
        self._wake.set()
        if self._task is None and not self._closing:
            with contextlib.suppress(RuntimeError):  # no running loop: the caller starts it later
                self.start()

    def _kick(self, c: _Counter) -> None:
        """Start ``c``'s refill now if it is due and none is in flight; otherwise do nothing.

        The refill runs as its own task from the loop's next turn, so neither the request that
        kicks it nor a slow call for another counter holds it up, and every request that comes up
        short before it starts is counted in its amount.
        """
        if c.busy or self._closing or not self._due(c, time.monotonic()):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop: the refresher does it once started
            return
        if self._task is None:
            self.start()
        self._launch(c, self._refill(c))

    def _launch(self, c: _Counter, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run one call to the store for ``c`` as a task; ``busy`` is set before anything else can look."""
        c.busy = True
        task = asyncio.get_running_loop().create_task(job)
        self._jobs.add(task)
        task.add_done_callback(self._job_done)
        return task

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("lease refresh step failed", exc_info=exc)

    # ------------------------------------------------------------ request path (waiting for a lease)

    async def reserve(self, limit: Limit, amount: int, *, timeout: float | None = None) -> Reservation | Denial:
        return await self.reserve_many(((limit, amount),), timeout=timeout)

    async def reserve_many(
        self, charges: Iterable[tuple[Limit, int]], *, timeout: float | None = None
    ) -> Reservation | Denial:
        """:meth:`try_reserve_many`, waiting up to ``timeout`` (``LeasePolicy.wait_s``) for a pending lease.

        While it waits, its amount counts in the refill of every counter it is short on. It tries
        again after each call to the store for the first of them ends, as often as that takes:
        only the deadline turns ``lease pending`` into ``store unavailable``, and a refill that
        finds the counter at its limit or the store failing ends the wait with that reason.
        """
        charges = tuple(charges)
        started = time.monotonic()
        deadline = started + (self.policy.wait_s if timeout is None else timeout)
        waited = False
        while True:
            holds = self._holds(charges)  # again each time: the window may have moved on
            result = self._try(holds)
            if not isinstance(result, Denial) or result.reason is not DenyReason.LEASE_PENDING:
                if waited and self.on_wait is not None:
                    self.on_wait("granted" if not isinstance(result, Denial) else "denied", time.monotonic() - started)
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                if self.on_wait is not None:
                    self.on_wait("timed_out", time.monotonic() - started)
                return Denial(DenyReason.STORE_UNAVAILABLE, result.limit)
            waited = True
            short = [h for h in holds if h.short()]
            for h in short:
                h.counter.waiting += h.amount
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(short[0].counter.filled.wait(), left)
            finally:
                for h in short:
                    h.counter.waiting -= h.amount

    # ------------------------------------------------------------ the refresher

    def start(self) -> None:
        """Start the refresher on the running loop (done on first use when a loop is running)."""
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tollway-lease-refresher")

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.policy.tick_s)
            self._wake.clear()
            if self._closing:
                break
            try:
                await self.refresh()
            except Exception:
                log.exception("lease refresh failed")

    async def refresh(self) -> None:
        """One pass: retire closed windows, top up low leases, repay debt, give back idle and closed leases.

        Settlements that used less than they reserved can leave more than a lease unreserved; the
        pass trims that back to one lease, so what a replica strands stays near one lease.
        """
        now, mono = self._clock(), time.monotonic()
        idle = self.policy.idle_give_back_s
        for name, c in list(self._counters.items()):
            if now >= c.window_end:
                del self._counters[name]
                self._retired.append(c)
        jobs = []
        for c in self._counters.values():
            if self._due(c, mono):
                jobs.append(self._launch(c, self._refill(c)))
            elif (
                idle is not None
                and c.remaining
                and not (c.busy or c.inflight or c.debt or c.waiting)
                and mono - c.last_used >= idle
                and mono >= c.retry_at
            ):
                jobs.append(self._launch(c, self._drain(c)))
            elif c.remaining > c.lease + c.waiting and not c.busy and mono >= c.retry_at:
                jobs.append(self._launch(c, self._drain(c, keep=c.lease + c.waiting)))
        for c in self._retired:
            if not c.busy and mono >= c.retry_at and (c.remaining or c.debt):
                jobs.append(self._launch(c, self._drain(c)))
        if jobs:
            await asyncio.wait(jobs)  # each job logs its own failure (_job_done)
        self._prune()

    def _due(self, c: _Counter, mono: float) -> bool:
        if c.busy or mono < c.retry_at or (c.exhausted and mono < c.exhausted_until):
            return False
        if c.debt or max(c.want, c.waiting) > c.remaining:
            return True
        idle = self.policy.idle_give_back_s
        recent = idle is None or mono - c.last_used < idle
        return recent and c.remaining < c.lease * self.policy.low_water

    async def _refill(self, c: _Counter) -> None:
        """Top the remainder up to one lease, or to what the waiting requests need if that is more,
        and repay debt first; a grant short of the ask means the counter is at its limit."""
        c.busy = True
        want = min(max(max(c.lease, c.want, c.waiting) - c.remaining, 0) + c.debt, c.limit)
        try:
            if want <= 0:  # a zero limit, or settlements have filled the remainder since the kick
                return
            got = await self.store.take(c.key, want, c.limit, c.expires_at)
        except LeaseStoreUnavailable as exc:
            log.warning("lease refresh of %s failed: %s", c.key, exc)
            c.failed(self.policy)
        else:
            c.unavailable, c.failures = False, 0
            c.granted += got
            paid = min(got, c.debt)
            c.debt -= paid
            c.remaining += got - paid
            c.exhausted = got < want
            c.exhausted_until = time.monotonic() + self.policy.exhausted_retry_s
            c.want = 0
        finally:
            c.busy = False
            c.notify()

    async def _drain(self, c: _Counter, keep: int = 0) -> None:
        """Repay a closed window's debt if the store has room, then give back the remainder beyond ``keep``.

        A give-back is attempted once: its units are dropped from ``granted`` even when the call
        fails, because a decrement whose answer was lost may have happened, and units that may
        already be back in the store must never be spent here again.
        """
        c.busy = True
        c.drains += 1
        try:
            if c.debt and c.window_end <= self._clock():
                got = await self.store.take(c.key, c.debt, c.limit, c.expires_at)
                c.granted += got
                c.debt -= got
            units = max(0, c.remaining - keep)
            c.remaining -= units
            c.granted -= units
            if units:
                await self.store.give_back(c.key, units)
        except LeaseStoreUnavailable as exc:
            log.warning("lease give-back of %s failed: %s", c.key, exc)
            c.failed(self.policy)
        finally:
            c.busy = False
            c.notify()

    def _prune(self) -> None:
        kept = []
        for c in self._retired:
            if c.busy or c.inflight or c.remaining or (c.debt and c.drains < _DRAIN_TRIES):
                kept.append(c)
            else:
                self._pruned_debt += c.debt
        self._retired = kept

    # ------------------------------------------------------------ lifecycle and views

    async def aclose(self, timeout: float = 5.0) -> None:
        """Stop the refresher and give every lease back (settle in-flight requests first)."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, timeout)
            except TimeoutError:
                log.warning("lease refresher did not stop in %.1f s", timeout)
        if self._jobs:
            await asyncio.wait(set(self._jobs), timeout=timeout)  # let calls in flight land before giving back
        self._retired.extend(self._counters.values())
        self._counters.clear()
        now = self._clock()
        for c in self._retired:
            c.window_end = min(c.window_end, now)
        drains = [self._drain(c) for c in self._retired if not c.busy and (c.remaining or c.debt)]
        if drains:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*drains, return_exceptions=True), timeout)

    async def __aenter__(self) -> LocalLedger:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def stats(self, limit: Limit) -> CounterStats | None:
        """The current window's counter of ``limit``, as this replica sees it."""
        c = self._counters.get(limit.counter)
        return None if c is None else _stats(c)

    @property
    def unpaid_overshoot(self) -> int:
        """Settled spend above reservations that no granted unit covers (yet): ``D_r`` of the bound."""
        return self._pruned_debt + sum(c.debt for c in (*self._counters.values(), *self._retired))

    def all_stats(self) -> list[CounterStats]:
        """Every counter this replica holds, closed windows included."""
        return [_stats(c) for c in (*self._counters.values(), *self._retired)]
