"""Cost math: each rate kind, rounding, context tiers, reservations and the explicit unknown price."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tollway.canonical import Usage
from tollway.pricing import (
    BASE_TIER,
    WORST_CASE_TIER,
    Cost,
    ModelPrice,
    PricingSnapshot,
    Rates,
    Tier,
    UnknownPrice,
    price,
    reservation_cost,
)
from tollway.pricing.cost import usd

NOW = datetime(2025, 6, 1, tzinfo=UTC)
# USD per 1M tokens x 10^6: input 1, output 2, cache read 0.25, cache write 1.5, reasoning 4.
RATES = Rates(input=1_000_000, output=2_000_000, cache_read=250_000, cache_write=1_500_000, reasoning=4_000_000)
TIER = Tier("context_over_200k", 200_000, Rates(2_000_000, 3_000_000, 500_000, 3_000_000, 6_000_000))


def snapshot(*prices: ModelPrice) -> PricingSnapshot:
    return PricingSnapshot.build(prices or [ModelPrice("p", "m", RATES, (TIER,))], effective_from=NOW)


@dataclass
class Counts:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_creation_tokens: int = 0
    reasoning_tokens: int = 0


def micro(counts: Counts) -> int:
    cost = price(snapshot(), "p", "m", counts)
    assert isinstance(cost, Cost)
    return cost.amount_micro_usd


def test_each_rate_kind_is_charged_per_token_in_micro_usd() -> None:
    n = 100_000  # under the tier's threshold
    assert micro(Counts(prompt_tokens=n)) == 100_000  # 0.1 USD of input at 1 USD per 1M
    assert micro(Counts(completion_tokens=n)) == 200_000
    assert micro(Counts(prompt_tokens=n, cached_prompt_tokens=n)) == 25_000
    assert micro(Counts(prompt_tokens=n, cache_creation_tokens=n)) == 150_000
    assert micro(Counts(completion_tokens=n, reasoning_tokens=n)) == 400_000


def test_cached_and_reasoning_tokens_are_not_charged_twice() -> None:
    counts = Counts(
        prompt_tokens=1000,
        cached_prompt_tokens=400,
        cache_creation_tokens=100,
        completion_tokens=300,
        reasoning_tokens=200,
    )
    # 500 uncached x 1 + 400 x 0.25 + 100 x 1.5 + 100 plain output x 2 + 200 reasoning x 4 (micro-USD per token)
    assert micro(counts) == 500 + 100 + 150 + 200 + 800


def test_the_total_is_rounded_up_once_to_a_whole_micro_usd() -> None:
    assert micro(Counts(prompt_tokens=1, cached_prompt_tokens=1)) == 1  # 0.25 micro-USD
    assert micro(Counts(prompt_tokens=3, cached_prompt_tokens=3)) == 1  # 0.75, not 3 x ceil(0.25)
    assert micro(Counts()) == 0


def test_a_prompt_over_the_threshold_uses_the_tier_and_says_so() -> None:
    at = price(snapshot(), "p", "m", Counts(prompt_tokens=200_000))
    over = price(snapshot(), "p", "m", Counts(prompt_tokens=200_001))
    assert isinstance(at, Cost) and isinstance(over, Cost)
    assert (at.tier, at.amount_micro_usd) == (BASE_TIER, 200_000)
    assert (over.tier, over.amount_micro_usd) == ("context_over_200k", 400_002)


def test_the_tier_counts_cached_prompt_tokens_too() -> None:
    cost = price(snapshot(), "p", "m", Counts(prompt_tokens=250_000, cached_prompt_tokens=240_000))
    assert isinstance(cost, Cost)
    assert cost.tier == "context_over_200k"
    assert cost.amount_micro_usd == 10_000 * 2 + 240_000 // 2


def test_the_cost_carries_the_pricing_version() -> None:
    snap = snapshot()
    cost = price(snap, "p", "m", Counts(prompt_tokens=10))
    assert isinstance(cost, Cost)
    assert cost.pricing_version == snap.version
    assert cost.contract is None
    assert str(cost.usd) == "0.00001"


def test_canonical_usage_is_priced_directly() -> None:
    usage = Usage(prompt_tokens=100, completion_tokens=50, cached_prompt_tokens=20)
    cost = price(snapshot(), "p", "m", usage)
    assert isinstance(cost, Cost)
    assert cost.amount_micro_usd == 80 + 5 + 100


def test_an_unknown_model_is_an_explicit_unknown_price_not_zero() -> None:
    snap = snapshot()
    result = price(snap, "p", "other", Counts(prompt_tokens=10), account="acct")
    assert result == UnknownPrice("p", "other", snap.version, "acct")
    assert not isinstance(result, Cost)
    assert reservation_cost(snap, "q", "m", input_tokens=1, max_output_tokens=1) == UnknownPrice("q", "m", snap.version)


def test_a_zero_price_is_a_known_zero_cost() -> None:
    free = ModelPrice("p", "free", Rates(0, 0, 0, 0, 0))
    cost = price(snapshot(free), "p", "free", Counts(prompt_tokens=10**6, completion_tokens=10**6))
    assert cost == Cost(0, snapshot(free).version, BASE_TIER)


def test_a_reservation_prices_every_token_at_its_worst_rate_over_all_tiers() -> None:
    cost = reservation_cost(snapshot(), "p", "m", input_tokens=1000, max_output_tokens=500)
    assert isinstance(cost, Cost)
    assert cost.tier == WORST_CASE_TIER
    # input at the tier's cache-write rate (3), output at the tier's reasoning rate (6)
    assert cost.amount_micro_usd == 1000 * 3 + 500 * 6


def test_a_reservation_covers_any_settled_cost_of_the_same_size() -> None:
    snap = snapshot()
    reserved = reservation_cost(snap, "p", "m", input_tokens=300_000, max_output_tokens=4000)
    assert isinstance(reserved, Cost)
    for counts in (
        Counts(prompt_tokens=300_000, completion_tokens=4000),
        Counts(prompt_tokens=300_000, cache_creation_tokens=300_000, completion_tokens=4000, reasoning_tokens=4000),
    ):
        settled = price(snap, "p", "m", counts)
        assert isinstance(settled, Cost)
        assert settled.amount_micro_usd <= reserved.amount_micro_usd


def test_micro_usd_renders_as_an_exact_usd_string() -> None:
    assert [usd(n) for n in (0, 1, 1500, 1_000_000, 12_345_678_901)] == [
        "0.000000",
        "0.000001",
        "0.001500",
        "1.000000",
        "12345.678901",
    ]


def test_anthropic_cache_reads_and_writes_are_priced_at_the_example_catalogs_cache_rates() -> None:
    """From the provider's usage to micro-USD: Anthropic's ``input_tokens`` leaves cache tokens out,
    the codec adds them back into the prompt count, and ``price`` charges each kind at its rate."""
    from pathlib import Path

    from tollway.pricing import compile_snapshot, parse_models_dev
    from tollway.providers import AnthropicMessagesCodec

    catalog = Path(__file__).parents[3] / "shared" / "tollway" / "examples" / "pricing-catalog.json"
    snap = compile_snapshot([parse_models_dev(catalog.read_bytes(), uri=catalog.as_uri())], None, now=NOW)
    body = (
        b'{"id":"msg_1","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":'
        b'{"input_tokens":1000,"cache_read_input_tokens":200000,"cache_creation_input_tokens":10000,"output_tokens":500}}'
    )
    usage = AnthropicMessagesCodec().decode_response(200, body).usage
    assert usage == Usage(
        prompt_tokens=211_000, completion_tokens=500, cached_prompt_tokens=200_000, cache_creation_tokens=10_000
    )
    cost = price(snap, "anthropic", "mock-claude-small", usage)
    assert isinstance(cost, Cost)
    # USD per 1M: input 0.8, cache read 0.08, cache write 1, output 4 → 800 + 16 000 + 10 000 + 2 000 micro-USD
    assert cost.amount_micro_usd == 28_800
    uncached = price(snap, "anthropic", "mock-claude-small", Usage(prompt_tokens=211_000, completion_tokens=500))
    assert isinstance(uncached, Cost) and uncached.amount_micro_usd == 170_800
