"""The compiled governance sub-snapshots of a published root: limits per key and alias, capacity per
quota group, and the pricing view. Built at publication (``tollway.config.governance``); a request
does dict lookups here and never merges policies.

Every policy that matches a request applies (tenant, team, principal and key, each optionally
narrowed to the alias): a request must fit every enclosing scope's limits and budgets, and the
per-request token maxima are the smallest any of them sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tollway.governance.leases import Limit
from tollway.pricing import PricingSnapshot

__all__ = ["AliasPrice", "GovernanceSnapshot", "PricingView", "RequestPolicy", "RoutePrice"]


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """What one key may spend on one alias, compiled from every matching policy."""

    requests: tuple[Limit, ...] = ()
    """Requests-per-minute limits (one unit per request)."""
    tokens: tuple[Limit, ...] = ()
    """Tokens-per-minute limits (input estimate plus maximum output, settled to the reported total)."""
    cost: tuple[Limit, ...] = ()
    """Cost budgets in micro-USD: hard, so an unknown price fails closed under them."""
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    concurrency: tuple[tuple[str, int | None, int | None], ...] = ()
    """``(scope, max requests, max streams)`` per scope that limits concurrency, per process."""

    @property
    def empty(self) -> bool:
        return not (self.requests or self.tokens or self.cost or self.concurrency) and (
            self.max_input_tokens is None and self.max_output_tokens is None
        )


NO_POLICY = RequestPolicy()


@dataclass(frozen=True, slots=True)
class GovernanceSnapshot:
    policies: Mapping[tuple[str, str], RequestPolicy] = field(default_factory=lambda: MappingProxyType({}))
    """``(key id, alias)`` → its compiled policy; absent means no limits."""
    capacity: Mapping[str, tuple[Limit, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Quota group id → its approved RPM/TPM as limits (every credential in the group shares them)."""
    store: str = "memory"
    lease_fraction: float = 0.02
    lease_wait_s: float = 1.0
    table: str = ""

    def policy(self, key_id: str, alias: str) -> RequestPolicy:
        return self.policies.get((key_id, alias), NO_POLICY)

    @property
    def enabled(self) -> bool:
        return bool(self.policies or self.capacity)


@dataclass(frozen=True, slots=True)
class RoutePrice:
    """How to price a route's usage: the catalog's provider id, the physical model, the account."""

    provider: str
    model: str
    account: str


@dataclass(frozen=True, slots=True)
class AliasPrice:
    """The most one token can cost on any of an alias's routes, in micro-USD per million tokens,
    or ``None`` when some route has no price (unknown, never zero)."""

    input_per_mtok: int | None
    output_per_mtok: int | None

    def reservation(self, input_tokens: int, max_output_tokens: int) -> int | None:
        if self.input_per_mtok is None or self.output_per_mtok is None:
            return None
        pico = input_tokens * self.input_per_mtok + max_output_tokens * self.output_per_mtok
        return -(-pico // 1_000_000)


@dataclass(frozen=True, slots=True, eq=False)
class PricingView:
    """The pricing sub-snapshot: the snapshot, and each alias's reservation rates under it."""

    snapshot: PricingSnapshot | None
    aliases: Mapping[str, AliasPrice]
    routes: Mapping[str, RoutePrice]
    """Route id → how its usage is priced."""

    @property
    def version(self) -> str | None:
        return self.snapshot.version if self.snapshot is not None else None
