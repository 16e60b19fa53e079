"""Cost of a request from its token counts: integer micro-USD, the pricing version and the tier used.

**Counts** follow :class:`tollway.canonical.Usage`: ``prompt_tokens`` includes the cached
(``cached_prompt_tokens``) and cache-creation (``cache_creation_tokens``) prompt tokens, and
``completion_tokens`` includes ``reasoning_tokens``. So::

    uncached input = prompt - cached - cache creation        (never below zero)
    plain output   = completion - reasoning                  (never below zero)
    cost (pico-USD) = uncached x input + cached x cacheRead + creation x cacheWrite
                    + plain output x output + reasoning x reasoning
    cost (micro-USD) = ceil(pico-USD / 10^6)

The tier is chosen by ``prompt_tokens`` (the whole prompt, cached or not) against each tier's
threshold. One rounding, upwards, per request: a budget is never undercharged by rounding.

An unknown (provider, model) is :class:`UnknownPrice`, never a zero :class:`Cost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Protocol

from tollway.pricing.rates import MICRO
from tollway.pricing.snapshot import PricingSnapshot

__all__ = ["WORST_CASE_TIER", "Cost", "TokenCounts", "UnknownPrice", "price", "reservation_cost", "usd"]

WORST_CASE_TIER: Final = "worst-case"
"""The tier of a reservation estimate: the highest of each rate over every tier."""


class TokenCounts(Protocol):
    """What pricing reads from a usage record; :class:`tollway.canonical.Usage` is one."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached_prompt_tokens(self) -> int: ...
    @property
    def cache_creation_tokens(self) -> int: ...
    @property
    def reasoning_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Cost:
    """A priced request. ``amount_micro_usd`` is integer micro-USD (10^-6 USD), rounded up."""

    amount_micro_usd: int
    pricing_version: str
    tier: str
    """``standard``, a context tier's name (``context_over_200k``), or ``worst-case`` for a reservation."""
    contract: str | None = None
    """The contract override that priced it, if any."""

    @property
    def usd(self) -> Decimal:
        """The amount in USD, exactly (for display and export, not the hot path)."""
        return Decimal(self.amount_micro_usd) / MICRO


@dataclass(frozen=True, slots=True)
class UnknownPrice:
    """The snapshot has no price for this model: the cost is unknown, not zero.

    Under a hard cost budget the caller fails closed; otherwise it records the usage with
    ``cost`` unknown and this ``pricing_version``, so reconciliation can price it later.
    """

    provider: str
    model: str
    pricing_version: str
    account: str | None = None


def price(
    snapshot: PricingSnapshot, provider: str, model: str, usage: TokenCounts, *, account: str | None = None
) -> Cost | UnknownPrice:
    """The cost of ``usage`` on ``model`` of ``provider``, as billed to ``account`` (a ``providerAccountId``)."""
    entry = snapshot.lookup(provider, model, account)
    if entry is None:
        return UnknownPrice(provider, model, snapshot.version, account)
    prompt = usage.prompt_tokens
    tier, r = entry.tier_for(prompt)
    cached = usage.cached_prompt_tokens
    creation = usage.cache_creation_tokens
    completion = usage.completion_tokens
    reasoning = usage.reasoning_tokens
    pico = (
        max(prompt - cached - creation, 0) * r.input
        + cached * r.cache_read
        + creation * r.cache_write
        + max(completion - reasoning, 0) * r.output
        + reasoning * r.reasoning
    )
    return Cost(-(-pico // MICRO), snapshot.version, tier, entry.contract)


def reservation_cost(
    snapshot: PricingSnapshot,
    provider: str,
    model: str,
    *,
    input_tokens: int,
    max_output_tokens: int,
    account: str | None = None,
) -> Cost | UnknownPrice:
    """What to reserve before dispatch: the most a request of this size can cost.

    Every input token is priced at the highest of the input, cache-read and cache-write rates and
    every output token at the higher of the output and reasoning rates, each over all tiers, since
    the input count is an estimate and caching is the provider's decision.
    """
    entry = snapshot.lookup(provider, model, account)
    if entry is None:
        return UnknownPrice(provider, model, snapshot.version, account)
    w = entry.worst_rates()
    pico = max(input_tokens, 0) * max(w.input, w.cache_read, w.cache_write) + max(max_output_tokens, 0) * max(
        w.output, w.reasoning
    )
    return Cost(-(-pico // MICRO), snapshot.version, WORST_CASE_TIER, entry.contract)


def usd(micro_usd: int) -> str:
    """Integer micro-USD as an exact decimal string of USD with six places (``1234`` → ``"0.001234"``).

    Here, beside the micro-USD amounts it renders, so that both the usage API (``tollway.metering``)
    and the audit CLI (``tollway.audit``) can format money without either importing the other.
    """
    sign = "-" if micro_usd < 0 else ""
    whole, frac = divmod(abs(micro_usd), MICRO)
    return f"{sign}{whole}.{frac:06d}"
