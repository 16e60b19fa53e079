"""The lease store: one global counter per scope and window, granted from atomically, never past its limit.

A counter is identified by its key (``budget#tenant:acme#cost#day#2026-11-29``, built by
:class:`tollway.governance.leases.Limit`) and holds ``granted``: the units handed out to replicas
in that window, net of what they gave back. :meth:`LeaseStore.take` is the only way ``granted``
grows, and it never grows past the ``limit`` of the call; :meth:`LeaseStore.give_back` only
lowers it, and never below zero. So the sum of what every replica holds or has spent from a
counter is at most its limit, whatever the number of replicas and however their calls interleave.
"""

from __future__ import annotations

from typing import Protocol

from tollway.exceptions import TollwayError

__all__ = ["LeaseStore", "LeaseStoreUnavailable"]


class LeaseStoreUnavailable(TollwayError):
    """The store could not be read or written (throttled, unreachable, misconfigured).

    The message names the table, the operation and the error code, never a counter's value.
    Admission fails closed on it once the local lease is spent.
    """


class LeaseStore(Protocol):
    async def take(self, counter_key: str, amount: int, limit: int, expires_at: int | None) -> int:
        """Grant up to ``amount`` units of ``counter_key`` so that its total granted stays ``<= limit``.

        Returns what was granted: ``amount``, the remainder under the limit, or 0. ``expires_at``
        (epoch seconds; ``None`` for a lifetime counter) is when the store may forget the counter.
        Raises :class:`LeaseStoreUnavailable`.
        """
        ...

    async def give_back(self, counter_key: str, amount: int) -> None:
        """Return ``amount`` unused units; a counter never goes below zero. Raises :class:`LeaseStoreUnavailable`.

        Not idempotent: neither the store nor its caller retries a give-back whose outcome is
        unknown (the units are forgotten instead, which can only strand them, never double them).
        """
        ...

    async def granted(self, counter_key: str) -> int:
        """The counter's total granted (0 when it does not exist). Raises :class:`LeaseStoreUnavailable`."""
        ...


def check_take(amount: int, limit: int) -> int:
    """The amount a take may ask for: ``amount`` clamped to ``limit``; ValueError for a negative one."""
    if amount < 0 or limit < 0:
        raise ValueError("amount and limit must not be negative")
    return min(amount, limit)
