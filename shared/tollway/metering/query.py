"""``GET /v1/usage``: who may see what, which aggregates answer, and the response body.

``?from=YYYY-MM-DD&to=YYYY-MM-DD&group_by=day|alias|principal`` (UTC days, both inclusive; default
the 30 days up to today, grouped by day). A caller sees its own scope: a principal its own usage,
a principal with the ``admin`` role its whole tenant. Grouping by principal, for a principal that is
not an admin, is one row: its own.

Which aggregate partition answers (see :mod:`tollway.metering.layout`)::

    scope       group_by    partition read                     rows
    tenant      day         agg#tenant:<t>#total               one per day with usage
    tenant      alias       agg#tenant:<t>#alias               one per alias, summed over the days
    tenant      principal   agg#tenant:<t>#principal           one per principal, summed over the days
    principal   day         agg#tenant:<t>/principal:<p>#total one per day with usage
    principal   alias       agg#tenant:<t>/principal:<p>#alias one per alias, summed over the days
    principal   principal   agg#tenant:<t>/principal:<p>#total one, the principal itself

Days without usage have no row. Everything here is pure: the ledgers do the reading.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Final, Literal

from tollway.governance.principals import Principal
from tollway.metering.exceptions import InvalidUsageQuery
from tollway.metering.layout import Dimension, UsageScope, aggregate_pk
from tollway.metering.totals import UsageTotals
from tollway.pricing.cost import usd

__all__ = [
    "ADMIN_ROLE",
    "DEFAULT_DAYS",
    "GROUP_BY",
    "MAX_QUERY_DAYS",
    "GroupBy",
    "UsageQuery",
    "UsageRow",
    "caller_scope",
    "parse_usage_query",
    "rows_from_items",
    "source_partition",
    "usage_response",
]

GroupBy = Literal["day", "alias", "principal"]
GROUP_BY: Final[tuple[GroupBy, ...]] = ("day", "alias", "principal")
ADMIN_ROLE: Final = "admin"
DEFAULT_DAYS: Final = 30
MAX_QUERY_DAYS: Final = 366
_PARAMS: Final = frozenset({"from", "to", "group_by"})
_DAY: Final = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True, slots=True)
class UsageQuery:
    scope: UsageScope
    from_day: date
    to_day: date
    group_by: GroupBy = "day"

    def __post_init__(self) -> None:
        check_range(self.from_day, self.to_day)
        if self.group_by not in GROUP_BY:
            raise InvalidUsageQuery(f"group_by must be one of {', '.join(GROUP_BY)}")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One row of a grouped answer: ``key`` is the day (ISO), the alias or the principal id."""

    key: str
    totals: UsageTotals


def check_range(from_day: date, to_day: date) -> None:
    if from_day > to_day:
        raise InvalidUsageQuery("'from' is after 'to'")
    if (to_day - from_day).days + 1 > MAX_QUERY_DAYS:
        raise InvalidUsageQuery(f"the range may span at most {MAX_QUERY_DAYS} days")


def caller_scope(principal: Principal, *, admin_role: str = ADMIN_ROLE) -> UsageScope:
    """The usage a caller may see: its tenant's with ``admin_role``, otherwise its own."""
    if admin_role in principal.roles:
        return UsageScope(principal.tenant)
    return UsageScope(principal.tenant, principal.id)


def _day(params: Mapping[str, str], name: str) -> date | None:
    text = params.get(name)
    if text is None:
        return None
    if not _DAY.fullmatch(text):
        raise InvalidUsageQuery(f"'{name}' must be a date as YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidUsageQuery(f"'{name}' is not a calendar date") from None


def parse_usage_query(params: Mapping[str, str], *, scope: UsageScope, today: date) -> UsageQuery:
    """The query of ``GET /v1/usage``'s parameters for a caller whose scope is ``scope``.

    ``today`` is the current UTC day (the caller's clock). Unknown parameters are rejected.
    """
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise InvalidUsageQuery(f"unknown query parameter(s): {', '.join(repr(u[:40]) for u in unknown[:5])}")
    to_day = _day(params, "to") or today
    from_day = _day(params, "from") or to_day - timedelta(days=DEFAULT_DAYS - 1)
    group_by = params.get("group_by", "day")
    if group_by not in GROUP_BY:
        raise InvalidUsageQuery(f"group_by must be one of {', '.join(GROUP_BY)}")
    return UsageQuery(scope, from_day, to_day, group_by)


def source_partition(scope: UsageScope, group_by: GroupBy) -> str:
    """The aggregate partition that answers ``group_by`` for ``scope`` (see the module docstring)."""
    dim: Dimension
    if group_by == "day":
        dim = "total"
    elif group_by == "alias":
        dim = "alias"
    else:
        dim = "principal" if scope.principal_id is None else "total"
    return aggregate_pk(scope.key, dim)


def rows_from_items(items: Iterable[Mapping[str, Any]], query: UsageQuery) -> list[UsageRow]:
    """Aggregate items of :func:`source_partition` (plain values) as rows, sorted by key, days in range only."""
    lo, hi = query.from_day.isoformat(), query.to_day.isoformat()
    sums: dict[str, UsageTotals] = {}
    for item in items:
        day = item.get("day")
        if not isinstance(day, str) or not lo <= day <= hi:
            continue
        if query.group_by == "day":
            key = day
        elif query.group_by == "principal" and query.scope.principal_id is not None:
            key = query.scope.principal_id
        else:
            value = item.get("value")
            if not isinstance(value, str):
                continue
            key = value
        sums[key] = sums.get(key, UsageTotals()) + UsageTotals.from_item(item)
    return [UsageRow(k, sums[k]) for k in sorted(sums)]


def _bucket(group_by: GroupBy, row: UsageRow) -> dict[str, Any]:
    t = row.totals
    return {
        "object": "usage.bucket",
        group_by: row.key,
        "requests": t.requests,
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "total_tokens": t.total_tokens,
        "cached_tokens": t.cached_tokens,
        "reasoning_tokens": t.reasoning_tokens,
        "cost_usd": usd(t.cost_micro_usd),
        "cost_micro_usd": t.cost_micro_usd,
        "unknown_cost_requests": t.unknown_cost_requests,
        "usage_evidence": dict(t.evidence),
        "status": dict(t.statuses),
    }


def usage_response(query: UsageQuery, rows: Sequence[UsageRow]) -> dict[str, Any]:
    """The JSON body of ``GET /v1/usage``: an OpenAI-style list of buckets, one per row.

    ``cost_usd`` is a decimal string (exact; a float would round), ``cost_micro_usd`` the integer.
    """
    return {
        "object": "list",
        "data": [_bucket(query.group_by, r) for r in rows],
        "from": query.from_day.isoformat(),
        "to": query.to_day.isoformat(),
        "group_by": query.group_by,
        "scope": {"tenant": query.scope.tenant_id, "principal": query.scope.principal_id},
    }
