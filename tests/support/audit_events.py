"""Audit events for tests and benches: each kind built here once, through the gateway's own builders.

Every builder calls its namesake in :mod:`tollway.audit.events`, the functions the recorder calls,
so an event is exactly what the gateway appends; the defaults fill in the metadata a test does not
look at, and a caller names only what it asserts on. ``ts`` pins the event's timestamp (epoch
milliseconds; ``None`` keeps the builder's clock). ``finished`` defaults to another team and alias
than ``admitted``, so that a test can tell which of the two a request's identity was taken from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from tollway.audit import events
from tollway.audit.events import AuditEvent

__all__ = [
    "DIGEST",
    "PRICING_VERSION",
    "USAGE",
    "admitted",
    "attempt_done",
    "finished",
    "message",
    "rejected",
    "request_events",
    "started",
]

DIGEST: Final = "sha256:" + "ab" * 32
PRICING_VERSION: Final = "models.dev@2026-11-28"
USAGE: Final[Mapping[str, int]] = {"promptTokens": 11, "completionTokens": 7, "totalTokens": 18}
"""Token counts under the names the recorder writes."""


def _caller(principal_id: str = "p-1", team: str | None = "core") -> dict[str, Any]:
    """Who sent the request: the identity fields of every request-level event."""
    return {"principal_id": principal_id, "tenant": "t-1", "team": team, "key_id": "k-1"}


def _attempt(request_id: str, attempt: int, deployment_id: str | None) -> dict[str, Any]:
    """Which attempt an attempt-level event is of: the fields its start and its finish share."""
    return {
        "request_id": request_id,
        "root_digest": DIGEST,
        "attempt": attempt,
        "route_id": f"route-{attempt}",
        "deployment_id": deployment_id or f"dep-{attempt}",
    }


def _at(event: AuditEvent, ts: int | None) -> AuditEvent:
    return event if ts is None else dataclasses.replace(event, ts_ms=ts)


def admitted(
    request_id: str,
    ts: int | None = None,
    *,
    principal_id: str = "p-1",
    team: str | None = "core",
    stream: bool = True,
    max_attempts: int = 3,
) -> AuditEvent:
    event = events.request_admitted(
        request_id=request_id,
        root_digest=DIGEST,
        **_caller(principal_id, team),
        alias="chat",
        stream=stream,
        content_mode="metadata-only",
        max_attempts=max_attempts,
    )
    return _at(event, ts)


def started(
    request_id: str,
    attempt: int,
    ts: int | None = None,
    *,
    reason: Literal["first", "retry", "fallback", "continuation"] = "first",
    deployment_id: str | None = None,
    priced: bool = False,
) -> AuditEvent:
    """Attempt ``attempt``, on route ``route-<attempt>`` and on ``dep-<attempt>`` unless ``deployment_id`` names one."""
    event = events.attempt_started(
        **_attempt(request_id, attempt, deployment_id),
        provider_format="openai-chat-completions",
        physical_model="phys",
        reason=reason,
        pricing_version=PRICING_VERSION if priced else None,
    )
    return _at(event, ts)


def attempt_done(
    request_id: str,
    attempt: int,
    ts: int | None = None,
    outcome: str = "ok",
    status: int = 200,
    *,
    first_token_ms: float = 12.5,
    total_ms: float = 40.25,
    connect_ms: float | None = None,
    deployment_id: str | None = None,
) -> AuditEvent:
    """The end of ``started``'s attempt, upstream ``status``. An attempt that is not ``ok`` failed
    before its first token, as ``overloaded``; an ``ok`` one has no error category."""
    ok = outcome == "ok"
    event = events.attempt_finished(
        **_attempt(request_id, attempt, deployment_id),
        outcome=outcome,
        error_category=None if ok else "overloaded",
        upstream_status=status,
        first_token_ms=first_token_ms if ok else None,
        total_ms=total_ms,
        connect_ms=connect_ms,
    )
    return _at(event, ts)


def finished(
    request_id: str,
    ts: int | None = None,
    *,
    attempts: int = 1,
    total_ms: float = 99.75,
    usage: Mapping[str, int] = USAGE,
    priced: bool = False,
) -> AuditEvent:
    """A request answered 200 after ``attempts`` attempts. ``priced``: with the cost and pricing
    fields the gateway adds once a price catalog is published."""
    event = events.request_finished(
        request_id=request_id,
        root_digest=DIGEST,
        status=200,
        outcome="ok",
        error_code=None,
        attempts=attempts,
        admission_ms=0.5,
        total_ms=total_ms,
        usage=usage,
        usage_evidence="provider-reported",
        cancellation=None,
        **_caller(team=None),
        alias="chat-fast-v1",
        cost_micro_usd=220 if priced else None,
        pricing_version=PRICING_VERSION if priced else None,
        pricing_tier="standard" if priced else None,
        cost_evidence="provider-reported" if priced else None,
    )
    return _at(event, ts)


def rejected(request_id: str, ts: int | None = None, *, alias: str | None = "chat", status: int = 429) -> AuditEvent:
    """A request rate-limited (or, with another ``status``, refused) before admission, by ``admitted``'s caller."""
    event = events.request_rejected(
        request_id=request_id,
        root_digest=DIGEST,
        **_caller(),
        alias=alias,
        status=status,
        error_code="rate_limited",
        stream=None,
    )
    return _at(event, ts)


def request_events(request_id: str, attempts: int, *, priced: bool = False) -> list[bytes]:
    """One logical request's events in append order, encoded: admitted, (started, finished) per
    attempt, finished. Every attempt but the last fails with a 503 and is retried.

    ``priced``: with the pricing fields the gateway adds once a price catalog is published (the
    pricing version on each attempt, the cost on ``request_finished``), as ``bench.ship`` ships."""
    out = [admitted(request_id, stream=attempts % 2 == 0)]
    for n in range(1, attempts + 1):
        last = n == attempts
        out.append(started(request_id, n, reason="first" if n == 1 else "retry", priced=priced))
        out.append(attempt_done(request_id, n, outcome="ok" if last else "error", status=200 if last else 503))
    out.append(finished(request_id, attempts=attempts, priced=priced))
    return [e.encode() for e in out]


def message(batch: Sequence[AuditEvent]) -> str:
    """A queue message as the WAL shipper packs it: the events' own JSON, in order."""
    return '{"v":1,"events":[' + ",".join(e.encode().decode() for e in batch) + "]}"
