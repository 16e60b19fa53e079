"""Governor: what admission reserves and what settlement charges, on every ending."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import MappingProxyType

import pytest

from tollway.canonical import Usage, UsageEvidence
from tollway.exceptions import BudgetExceeded, ModelUnavailable, RateLimited
from tollway.governance.leases import LeasePolicy, LocalLedger, Window, cost_budget, requests_per_minute
from tollway.governance.meter import Governor
from tollway.governance.policy import AliasPrice, GovernanceSnapshot, PricingView, RequestPolicy, RoutePrice
from tollway.governance.store import MemoryLeaseStore
from tollway.pricing import ModelPrice, PricingSnapshot, Rates

BUDGET = cost_budget("tenant:t", Window.DAY, 100_000)
RPM = requests_per_minute("tenant:t", 2)


def pricing() -> PricingView:
    snap = PricingSnapshot.build(
        [ModelPrice("openai", "m", Rates(10_000_000, 30_000_000, 10_000_000, 10_000_000, 30_000_000))],
        effective_from=datetime.now(UTC),
    )
    return PricingView(
        snap,
        MappingProxyType({"a": AliasPrice(10_000_000, 30_000_000), "free-unknown": AliasPrice(None, None)}),
        MappingProxyType({"r": RoutePrice("openai", "m", "acct")}),
    )


def governance(policy: RequestPolicy) -> GovernanceSnapshot:
    return GovernanceSnapshot(policies=MappingProxyType({("k", "a"): policy, ("k", "free-unknown"): policy}))


@pytest.fixture
async def governor() -> AsyncIterator[Governor]:
    gov = Governor(LocalLedger(MemoryLeaseStore(), LeasePolicy(fraction=1.0)))
    yield gov
    await gov.ledger.aclose()


async def admit(governor: Governor, policy: RequestPolicy, alias: str = "a") -> object:
    return await governor.admit(
        governance(policy), pricing(), "k", alias, input_tokens=100, max_output_tokens=50, stream=False
    )


@pytest.mark.parametrize(
    ("usage", "billable", "charged", "evidence"),
    [
        # Provider-reported usage is priced: 100*10 + 20*30.
        (Usage(100, 20, evidence=UsageEvidence.PROVIDER_REPORTED), True, 1600, "provider-reported"),
        # A timeout or a cancellation after dispatch: no authoritative usage, the reservation stays.
        (None, True, 100 * 10 + 50 * 30, "reservation"),
        (Usage(0, 7, evidence=UsageEvidence.LOCAL_ESTIMATE), True, 100 * 10 + 50 * 30, "reservation"),
        # Refused before dispatch, or every provider answered with an error status: nothing.
        (None, False, 0, "unknown"),
    ],
)
async def test_settlement_charges_by_the_evidence(
    governor: Governor, usage: Usage | None, billable: bool, charged: int, evidence: str
) -> None:
    policy = RequestPolicy(cost=(BUDGET,))
    admitted = await admit(governor, policy)
    assert admitted is not None
    record = governor.settle(admitted, pricing(), "r", usage, billable)  # type: ignore[arg-type]
    assert record.evidence == evidence
    stats = governor.ledger.stats(BUDGET)
    assert stats is not None
    assert (stats.spent, stats.reserved) == (charged, 0)
    # Settling twice charges nothing more.
    governor.settle(admitted, pricing(), "r", usage, billable)  # type: ignore[arg-type]
    assert governor.ledger.stats(BUDGET).spent == charged  # type: ignore[union-attr]


async def test_a_request_over_the_remaining_budget_is_refused_with_retry_after(governor: Governor) -> None:
    small = cost_budget("tenant:t", Window.DAY, 3000)
    policy = RequestPolicy(cost=(small,))
    await admit(governor, policy)  # reserves 2500 of 3000
    with pytest.raises(BudgetExceeded) as exc:
        await admit(governor, policy)
    assert exc.value.retry_after is not None and 1 <= exc.value.retry_after <= 86_400


async def test_requests_per_minute_refuse_the_third(governor: Governor) -> None:
    policy = RequestPolicy(requests=(RPM,))
    await admit(governor, policy)
    await admit(governor, policy)
    with pytest.raises(RateLimited) as exc:
        await admit(governor, policy)
    assert exc.value.retry_after is not None and 1 <= exc.value.retry_after <= 60


async def test_an_unknown_price_under_a_budget_is_refused(governor: Governor) -> None:
    with pytest.raises(ModelUnavailable):
        await admit(governor, RequestPolicy(cost=(BUDGET,)), alias="free-unknown")


async def test_concurrency_limits_release_on_settlement(governor: Governor) -> None:
    policy = RequestPolicy(concurrency=(("tenant:t", 1, None),))
    first = await admit(governor, policy)
    with pytest.raises(RateLimited):
        await admit(governor, policy)
    governor.settle(first, pricing(), None, None, False)  # type: ignore[arg-type]
    assert await admit(governor, policy) is not None
