"""``request_finished`` events carrying the usage contract, for the metering tests of every tier."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tollway.audit.events import AuditEvent, uuid7

__all__ = ["DAY_MS", "finished", "message"]

DAY_MS = int(datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp() * 1000)
"""Noon UTC on 2026-11-29."""
DIGEST = "sha256:" + "ab" * 32
_DEFAULT_USAGE = {"prompt": 100, "completion": 40, "total": 140}
_UNSET: Any = object()


def _outcome(status: Any) -> str:
    if not isinstance(status, int) or status < 400:
        return "ok"
    return "cancelled" if status == 499 else "error"


def finished(
    request_id: str,
    *,
    tenant: str = "acme",
    team: str | None = "search",
    principal: str = "svc-a",
    alias: str = "chat",
    status: Any = 200,
    usage: Mapping[str, Any] | None = _UNSET,
    evidence: str = "provider-reported",
    cost: int | None = 1500,
    ts_ms: int = DAY_MS,
    omit: Iterable[str] = (),
    **extra: Any,
) -> AuditEvent:
    """A ``request_finished`` event as the gateway will send it, with ``extra`` body fields and without ``omit``."""
    body: dict[str, Any] = {
        "principalId": principal,
        "tenantId": tenant,
        "teamId": team,
        "keyId": "key-1",
        "alias": alias,
        "status": status,
        "outcome": _outcome(status),
        "errorCode": None,
        "attempts": 1,
        "admissionMs": 0.5,
        "totalMs": 120.0,
        "usage": dict(_DEFAULT_USAGE) if usage is _UNSET else usage,
        "usageEvidence": evidence,
        "cost": cost,
        "pricingVersion": "2026-11-01.1" if cost is not None else None,
        "costEvidence": "priced" if cost is not None else None,
        "cancellation": None,
        **extra,
    }
    for name in omit:
        del body[name]
    return AuditEvent(uuid7(ts_ms), "request_finished", request_id, None, ts_ms, DIGEST, body)


def message(events: Sequence[AuditEvent]) -> str:
    """A usage-queue message as the shipper packs it: the events' own JSON, in order."""
    return '{"v":1,"events":[' + ",".join(e.encode().decode() for e in events) + "]}"
