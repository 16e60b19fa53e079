"""Price entries: the frozen, slotted values the hot path reads.

**Units.** A rate is an ``int`` in **micro-USD per 1M tokens** (USD per 1M tokens x 10^6), so
``2.5`` USD per 1M input tokens is ``2_500_000``. The same number is pico-USD per token, and
``tokens x rate / 10^6`` is micro-USD: cost needs integer arithmetic only. Sources carry decimal
USD per 1M tokens and are converted once, when a snapshot is built (:func:`micro_per_mtok`).

Every rate of an entry is resolved when it is built, so lookups never branch on a missing rate:
a source's absent cache-read or cache-write rate is the input rate (no discount, no surcharge),
and an absent reasoning rate is the output rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal
from typing import Final

__all__ = [
    "BASE_TIER",
    "MAX_RATE_USD_PER_MTOK",
    "MICRO",
    "Contract",
    "ModelPrice",
    "Rates",
    "Tier",
    "micro_per_mtok",
]

MICRO: Final = 1_000_000
"""Micro-USD per USD, and tokens per rate unit (1M)."""
MAX_RATE_USD_PER_MTOK: Final = 10_000
"""A rate above this many USD per 1M tokens is taken for a unit error in the source, not a price."""
BASE_TIER: Final = "standard"
"""The tier name of an entry's base rates (no context-length surcharge)."""
BPS: Final = 10_000


def micro_per_mtok(usd_per_mtok: float | int | Decimal) -> int:
    """Decimal USD per 1M tokens as integer micro-USD per 1M tokens, rounded half up.

    The rounding step is 10^-6 USD per 1M tokens (10^-12 USD per token): finer digits in a
    public catalog are noise, not price.
    """
    value = usd_per_mtok if isinstance(usd_per_mtok, Decimal) else Decimal(repr(usd_per_mtok))
    return int((value * MICRO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class Rates:
    """One complete rate card, each in micro-USD per 1M tokens."""

    input: int
    output: int
    cache_read: int
    """Prompt tokens served from the provider's cache."""
    cache_write: int
    """Prompt tokens written to the provider's cache (cache creation)."""
    reasoning: int
    """Reasoning (thinking) tokens, which are part of the completion count."""

    def discounted(self, bps: int) -> Rates:
        """Every rate less ``bps`` basis points, rounded half up to the unit."""
        keep = BPS - bps
        return Rates(*((r * keep + BPS // 2) // BPS for r in self.as_tuple()))

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.input, self.output, self.cache_read, self.cache_write, self.reasoning)

    def worst(self, other: Rates) -> Rates:
        """The higher of each rate."""
        return Rates(*(max(a, b) for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))


@dataclass(frozen=True, slots=True)
class Tier:
    """Rates that apply when a request's prompt tokens exceed ``over_prompt_tokens``."""

    name: str
    over_prompt_tokens: int
    rates: Rates


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """The price of one (provider, model), optionally as a contract made it."""

    provider: str
    model: str
    rates: Rates
    tiers: tuple[Tier, ...] = ()
    """Ordered by ascending threshold; the highest threshold below the prompt count wins."""
    contract: str | None = None
    """The id of the contract override that produced this entry; ``None`` for a catalog price."""

    def tier_for(self, prompt_tokens: int) -> tuple[str, Rates]:
        """The tier name and rates for a request of ``prompt_tokens`` prompt tokens."""
        for tier in reversed(self.tiers):
            if prompt_tokens > tier.over_prompt_tokens:
                return tier.name, tier.rates
        return BASE_TIER, self.rates

    def worst_rates(self) -> Rates:
        """Each rate at its highest over the base rates and every tier."""
        worst = self.rates
        for tier in self.tiers:
            worst = worst.worst(tier.rates)
        return worst

    def under_contract(self, contract: Contract) -> ModelPrice:
        """This price as ``contract`` changes it: replaced rates and tiers, or a discount on all of them."""
        if contract.rates is not None:
            return replace(self, rates=contract.rates, tiers=contract.tiers, contract=contract.id)
        bps = contract.discount_bps
        tiers = tuple(replace(t, rates=t.rates.discounted(bps)) for t in self.tiers)
        return replace(self, rates=self.rates.discounted(bps), tiers=tiers, contract=contract.id)


@dataclass(frozen=True, slots=True)
class Contract:
    """An operator's contract override: replaced rates, or a discount, for an account and/or a model.

    Exactly one of ``rates`` (which needs a ``model``) and a non-zero ``discount_bps`` applies.
    ``account`` is a ``providerAccountId``; ``None`` means every account, ``model`` ``None`` every model
    of the provider.
    """

    id: str
    provider: str
    account: str | None = None
    model: str | None = None
    discount_bps: int = 0
    """Basis points off every rate (1250 is 12.5% off)."""
    rates: Rates | None = None
    tiers: tuple[Tier, ...] = ()

    @property
    def specificity(self) -> int:
        """Which contract wins when several match: account and model (3), account (2), model (1), provider (0)."""
        return (2 if self.account is not None else 0) + (1 if self.model is not None else 0)
