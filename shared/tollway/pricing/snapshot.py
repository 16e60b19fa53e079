"""The immutable, versioned, effective-dated pricing catalog and its published JSON document.

A :class:`PricingSnapshot` is built once, off the request path, from catalog prices and contract
overrides (:meth:`PricingSnapshot.build`). Contracts are resolved then, into plain dicts, so a
lookup is one or two dict reads.

**Version.** The version is content-addressed: the first 16 hex digits of the SHA-256 of the
canonical JSON of the prices and contracts (sorted keys, entries sorted, no whitespace). The
same rates always give the same version, whatever the sources' order of keys, the refresh time or
``effectiveFrom``: identical prices need no new publication.

**Document** (schema 1), what the pricing bucket stores::

    {"schema": 1, "version": "<16 hex>", "digest": "sha256:<64 hex>",
     "effectiveFrom": "2025-01-01T00:00:00Z", "unit": "micro-USD per 1M tokens",
     "sources": [{"uri": ..., "kind": "models.dev" | "overrides", "sha256": ...}],
     "prices": [{"provider", "model", "rates": {"input", "output", "cacheRead", "cacheWrite", "reasoning"},
                 "tiers": [{"name", "overPromptTokens", "rates": {...}}]}],
     "contracts": [{"id", "provider", "account", "model", "discountBps", "rates", "tiers"}]}

Decoding recomputes the digest and refuses a document whose content does not match it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway.pricing.errors import SnapshotCorrupt
from tollway.pricing.rates import Contract, ModelPrice, Rates, Tier

__all__ = ["SCHEMA", "UNIT", "PricingSnapshot", "SourceInfo", "decode_snapshot", "encode_snapshot", "iso_utc"]

SCHEMA: Final = 1
UNIT: Final = "micro-USD per 1M tokens"
VERSION_HEX: Final = 16


def iso_utc(at: datetime) -> str:
    """``at`` as ISO-8601 UTC to the second, ``Z``-suffixed."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where part of a snapshot came from: metadata only, not part of the version."""

    uri: str
    kind: str
    sha256: str


@dataclass(frozen=True, slots=True, eq=False)
class PricingSnapshot:
    """One immutable pricing catalog. Build it with :meth:`build`; read it with :meth:`lookup`."""

    version: str
    digest: str
    effective_from: datetime
    prices: Mapping[tuple[str, str], ModelPrice]
    """(provider, model) → price, with every account-independent contract applied."""
    contracts: tuple[Contract, ...]
    sources: tuple[SourceInfo, ...] = ()
    catalog: tuple[ModelPrice, ...] = ()
    """The catalog prices before contracts, sorted; what the document and the digest hold."""
    by_account: Mapping[tuple[str, str, str], ModelPrice] = field(default_factory=dict)
    """(provider, account, model) → price, for each account some contract names."""

    @classmethod
    def build(
        cls,
        catalog: Iterable[ModelPrice],
        contracts: Iterable[Contract] = (),
        *,
        effective_from: datetime,
        sources: Sequence[SourceInfo] = (),
    ) -> PricingSnapshot:
        """Resolve ``contracts`` over ``catalog`` and compute the version.

        Exactly one contract applies to a (provider, account, model): the most specific that
        matches (account and model, then account, then model, then the whole provider). A contract
        with ``rates`` also prices its model when the catalog has no entry for it.
        """
        if effective_from.tzinfo is None:
            raise ValueError("effective_from must be timezone-aware")
        base = {(p.provider, p.model): p for p in catalog}
        terms = tuple(sorted(contracts, key=lambda c: c.id))
        ordered = tuple(base[k] for k in sorted(base))
        digest = _digest(ordered, terms)
        prices = _resolved(base, terms, None)
        by_account: dict[tuple[str, str, str], ModelPrice] = {}
        for provider, account in sorted({(c.provider, c.account) for c in terms if c.account is not None}):
            scoped = {k: v for k, v in base.items() if k[0] == provider}
            own = [c for c in terms if c.provider == provider]
            for (p, model), price in _resolved(scoped, own, account).items():
                by_account[(p, account, model)] = price
        return cls(
            version=digest.removeprefix("sha256:")[:VERSION_HEX],
            digest=digest,
            effective_from=effective_from.astimezone(UTC).replace(microsecond=0),
            prices=prices,
            contracts=terms,
            sources=tuple(sources),
            catalog=ordered,
            by_account=by_account,
        )

    def lookup(self, provider: str, model: str, account: str | None = None) -> ModelPrice | None:
        """The price for ``model`` of ``provider`` (as billed to ``account``); ``None`` when unknown."""
        if account is not None and self.by_account:
            found = self.by_account.get((provider, account, model))
            if found is not None:
                return found
        return self.prices.get((provider, model))

    def __len__(self) -> int:
        return len(self.catalog)


def _best(contracts: Sequence[Contract], provider: str, model: str, account: str | None) -> Contract | None:
    best: Contract | None = None
    for c in contracts:
        if (
            c.provider == provider
            and c.account in (None, account)
            and c.model in (None, model)
            and (best is None or c.specificity > best.specificity)
        ):
            best = c
    return best


def _resolved(
    base: Mapping[tuple[str, str], ModelPrice], contracts: Sequence[Contract], account: str | None
) -> dict[tuple[str, str], ModelPrice]:
    """``base`` under the contracts that apply to ``account`` (``None``: any account).

    A model the catalog does not price is priced only by a contract with ``rates`` for it (the most
    specific one); a discount needs a catalog price to discount.
    """
    out: dict[tuple[str, str], ModelPrice] = {}
    for key, price in base.items():
        best = _best(contracts, price.provider, price.model, account)
        out[key] = price if best is None else price.under_contract(best)
    replacing = [c for c in contracts if c.rates is not None and c.model is not None]
    for c in replacing:
        if (c.provider, c.model) in base or c.account not in (None, account):
            continue
        chosen = _best(replacing, c.provider, str(c.model), account)
        if chosen is not None and chosen.rates is not None:
            out[(c.provider, str(c.model))] = ModelPrice(
                c.provider, str(c.model), chosen.rates, chosen.tiers, chosen.id
            )
    return out


# ---------------------------------------------------------------- document


def _rates_doc(r: Rates) -> dict[str, int]:
    return {
        "input": r.input,
        "output": r.output,
        "cacheRead": r.cache_read,
        "cacheWrite": r.cache_write,
        "reasoning": r.reasoning,
    }


def _tiers_doc(tiers: Sequence[Tier]) -> list[dict[str, Any]]:
    return [{"name": t.name, "overPromptTokens": t.over_prompt_tokens, "rates": _rates_doc(t.rates)} for t in tiers]


def _content(catalog: Sequence[ModelPrice], contracts: Sequence[Contract]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "prices": [
            {"provider": p.provider, "model": p.model, "rates": _rates_doc(p.rates), "tiers": _tiers_doc(p.tiers)}
            for p in catalog
        ],
        "contracts": [
            {
                "id": c.id,
                "provider": c.provider,
                "account": c.account,
                "model": c.model,
                "discountBps": c.discount_bps,
                "rates": None if c.rates is None else _rates_doc(c.rates),
                "tiers": _tiers_doc(c.tiers),
            }
            for c in contracts
        ],
    }


def _digest(catalog: Sequence[ModelPrice], contracts: Sequence[Contract]) -> str:
    canonical = orjson.dumps(_content(catalog, contracts), option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def encode_snapshot(snapshot: PricingSnapshot) -> bytes:
    """The snapshot's document, as the store holds it (sorted keys, so byte-stable)."""
    doc = _content(snapshot.catalog, snapshot.contracts) | {
        "version": snapshot.version,
        "digest": snapshot.digest,
        "effectiveFrom": iso_utc(snapshot.effective_from),
        "unit": UNIT,
        "sources": [{"uri": s.uri, "kind": s.kind, "sha256": s.sha256} for s in snapshot.sources],
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _RatesDoc(_Doc):
    input: int = Field(ge=0)
    output: int = Field(ge=0)
    cacheRead: int = Field(ge=0)
    cacheWrite: int = Field(ge=0)
    reasoning: int = Field(ge=0)

    def rates(self) -> Rates:
        return Rates(self.input, self.output, self.cacheRead, self.cacheWrite, self.reasoning)


class _TierDoc(_Doc):
    name: str = Field(min_length=1)
    overPromptTokens: int = Field(ge=1)
    rates: _RatesDoc


class _PriceDoc(_Doc):
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    rates: _RatesDoc
    tiers: list[_TierDoc]


class _ContractDoc(_Doc):
    id: str = Field(min_length=1)
    provider: str = Field(min_length=1)
    account: str | None
    model: str | None
    discountBps: int = Field(ge=0, le=10_000)
    rates: _RatesDoc | None
    tiers: list[_TierDoc]


class _SourceDoc(_Doc):
    uri: str
    kind: str
    sha256: str


class _SnapshotDoc(_Doc):
    schema_: int = Field(alias="schema")
    version: str
    digest: str
    effectiveFrom: datetime
    unit: str
    sources: list[_SourceDoc]
    prices: list[_PriceDoc]
    contracts: list[_ContractDoc]


def _tiers(docs: Sequence[_TierDoc]) -> tuple[Tier, ...]:
    return tuple(Tier(t.name, t.overPromptTokens, t.rates.rates()) for t in docs)


def decode_snapshot(body: bytes) -> PricingSnapshot:
    """A published document as a snapshot; :class:`SnapshotCorrupt` unless it is valid and its digest matches."""
    try:
        doc = _SnapshotDoc.model_validate(orjson.loads(body))
    except orjson.JSONDecodeError:
        raise SnapshotCorrupt("the snapshot is not JSON") from None
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise SnapshotCorrupt(f"the snapshot is not a schema-{SCHEMA} document ({where})") from None
    if doc.schema_ != SCHEMA or doc.unit != UNIT or doc.effectiveFrom.tzinfo is None:
        raise SnapshotCorrupt(f"the snapshot is not a schema-{SCHEMA} document in {UNIT} with a UTC effectiveFrom")
    catalog = [ModelPrice(p.provider, p.model, p.rates.rates(), _tiers(p.tiers)) for p in doc.prices]
    contracts = [
        Contract(
            c.id,
            c.provider,
            c.account,
            c.model,
            c.discountBps,
            None if c.rates is None else c.rates.rates(),
            _tiers(c.tiers),
        )
        for c in doc.contracts
    ]
    sources = [SourceInfo(s.uri, s.kind, s.sha256) for s in doc.sources]
    snapshot = PricingSnapshot.build(catalog, contracts, effective_from=doc.effectiveFrom, sources=sources)
    if snapshot.digest != doc.digest or snapshot.version != doc.version:
        raise SnapshotCorrupt(f"snapshot {doc.version}: the content does not match its digest")
    return snapshot
