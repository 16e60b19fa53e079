"""Source parsing and validation, precedence between sources, and contract overrides."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from tollway.canonical import Usage
from tollway.pricing import (
    BASE_TIER,
    Cost,
    PricingSnapshot,
    PricingSourceError,
    Rates,
    UnknownPrice,
    compile_snapshot,
    parse_models_dev,
    parse_overrides,
    price,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data"


def dev(doc: object) -> bytes:
    return orjson.dumps(doc)


def one_model(cost: object) -> bytes:
    return dev({"acme": {"models": {"m-1.5": {"cost": cost}}}})


def issues(exc: pytest.ExceptionInfo[PricingSourceError]) -> list[str]:
    return [str(i) for i in exc.value.issues]


def cost_of(snapshot: PricingSnapshot, provider: str, model: str, account: str | None = None, **counts: int) -> Cost:
    usage = Usage(prompt_tokens=counts.get("prompt_tokens", 0), completion_tokens=counts.get("completion_tokens", 0))
    result = price(snapshot, provider, model, usage, account=account)
    assert isinstance(result, Cost), result
    return result


# ---------------------------------------------------------------- models.dev


def test_models_dev_rates_become_micro_usd_per_million_with_defaults_for_missing_ones(catalog_bytes: bytes) -> None:
    catalog = parse_models_dev(catalog_bytes, uri="file://c.json")
    by = {(p.provider, p.model): p for p in catalog.prices}
    # no cache_write: the input rate; no reasoning: the output rate
    assert by[("openai", "gpt-4.1")].rates == Rates(2_000_000, 8_000_000, 500_000, 2_000_000, 8_000_000)
    assert by[("openai", "o3")].rates.reasoning == 10_000_000
    assert catalog.source.kind == "models.dev"
    assert len(catalog.source.sha256) == 64


def test_models_dev_context_over_200k_becomes_a_tier(catalog_bytes: bytes) -> None:
    catalog = parse_models_dev(catalog_bytes, uri="file://c.json")
    (sonnet,) = [p for p in catalog.prices if p.model == "claude-sonnet-4"]
    (tier,) = sonnet.tiers
    assert (tier.name, tier.over_prompt_tokens) == ("context_over_200k", 200_000)
    assert tier.rates == Rates(6_000_000, 22_500_000, 600_000, 7_500_000, 22_500_000)


def test_a_tier_without_a_rate_takes_the_base_rate_given_else_derives_it_from_its_own() -> None:
    body = one_model({"input": 1, "output": 2, "cache_read": 0.1, "context_over_1m": {"input": 4, "output": 8}})
    (entry,) = parse_models_dev(body, uri="s3://b/k").prices
    (tier,) = entry.tiers
    assert tier.over_prompt_tokens == 1_000_000
    assert tier.rates == Rates(4_000_000, 8_000_000, 100_000, 4_000_000, 8_000_000)


def test_a_model_without_cost_stays_unknown(catalog_bytes: bytes) -> None:
    snapshot = compile_snapshot([parse_models_dev(catalog_bytes, uri="file://c.json")], None, now=NOW)
    result = price(snapshot, "openai", "whisper-free", Usage(prompt_tokens=1))
    assert isinstance(result, UnknownPrice)


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        ({"input": -1, "output": 2}, 'acme.models."m-1.5".cost.input: Input should be greater than or equal to 0'),
        ({"input": 1, "output": 20_000}, 'acme.models."m-1.5".cost.output: Input should be less than or equal to'),
        ({"input": 1}, 'acme.models."m-1.5".cost.output: Field required'),
        ({"input": True, "output": 2}, 'acme.models."m-1.5".cost.input: Input should be a valid number'),
        ({"input": "1", "output": 2}, 'acme.models."m-1.5".cost.input: Input should be a valid number'),
        (
            {"input": 1, "output": 2, "context_over_200k": {"input": -3}},
            'acme.models."m-1.5".cost.context_over_200k.input: Input should be greater than or equal to 0',
        ),
    ],
)
def test_invalid_catalog_rates_reject_the_source_naming_the_path(cost: object, expected: str) -> None:
    with pytest.raises(PricingSourceError) as exc:
        parse_models_dev(one_model(cost), uri="s3://b/catalog.json")
    assert exc.value.source == "s3://b/catalog.json"
    assert any(i.startswith(expected) for i in issues(exc)), issues(exc)


def test_a_catalog_that_is_not_json_or_not_the_shape_is_rejected() -> None:
    with pytest.raises(PricingSourceError, match="not JSON"):
        parse_models_dev(b"{nope", uri="file://x")
    with pytest.raises(PricingSourceError) as exc:
        parse_models_dev(dev({"acme": {"no-models": {}}}), uri="file://x")
    assert issues(exc) == ["acme.models: Field required"]


def test_nan_and_infinite_rates_are_rejected() -> None:
    body = b"version: 1\nprices:\n  acme:\n    m:\n      input: .nan\n      output: .inf\n"
    with pytest.raises(PricingSourceError) as exc:
        parse_overrides(body, uri="file://o.yaml")
    assert issues(exc) == [
        "prices.acme.m.input: Input should be a finite number",
        "prices.acme.m.output: Input should be a finite number",
    ]


# ---------------------------------------------------------------- overrides


def test_overrides_reject_unknown_keys_and_a_missing_version() -> None:
    with pytest.raises(PricingSourceError) as exc:
        parse_overrides(b'{"prices": {}, "extra": 1}', uri="file://o.json")
    assert sorted(issues(exc)) == ["extra: Extra inputs are not permitted", "version: Field required"]


def test_a_contract_needs_exactly_one_of_a_discount_and_rates() -> None:
    body = b"""version: 1
contracts:
  - {id: a, provider: p}
  - {id: b, provider: p, discountPercent: 5, rates: {input: 1, output: 1}, model: m}
  - {id: c, provider: p, account: x, rates: {input: 1, output: 1}}
  - {id: d, provider: p, account: y, discountPercent: 12.345}
"""
    with pytest.raises(PricingSourceError) as exc:
        parse_overrides(body, uri="file://o.yml")
    assert issues(exc) == [
        "contracts[0]: give exactly one of discountPercent and rates",
        "contracts[1]: give exactly one of discountPercent and rates",
        "contracts[2]: a contract with rates must name its model",
        "contracts[3].discountPercent: at most two decimal places",
    ]


def test_contracts_with_the_same_scope_or_id_are_rejected() -> None:
    body = b"""version: 1
contracts:
  - {id: a, provider: p, account: x, discountPercent: 5}
  - {id: a, provider: p, account: x, discountPercent: 6}
"""
    with pytest.raises(PricingSourceError) as exc:
        parse_overrides(body, uri="file://o.yml")
    assert issues(exc) == [
        "contracts[1].id: repeats contract id 'a'",
        "contracts[1]: has the same provider, account and model as contract 'a'",
    ]


def test_an_effective_from_without_a_timezone_is_rejected() -> None:
    with pytest.raises(PricingSourceError, match="effectiveFrom: needs a timezone"):
        parse_overrides(b'{"version": 1, "effectiveFrom": "2025-07-01T00:00:00"}', uri="file://o.json")


def test_sources_that_price_nothing_are_rejected() -> None:
    with pytest.raises(PricingSourceError, match="the sources price no model"):
        compile_snapshot([parse_models_dev(b"{}", uri="file://empty.json")], None, now=NOW)


# ---------------------------------------------------------------- precedence


def test_a_later_catalog_replaces_an_earlier_entry_whole() -> None:
    first = parse_models_dev(one_model({"input": 1, "output": 2, "cache_read": 0.1}), uri="file://first")
    second = parse_models_dev(one_model({"input": 5, "output": 6}), uri="file://second")
    snapshot = compile_snapshot([first, second], None, now=NOW)
    entry = snapshot.lookup("acme", "m-1.5")
    assert entry is not None
    # the first catalog's cache_read is not merged in: the second entry's own default applies
    assert entry.rates == Rates(5_000_000, 6_000_000, 5_000_000, 5_000_000, 6_000_000)
    assert [s.uri for s in snapshot.sources] == ["file://first", "file://second"]


def test_override_prices_win_over_every_catalog() -> None:
    catalog = parse_models_dev(one_model({"input": 1, "output": 2}), uri="file://c")
    overrides = parse_overrides(b"version: 1\nprices: {acme: {m-1.5: {input: 7, output: 9}}}\n", uri="file://o.yml")
    snapshot = compile_snapshot([catalog], overrides, now=NOW)
    assert cost_of(snapshot, "acme", "m-1.5", prompt_tokens=1_000_000).amount_micro_usd == 7_000_000


def test_the_most_specific_contract_applies_and_only_one(snapshot: PricingSnapshot) -> None:
    tokens = {"prompt_tokens": 100_000}
    # account + model: 25% off 3 USD per 1M
    sonnet = cost_of(snapshot, "anthropic", "claude-sonnet-4", "acct-acme", **tokens)
    assert (sonnet.amount_micro_usd, sonnet.contract) == (225_000, "acme-sonnet")
    # account-wide: 10% off the override file's price of haiku (0.8)
    haiku = cost_of(snapshot, "anthropic", "claude-haiku-3.5", "acct-acme", **tokens)
    assert (haiku.amount_micro_usd, haiku.contract) == (72_000, "acme-anthropic-account")
    # another account: the public price
    other = cost_of(snapshot, "anthropic", "claude-sonnet-4", "acct-other", **tokens)
    assert (other.amount_micro_usd, other.contract) == (300_000, None)
    # a model-wide contract applies to every account, and to no account
    for account in (None, "acct-acme", "acct-other"):
        gpt = cost_of(snapshot, "openai", "gpt-4.1", account, **tokens)
        assert (gpt.amount_micro_usd, gpt.contract) == (100_000, "everyone-gpt41")


def test_a_discount_applies_to_the_tiers_too(snapshot: PricingSnapshot) -> None:
    cost = cost_of(snapshot, "anthropic", "claude-sonnet-4", "acct-acme", prompt_tokens=1_000_000)
    assert cost.tier == "context_over_200k"
    assert cost.amount_micro_usd == 4_500_000  # 25% off 6 USD


def test_a_contract_rate_for_an_unlisted_model_prices_it_only_for_its_account(snapshot: PricingSnapshot) -> None:
    cost = cost_of(snapshot, "openai", "ft:gpt-4.1:acme", "acct-acme", completion_tokens=1_000_000)
    assert (cost.amount_micro_usd, cost.contract, cost.tier) == (12_000_000, "acme-private-ft", BASE_TIER)
    for account in (None, "acct-other"):
        assert isinstance(price(snapshot, "openai", "ft:gpt-4.1:acme", Usage(), account=account), UnknownPrice)


def test_the_overrides_effective_from_dates_the_snapshot() -> None:
    catalog = parse_models_dev(one_model({"input": 1, "output": 2}), uri="file://c")
    overrides = parse_overrides(b"version: 1\neffectiveFrom: 2025-07-01T00:00:00Z\n", uri="file://o.yml")
    assert compile_snapshot([catalog], overrides, now=NOW).effective_from == datetime(2025, 7, 1, tzinfo=UTC)
    assert compile_snapshot([catalog], None, now=NOW).effective_from == NOW
