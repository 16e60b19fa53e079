"""The usage-ledger table's item layout (string keys ``pk``/``sk``, TTL attribute ``expiresAt``).

One ledger item per logical request, and per-UTC-day aggregate items per scope and breakdown::

    pk = req#<requestId>                         sk = usage                  the request's usage (expires)
    pk = agg#tenant:<t>#total                    sk = day#<YYYY-MM-DD>        tenant per day
    pk = agg#tenant:<t>#alias                    sk = day#<YYYY-MM-DD>#<a>    tenant x alias per day
    pk = agg#tenant:<t>#principal                sk = day#<YYYY-MM-DD>#<p>    tenant x principal per day
    pk = agg#tenant:<t>/team:<m>#total           sk = day#<YYYY-MM-DD>        team per day (when the request has one)
    pk = agg#tenant:<t>/principal:<p>#total      sk = day#<YYYY-MM-DD>        principal per day
    pk = agg#tenant:<t>/principal:<p>#alias      sk = day#<YYYY-MM-DD>#<a>    principal x alias per day

Every id in a key is percent-encoded (:func:`urllib.parse.quote` with no safe characters), so
``/``, ``:``, ``#`` inside an id cannot forge another scope, and keys stay ASCII. One partition
per (scope, breakdown) keeps each query to the items it needs; the day leads the sort key, so a
date range is one ``Query`` with ``sk BETWEEN day#<from> AND day#<to>$`` (``$`` sorts right after
``#``, so it bounds both ``day#<to>`` and ``day#<to>#...``). Principals and teams are scoped by
tenant: the same id in two tenants never shares a counter.

Aggregate items also hold their labels as plain attributes (``scope``, ``dim``, ``day`` and, in a
breakdown, ``value``, the id unencoded), so reading needs no key parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import quote

from tollway.metering.record import UsageRecord
from tollway.metering.totals import increments

__all__ = [
    "LEDGER_SK",
    "Dimension",
    "Increment",
    "Plan",
    "UsageScope",
    "aggregate_pk",
    "day_range",
    "day_sk",
    "ledger_pk",
    "plan",
]

LEDGER_SK: Final = "usage"
Dimension = Literal["total", "alias", "principal"]
_DAY_S: Final = 86_400


def _q(value: str) -> str:
    return quote(value, safe="")


@dataclass(frozen=True, slots=True)
class UsageScope:
    """Whose usage: a tenant's (``principal_id`` ``None``) or one principal's within its tenant."""

    tenant_id: str
    principal_id: str | None = None

    @property
    def key(self) -> str:
        tenant = f"tenant:{_q(self.tenant_id)}"
        return tenant if self.principal_id is None else f"{tenant}/principal:{_q(self.principal_id)}"


def ledger_pk(request_id: str) -> str:
    return f"req#{request_id}"


def aggregate_pk(scope_key: str, dim: Dimension) -> str:
    return f"agg#{scope_key}#{dim}"


def day_sk(day: date, value: str | None = None) -> str:
    return f"day#{day.isoformat()}" if value is None else f"day#{day.isoformat()}#{_q(value)}"


def day_range(from_day: date, to_day: date) -> tuple[str, str]:
    """The ``sk BETWEEN`` bounds that hold every aggregate of the days ``from_day``..``to_day``."""
    return f"day#{from_day.isoformat()}", f"day#{to_day.isoformat()}$"


@dataclass(frozen=True, slots=True)
class Increment:
    """``ADD counters`` to one aggregate item, and ``SET labels`` (the same values on every write)."""

    pk: str
    sk: str
    labels: dict[str, str]
    counters: dict[str, int]
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class Plan:
    """Every write of one request: the ledger item (put only if absent) and its aggregate increments."""

    ledger_item: dict[str, Any]
    increments: tuple[Increment, ...]


def _epoch_s(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def plan(record: UsageRecord, *, retention_days: int, aggregate_retention_days: int | None) -> Plan:
    """The writes for ``record``. Ledger items expire ``retention_days`` after the event; aggregates
    ``aggregate_retention_days`` after the end of their day, or never (``None``)."""
    day = record.day
    counters = increments(record)
    agg_expires = (
        None
        if aggregate_retention_days is None
        else _epoch_s(day + timedelta(days=1)) + aggregate_retention_days * _DAY_S
    )
    tenant = UsageScope(record.tenant_id)
    principal = UsageScope(record.tenant_id, record.principal_id)
    targets: list[tuple[str, Dimension, str | None]] = [
        (tenant.key, "total", None),
        (tenant.key, "alias", record.alias),
        (tenant.key, "principal", record.principal_id),
        (principal.key, "total", None),
        (principal.key, "alias", record.alias),
    ]
    if record.team_id is not None:
        targets.append((f"{tenant.key}/team:{_q(record.team_id)}", "total", None))
    aggregates = []
    for scope_key, dim, value in targets:
        labels = {"scope": scope_key, "dim": dim, "day": day.isoformat()}
        if value is not None:
            labels["value"] = value
        aggregates.append(
            Increment(aggregate_pk(scope_key, dim), day_sk(day, value), labels, dict(counters), agg_expires)
        )
    ledger_item: dict[str, Any] = {
        "pk": ledger_pk(record.request_id),
        "sk": LEDGER_SK,
        "requestId": record.request_id,
        "eventId": record.event_id,
        "ts": record.ts_ms,
        "day": day.isoformat(),
        "tenantId": record.tenant_id,
        "teamId": record.team_id,
        "principalId": record.principal_id,
        "keyId": record.key_id,
        "alias": record.alias,
        "status": record.status,
        "statusClass": record.status_class,
        "outcome": record.outcome,
        "usageEvidence": record.usage_evidence,
        "usage": None
        if not record.has_usage
        else {
            "prompt": record.prompt_tokens,
            "completion": record.completion_tokens,
            "total": record.total_tokens,
            "cached": record.cached_tokens,
            "reasoning": record.reasoning_tokens,
        },
        "costMicroUsd": record.cost_micro_usd,
        "pricingVersion": record.pricing_version,
        "costEvidence": record.cost_evidence,
        "expiresAt": record.ts_ms // 1000 + retention_days * _DAY_S,
    }
    return Plan(ledger_item, tuple(aggregates))
