"""Admission and settlement of one request's tokens and cost, against the root's compiled policy.

``Governor.admit`` runs after the body is parsed and before any provider work: it reserves one
request, the input estimate plus the maximum output in tokens, and the worst-case cost of those
at the root's pricing, on every limit the key's policy for the alias holds, all or nothing, from
the replica's :class:`LocalLedger`. ``Governor.take_capacity`` reserves a target's quota-group
RPM/TPM before each dispatch. ``Governor.settle`` charges what the request really used once it
ends, on every path.

A request whose key has no policy (and a target with no quota group limits) costs one dict
lookup: governance that is not configured is compiled out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from tollway.canonical import Usage, UsageEvidence
from tollway.exceptions import BudgetExceeded, BudgetUnavailable, GatewayError, ModelUnavailable, RateLimited
from tollway.governance.leases import Denial, DenyReason, Limit, LocalLedger, Reservation, Window, window_of
from tollway.governance.policy import NO_POLICY, GovernanceSnapshot, PricingView, RequestPolicy
from tollway.pricing import Cost, price

__all__ = ["Admitted", "CostRecord", "Governor"]

CostEvidence = Literal["provider-reported", "local-estimate", "reservation", "unknown"]


@dataclass(slots=True)
class Admitted:
    """One request's governance state, from admission to settlement."""

    policy: RequestPolicy
    reservation: Reservation | None
    tokens: int
    """Tokens reserved: the input estimate plus the maximum output."""
    cost: int | None
    """Micro-USD reserved (``None``: no cost budget applies)."""
    concurrency: tuple[str, ...] = ()
    stream: bool = False
    capacity: list[Reservation] = field(default_factory=list)
    settled: bool = False


@dataclass(frozen=True, slots=True)
class CostRecord:
    """What the audit trail records of a request's cost."""

    micro_usd: int | None
    pricing_version: str | None
    tier: str | None
    evidence: CostEvidence


def _retry_after(limit: Limit, now: float) -> float | None:
    if limit.window is Window.LIFETIME:
        return None
    _, end = window_of(limit.window, now)
    return max(1.0, math.ceil(end - now))


class Governor:
    """One per process: the ledger, and per-process concurrency counters per scope."""

    def __init__(self, ledger: LocalLedger) -> None:
        self.ledger = ledger
        self._inflight: dict[str, list[int]] = {}

    # -------------------------------------------------------------- admission

    async def admit(
        self,
        governance: GovernanceSnapshot,
        pricing: PricingView,
        key_id: str,
        alias: str,
        *,
        input_tokens: int,
        max_output_tokens: int,
        stream: bool,
    ) -> Admitted | None:
        policy = governance.policy(key_id, alias)
        if policy is NO_POLICY:
            return None
        tokens = input_tokens + max_output_tokens
        cost: int | None = None
        charges: list[tuple[Limit, int]] = [(lim, 1) for lim in policy.requests]
        charges += [(lim, tokens) for lim in policy.tokens]
        if policy.cost:
            rates = pricing.aliases.get(alias)
            cost = rates.reservation(input_tokens, max_output_tokens) if rates is not None else None
            if cost is None:
                raise ModelUnavailable(
                    "This model's price is unknown and a cost budget applies to you: the request is refused "
                    "rather than counted as free."
                )
            charges += [(lim, cost) for lim in policy.cost]
        scopes = self._enter(policy, stream)
        try:
            reservation: Reservation | None = None
            if charges:
                got = self.ledger.try_reserve_many(charges)
                if isinstance(got, Denial) and got.reason is DenyReason.LEASE_PENDING:
                    got = await self.ledger.reserve_many(charges, timeout=governance.lease_wait_s)
                if isinstance(got, Denial):
                    raise self._denied(got)
                reservation = got
        except BaseException:
            self._leave(scopes, stream)
            raise
        return Admitted(policy, reservation, tokens, cost, scopes, stream)

    def _enter(self, policy: RequestPolicy, stream: bool) -> tuple[str, ...]:
        taken: list[str] = []
        for scope, max_requests, max_streams in policy.concurrency:
            counts = self._inflight.setdefault(scope, [0, 0])
            if (max_requests is not None and counts[0] >= max_requests) or (
                stream and max_streams is not None and counts[1] >= max_streams
            ):
                self._leave(tuple(taken), stream)
                raise RateLimited("Too many concurrent requests for this scope. Retry shortly.", retry_after=1)
            counts[0] += 1
            counts[1] += stream
            taken.append(scope)
        return tuple(taken)

    def _leave(self, scopes: tuple[str, ...], stream: bool) -> None:
        for scope in scopes:
            counts = self._inflight[scope]
            counts[0] -= 1
            counts[1] -= stream

    def _denied(self, denial: Denial) -> GatewayError:
        limit = denial.limit
        if denial.reason is DenyReason.STORE_UNAVAILABLE:
            return BudgetUnavailable(retry_after=1)
        retry_after = _retry_after(limit, self.ledger.now())
        if limit.metric == "cost":
            window = "in total" if limit.window is Window.LIFETIME else f"for this {limit.window.value}"
            return BudgetExceeded(f"The cost budget of this scope is exhausted {window}.", retry_after=retry_after)
        return RateLimited(
            f"The {limit.metric}-per-minute limit of this scope is reached. Retry later.", retry_after=retry_after
        )

    async def take_capacity(
        self, admitted: Admitted | None, capacity: tuple[Limit, ...], tokens: int, wait_s: float
    ) -> bool:
        """Reserve a quota group's RPM/TPM for one dispatch; ``False`` when the group is at its limit
        or its lease cannot be had in ``wait_s``, and the target is skipped."""
        charges = [(lim, 1 if lim.metric == "requests" else tokens) for lim in capacity]
        got = self.ledger.try_reserve_many(charges)
        if isinstance(got, Denial) and got.reason is DenyReason.LEASE_PENDING:
            got = await self.ledger.reserve_many(charges, timeout=wait_s)
        if isinstance(got, Denial):
            return False
        if admitted is not None:
            admitted.capacity.append(got)
        else:  # no request policy: requests always count, tokens are the conservative estimate
            self.ledger.settle(got, dict(charges))
        return True

    # -------------------------------------------------------------- settlement

    def settle(
        self,
        admitted: Admitted | None,
        pricing: PricingView,
        route_id: str | None,
        usage: Usage | None,
        dispatched: bool,
    ) -> CostRecord:
        """Charge what the request used, once.

        With provider-reported usage, that usage at the root's prices. Without it, ``dispatched``
        says whether a provider may have done billable work (an answer, a timeout, a cancellation,
        a stream cut midway): then the reservation is kept as a conservative charge and the record
        says so; otherwise (refused before dispatch, or every provider answered with an error
        status) nothing is charged but the request itself.
        """
        record = self.cost_of(pricing, route_id, usage)
        if admitted is None or admitted.settled:
            return record
        admitted.settled = True
        self._leave(admitted.concurrency, admitted.stream)
        reported = usage is not None and usage.evidence is UsageEvidence.PROVIDER_REPORTED
        actual: dict[Limit, int] = {}
        policy = admitted.policy
        for lim in policy.requests:
            actual[lim] = 1
        for lim in policy.tokens:
            actual[lim] = (
                usage.total_tokens if reported and usage is not None else (admitted.tokens if dispatched else 0)
            )
        for lim in policy.cost:
            if not dispatched:
                actual[lim] = 0
            elif reported and record.micro_usd is not None:
                actual[lim] = record.micro_usd
            else:
                actual[lim] = admitted.cost or 0  # no authoritative usage: keep the conservative charge
        if admitted.reservation is not None:
            self.ledger.settle(admitted.reservation, actual)
        for held in admitted.capacity:
            self.ledger.settle(
                held,
                {
                    h.limit: (1 if h.limit.metric == "requests" else _tokens(usage, reported, h.amount))
                    for h in held.holds
                },
            )
        if policy.cost and dispatched and not (reported and record.micro_usd is not None):
            return CostRecord(admitted.cost, pricing.version, "worst-case", "reservation")
        return record

    @staticmethod
    def cost_of(pricing: PricingView, route_id: str | None, usage: Usage | None) -> CostRecord:
        snapshot = pricing.snapshot
        if snapshot is None or route_id is None or usage is None:
            return CostRecord(None, pricing.version, None, "unknown")
        rp = pricing.routes.get(route_id)
        if rp is None:
            return CostRecord(None, pricing.version, None, "unknown")
        got = price(snapshot, rp.provider, rp.model, usage, account=rp.account)
        if not isinstance(got, Cost):
            return CostRecord(None, snapshot.version, None, "unknown")
        evidence: CostEvidence = (
            "provider-reported" if usage.evidence is UsageEvidence.PROVIDER_REPORTED else "local-estimate"
        )
        return CostRecord(got.amount_micro_usd, got.pricing_version, got.tier, evidence)


def _tokens(usage: Usage | None, reported: bool, reserved: int) -> int:
    return usage.total_tokens if reported and usage is not None else reserved
