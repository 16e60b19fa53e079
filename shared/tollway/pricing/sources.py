"""Pricing sources: a models.dev-style public catalog and the operator's overrides file.

**Catalog** (``kind = "models.dev"``), the shape of https://models.dev/api.json; keys other than
these are ignored::

    {"<provider>": {"models": {"<model>": {"cost": {
        "input": 3, "output": 15,                        # USD per 1M tokens, required
        "cache_read": 0.3, "cache_write": 3.75,          # optional
        "reasoning": 15,                                 # optional
        "context_over_200k": {"input": 6, "output": 22.5, ...}}}}}}   # optional, any context_over_<N>[k|m]

A model without ``cost`` has no price (it stays unknown); a ``cost`` that is present must be
valid, or the whole source is rejected.

**Overrides** (``kind = "overrides"``), JSON or YAML (``.yml``/``.yaml``), camelCase::

    version: 1
    effectiveFrom: 2025-07-01T00:00:00Z        # optional; default: when the snapshot is built
    prices:                                    # operator-approved rates, same units as the catalog
      <provider>:
        <model>: {input: 3, output: 15, cacheRead: 0.3, cacheWrite: 3.75, reasoning: 15,
                  tiers: [{overPromptTokens: 200000, name: context_over_200k, input: 6, output: 22.5}]}
    contracts:
      - {id: acme-anthropic, provider: anthropic, account: acct-prod, discountPercent: 12.5}
      - {id: acme-ft, provider: openai, model: "ft:gpt-4o:acme", rates: {input: 4, output: 16}}

**Missing rates.** cache read and cache write default to the input rate and reasoning to the
output rate. A tier's missing rate is the base entry's own (given) rate, else it is derived the
same way from the tier's input or output rate.

Rates must be finite numbers from 0 to :data:`~tollway.pricing.rates.MAX_RATE_USD_PER_MTOK`.
Every problem is reported with its path (``anthropic.models."claude-x".cost.input``).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tollway.exceptions import ConfigIssue
from tollway.pricing.errors import PricingSourceError
from tollway.pricing.rates import MAX_RATE_USD_PER_MTOK, Contract, ModelPrice, Rates, Tier, micro_per_mtok
from tollway.pricing.snapshot import PricingSnapshot, SourceInfo

__all__ = [
    "MODELS_DEV",
    "OVERRIDES",
    "Catalog",
    "Overrides",
    "compile_snapshot",
    "parse_models_dev",
    "parse_overrides",
]

MODELS_DEV: Final = "models.dev"
OVERRIDES: Final = "overrides"
MAX_TIER_TOKENS: Final = 100_000_000
_TIER_KEY: Final = re.compile(r"^context_over_(\d{1,9})(k|m)?$")
_MULTIPLIER: Final = {None: 1, "k": 1_000, "m": 1_000_000}

Rate = Annotated[float, Field(strict=True, ge=0, le=MAX_RATE_USD_PER_MTOK, allow_inf_nan=False)]
Id = Annotated[str, Field(min_length=1, max_length=256)]


@dataclass(frozen=True, slots=True)
class Catalog:
    source: SourceInfo
    prices: tuple[ModelPrice, ...]


@dataclass(frozen=True, slots=True)
class Overrides:
    source: SourceInfo
    prices: tuple[ModelPrice, ...]
    contracts: tuple[Contract, ...]
    effective_from: datetime | None


# ---------------------------------------------------------------- rates with gaps, resolved once


@dataclass(frozen=True, slots=True)
class _Given:
    """Rates as a source gives them, micro-USD per 1M tokens, ``None`` where absent."""

    input: int | None
    output: int | None
    cache_read: int | None = None
    cache_write: int | None = None
    reasoning: int | None = None

    def resolve(self, base: _Given | None = None) -> Rates:
        b = base or _Given(None, None)
        inp = _first(self.input, b.input)
        out = _first(self.output, b.output)
        return Rates(
            input=inp,
            output=out,
            cache_read=_first(self.cache_read, b.cache_read, inp),
            cache_write=_first(self.cache_write, b.cache_write, inp),
            reasoning=_first(self.reasoning, b.reasoning, out),
        )


def _first(*values: int | None) -> int:
    for v in values:
        if v is not None:
            return v
    raise ValueError("no rate")  # unreachable: input and output are required on the base


def _micro(value: float | None) -> int | None:
    return None if value is None else micro_per_mtok(value)


# ---------------------------------------------------------------- paths and issues


def _segment(part: object) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    text = str(part)
    return f'."{text}"' if not text or any(c in text for c in '. "[]') else f".{text}"


def _path(loc: Iterable[object], prefix: str = "") -> str:
    return (prefix + "".join(_segment(p) for p in loc)).lstrip(".")


def _issues(exc: ValidationError, prefix: str = "") -> list[ConfigIssue]:
    return [ConfigIssue(_path(e["loc"], prefix), e["msg"]) for e in exc.errors(include_url=False)]


def _info(uri: str, kind: str, body: bytes) -> SourceInfo:
    return SourceInfo(uri, kind, hashlib.sha256(body).hexdigest())


def _load_json(uri: str, body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PricingSourceError(uri, [ConfigIssue("", f"not JSON (line {exc.lineno}, column {exc.colno})")]) from None


# ---------------------------------------------------------------- models.dev


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _DevTier(_Lenient):
    input: Rate | None = None
    output: Rate | None = None
    cache_read: Rate | None = None
    cache_write: Rate | None = None
    reasoning: Rate | None = None

    def given(self) -> _Given:
        return _Given(
            *(_micro(v) for v in (self.input, self.output, self.cache_read, self.cache_write, self.reasoning))
        )


class _DevCost(_DevTier):
    model_config = ConfigDict(extra="allow", frozen=True)
    input: Rate
    output: Rate


class _DevModel(_Lenient):
    cost: _DevCost | None = None


class _DevProvider(_Lenient):
    models: dict[Id, _DevModel]


_DEV_ROOT: Final = TypeAdapter(dict[Id, _DevProvider])


def _dev_tiers(cost: _DevCost, base: _Given, where: str, issues: list[ConfigIssue]) -> tuple[Tier, ...]:
    tiers: list[Tier] = []
    for key, raw in sorted((cost.model_extra or {}).items()):
        match = _TIER_KEY.match(key)
        if match is None:
            continue
        threshold = int(match.group(1)) * _MULTIPLIER[match.group(2)]
        if not 1 <= threshold <= MAX_TIER_TOKENS:
            issues.append(ConfigIssue(f"{where}.{key}", f"the threshold must be 1-{MAX_TIER_TOKENS} tokens"))
            continue
        try:
            tier = _DevTier.model_validate(raw)
        except ValidationError as exc:
            issues.extend(_issues(exc, f"{where}.{key}"))
            continue
        tiers.append(Tier(key, threshold, tier.given().resolve(base)))
    tiers.sort(key=lambda t: t.over_prompt_tokens)
    for a, b in itertools.pairwise(tiers):
        if a.over_prompt_tokens == b.over_prompt_tokens:
            issues.append(ConfigIssue(f"{where}.{b.name}", f"repeats the threshold of {a.name}"))
    return tuple(tiers)


def parse_models_dev(body: bytes, *, uri: str) -> Catalog:
    """A models.dev-shaped catalog; :class:`PricingSourceError` naming every invalid path."""
    raw = _load_json(uri, body)
    try:
        providers = _DEV_ROOT.validate_python(raw)
    except ValidationError as exc:
        raise PricingSourceError(uri, _issues(exc)) from None
    issues: list[ConfigIssue] = []
    prices: list[ModelPrice] = []
    for provider, entry in providers.items():
        for model, spec in entry.models.items():
            if spec.cost is None:
                continue
            where = _path((provider, "models", model, "cost"))
            base = spec.cost.given()
            tiers = _dev_tiers(spec.cost, base, where, issues)
            prices.append(ModelPrice(provider, model, base.resolve(), tiers))
    if issues:
        raise PricingSourceError(uri, issues)
    return Catalog(_info(uri, MODELS_DEV, body), tuple(prices))


# ---------------------------------------------------------------- overrides


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _RatesIn(_Strict):
    input: Rate | None = None
    output: Rate | None = None
    cacheRead: Rate | None = None
    cacheWrite: Rate | None = None
    reasoning: Rate | None = None

    def given(self) -> _Given:
        values = (self.input, self.output, self.cacheRead, self.cacheWrite, self.reasoning)
        return _Given(*(_micro(v) for v in values))


class _TierIn(_RatesIn):
    overPromptTokens: int = Field(strict=True, ge=1, le=MAX_TIER_TOKENS)
    name: Id | None = None


class _PriceIn(_RatesIn):
    input: Rate
    output: Rate
    tiers: list[_TierIn] = Field(default_factory=list, max_length=8)

    def resolve(self, where: str, issues: list[ConfigIssue]) -> tuple[Rates, tuple[Tier, ...]]:
        base = self.given()
        tiers = sorted(self.tiers, key=lambda t: t.overPromptTokens)
        for a, b in itertools.pairwise(tiers):
            if a.overPromptTokens == b.overPromptTokens:
                issues.append(ConfigIssue(f"{where}.tiers", f"two tiers start over {a.overPromptTokens} tokens"))
        resolved = tuple(
            Tier(t.name or f"context_over_{t.overPromptTokens}", t.overPromptTokens, t.given().resolve(base))
            for t in tiers
        )
        return base.resolve(), resolved


class _ContractIn(_Strict):
    id: Id
    provider: Id
    account: Id | None = None
    model: Id | None = None
    discountPercent: Annotated[float, Field(strict=True, gt=0, le=100, allow_inf_nan=False)] | None = None
    rates: _PriceIn | None = None


class _OverridesIn(_Strict):
    version: Literal[1]
    effectiveFrom: datetime | None = None
    prices: dict[Id, dict[Id, _PriceIn]] = Field(default_factory=dict)
    contracts: list[_ContractIn] = Field(default_factory=list, max_length=1000)


def _contract(c: _ContractIn, where: str, issues: list[ConfigIssue]) -> Contract | None:
    if (c.discountPercent is None) == (c.rates is None):
        issues.append(ConfigIssue(where, "give exactly one of discountPercent and rates"))
        return None
    if c.rates is not None:
        if c.model is None:
            issues.append(ConfigIssue(where, "a contract with rates must name its model"))
            return None
        rates, tiers = c.rates.resolve(f"{where}.rates", issues)
        return Contract(c.id, c.provider, c.account, c.model, rates=rates, tiers=tiers)
    bps = Decimal(repr(c.discountPercent)) * 100
    if bps != bps.to_integral_value():
        issues.append(ConfigIssue(f"{where}.discountPercent", "at most two decimal places"))
        return None
    return Contract(c.id, c.provider, c.account, c.model, discount_bps=int(bps))


def _contracts(items: Sequence[_ContractIn], issues: list[ConfigIssue]) -> tuple[Contract, ...]:
    out: list[Contract] = []
    ids: set[str] = set()
    scopes: dict[tuple[str, str | None, str | None], str] = {}
    for i, item in enumerate(items):
        where = f"contracts[{i}]"
        if item.id in ids:
            issues.append(ConfigIssue(f"{where}.id", f"repeats contract id {item.id!r}"))
        ids.add(item.id)
        scope = (item.provider, item.account, item.model)
        if scope in scopes:
            issues.append(ConfigIssue(where, f"has the same provider, account and model as contract {scopes[scope]!r}"))
        scopes.setdefault(scope, item.id)
        contract = _contract(item, where, issues)
        if contract is not None:
            out.append(contract)
    return tuple(out)


def _load_overrides(uri: str, body: bytes) -> Any:
    if uri.lower().endswith((".yml", ".yaml")):
        try:
            return yaml.safe_load(body)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise PricingSourceError(uri, [ConfigIssue("", f"not YAML{at}")]) from None
    return _load_json(uri, body)


def parse_overrides(body: bytes, *, uri: str) -> Overrides:
    """The operator's overrides file (YAML when ``uri`` ends in ``.yml``/``.yaml``, JSON otherwise)."""
    try:
        doc = _OverridesIn.model_validate(_load_overrides(uri, body))
    except ValidationError as exc:
        raise PricingSourceError(uri, _issues(exc)) from None
    issues: list[ConfigIssue] = []
    if doc.effectiveFrom is not None and doc.effectiveFrom.tzinfo is None:
        issues.append(ConfigIssue("effectiveFrom", "needs a timezone (end it in Z for UTC)"))
    prices: list[ModelPrice] = []
    for provider, models in doc.prices.items():
        for model, spec in models.items():
            rates, tiers = spec.resolve(_path(("prices", provider, model)), issues)
            prices.append(ModelPrice(provider, model, rates, tiers))
    contracts = _contracts(doc.contracts, issues)
    if issues:
        raise PricingSourceError(uri, issues)
    return Overrides(_info(uri, OVERRIDES, body), tuple(prices), contracts, doc.effectiveFrom)


# ---------------------------------------------------------------- precedence


def compile_snapshot(catalogs: Sequence[Catalog], overrides: Overrides | None, *, now: datetime) -> PricingSnapshot:
    """Overlay the sources in precedence order and build the snapshot.

    Each catalog overlays the ones before it, and the overrides' ``prices`` overlay them all, one
    whole (provider, model) entry at a time: a later entry replaces an earlier one, it is not
    merged rate by rate. Contracts come from the overrides only. ``effectiveFrom`` is the
    overrides' when given, else ``now``.
    """
    merged: dict[tuple[str, str], ModelPrice] = {}
    layers: list[Iterable[ModelPrice]] = [c.prices for c in catalogs]
    if overrides is not None:
        layers.append(overrides.prices)
    for layer in layers:
        merged.update({(p.provider, p.model): p for p in layer})
    contracts = overrides.contracts if overrides is not None else ()
    if not merged and not any(c.rates is not None for c in contracts):
        uris = ", ".join(c.source.uri for c in catalogs) or "(none)"
        raise PricingSourceError(uris, [ConfigIssue("", "the sources price no model")])
    sources = [c.source for c in catalogs] + ([overrides.source] if overrides is not None else [])
    effective = overrides.effective_from if overrides is not None and overrides.effective_from else now
    return PricingSnapshot.build(merged.values(), contracts, effective_from=effective, sources=sources)
