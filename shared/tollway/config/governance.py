"""Compile the ``governance:`` block into the root's governance and pricing sub-snapshots.

Policy precedence is resolved here, at publication: for each key and each alias it may use, every
matching policy's limits are collected into one :class:`RequestPolicy`. The pricing view is
compiled separately so a pricing-only update rebuilds only it (``PublishedRoot.with_pricing``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

from tollway.config.schema import GovernanceConfig, PolicyConfig, PrincipalConfig, RouterConfig
from tollway.exceptions import ConfigError, ConfigIssue
from tollway.governance.leases import Limit, Window, cost_budget, requests_per_minute, tokens_per_minute
from tollway.governance.policy import AliasPrice, GovernanceSnapshot, PricingView, RequestPolicy, RoutePrice
from tollway.pricing import (
    Cost,
    PricingError,
    PricingSnapshot,
    compile_snapshot,
    parse_models_dev,
    parse_overrides,
    reservation_cost,
)
from tollway.routing.plan import AliasPlan

__all__ = ["compile_governance", "compile_pricing", "load_pricing_files"]

_MICRO = 1_000_000


def _scopes(p: PrincipalConfig, key_id: str) -> tuple[str, ...]:
    team = (f"team:{p.tenant}/{p.team}",) if p.team else ()
    return (f"tenant:{p.tenant}", *team, f"principal:{p.id}", f"key:{key_id}")


def _merge(policies: Iterable[PolicyConfig]) -> RequestPolicy:
    requests: list[Limit] = []
    tokens: list[Limit] = []
    cost: list[Limit] = []
    concurrency: list[tuple[str, int | None, int | None]] = []
    max_in: int | None = None
    max_out: int | None = None
    for pol in policies:
        scope = pol.scope if pol.alias is None else f"{pol.scope}/alias:{pol.alias}"
        lim = pol.limits
        if lim.rpm is not None:
            requests.append(requests_per_minute(scope, lim.rpm))
        if lim.tpm is not None:
            tokens.append(tokens_per_minute(scope, lim.tpm))
        for b in pol.budgets:
            cost.append(cost_budget(scope, Window(b.window), round(b.usd * _MICRO)))
        if lim.maxConcurrentRequests is not None or lim.maxConcurrentStreams is not None:
            concurrency.append((scope, lim.maxConcurrentRequests, lim.maxConcurrentStreams))
        if lim.maxInputTokens is not None:
            max_in = lim.maxInputTokens if max_in is None else min(max_in, lim.maxInputTokens)
        if lim.maxOutputTokens is not None:
            max_out = lim.maxOutputTokens if max_out is None else min(max_out, lim.maxOutputTokens)
    return RequestPolicy(tuple(requests), tuple(tokens), tuple(cost), max_in, max_out, tuple(concurrency))


def compile_governance(cfg: RouterConfig, table_default: str = "") -> GovernanceSnapshot:
    gov: GovernanceConfig = cfg.governance
    by_scope: dict[str, list[PolicyConfig]] = {}
    for pol in gov.policies:
        by_scope.setdefault(pol.scope, []).append(pol)
    compiled: dict[tuple[str, str], RequestPolicy] = {}
    if by_scope:
        for p in cfg.principals:
            for key in p.keys:
                matching = [pol for s in _scopes(p, key.id) for pol in by_scope.get(s, ())]
                if not matching:
                    continue
                for alias in p.allowedModels:
                    policy = _merge(pol for pol in matching if pol.alias in (None, alias))
                    if not policy.empty:
                        compiled[(key.id, alias)] = policy
    capacity: dict[str, tuple[Limit, ...]] = {}
    for group, q in gov.quotaGroups.items():
        limits: list[Limit] = []
        if q.rpm is not None:
            limits.append(requests_per_minute(f"quota-group:{group}", q.rpm))
        if q.tpm is not None:
            limits.append(tokens_per_minute(f"quota-group:{group}", q.tpm))
        if limits:
            capacity[group] = tuple(limits)
    return GovernanceSnapshot(
        policies=MappingProxyType(compiled),
        capacity=MappingProxyType(capacity),
        store=gov.store,
        lease_fraction=gov.leaseFraction,
        lease_wait_s=gov.leaseWaitMs / 1000,
        table=gov.table or table_default,
    )


def load_pricing_files(cfg: RouterConfig, base: Path | None = None) -> PricingSnapshot | None:
    """The snapshot compiled from ``governance.pricing``'s files, or ``None`` when none is set."""
    pricing = cfg.governance.pricing
    if not (pricing.catalogFile or pricing.overridesFile):
        return None

    def read(name: str, where: str) -> bytes:
        path = Path(name) if base is None or Path(name).is_absolute() else base / name
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ConfigError([ConfigIssue(where, f"cannot read {name!r} ({exc.strerror})")]) from None

    try:
        catalogs = (
            [parse_models_dev(read(pricing.catalogFile, "governance.pricing.catalogFile"), uri=pricing.catalogFile)]
            if pricing.catalogFile
            else []
        )
        overrides = (
            parse_overrides(read(pricing.overridesFile, "governance.pricing.overridesFile"), uri=pricing.overridesFile)
            if pricing.overridesFile
            else None
        )
        return compile_snapshot(catalogs, overrides, now=datetime.now(UTC))
    except PricingError as exc:
        raise ConfigError([ConfigIssue("governance.pricing", str(exc))]) from None


def _route_prices(cfg: RouterConfig) -> dict[str, RoutePrice]:
    out: dict[str, RoutePrice] = {}
    for model in cfg.models:
        for route in model.routes:
            provider = cfg.providers[route.provider]
            out[route.id] = RoutePrice(
                provider=provider.pricingProvider or provider.type,
                model=route.model,
                account=provider.providerAccountId or route.provider,
            )
    return out


def compile_pricing(
    snapshot: PricingSnapshot | None, aliases: Mapping[str, AliasPlan], routes: Mapping[str, RoutePrice]
) -> PricingView:
    """Each alias's worst per-token rates over its routes under ``snapshot`` (unknown when any route is)."""
    view: dict[str, AliasPrice] = {}
    for name, plan in aliases.items():
        worst_in: int | None = 0
        worst_out: int | None = 0
        for group in plan.groups:
            for t in group:
                rp = routes[t.route_id]
                if snapshot is None:
                    worst_in = worst_out = None
                    break
                per_in = reservation_cost(
                    snapshot, rp.provider, rp.model, input_tokens=_MICRO, max_output_tokens=0, account=rp.account
                )
                per_out = reservation_cost(
                    snapshot, rp.provider, rp.model, input_tokens=0, max_output_tokens=_MICRO, account=rp.account
                )
                if not isinstance(per_in, Cost) or not isinstance(per_out, Cost):
                    worst_in = worst_out = None
                    break
                if worst_in is not None and worst_out is not None:
                    worst_in = max(worst_in, per_in.amount_micro_usd)
                    worst_out = max(worst_out, per_out.amount_micro_usd)
            if worst_in is None:
                break
        view[name] = AliasPrice(worst_in, worst_out)
    return PricingView(snapshot, MappingProxyType(view), MappingProxyType(routes))


def route_prices(cfg: RouterConfig) -> Mapping[str, RoutePrice]:
    return MappingProxyType(_route_prices(cfg))
