"""The usage contract: what the reconciler reads from a ``request_finished`` audit event.

The event envelope is :class:`tollway.audit.events.AuditEvent` (``eventId``, ``requestId`` and the
epoch-ms ``ts`` come from it); the body fields are::

    required  principalId    str, 1-256 chars
              tenantId       str, 1-256 chars
              alias          str, 1-256 chars
              status         int, 100-599 (499: the client went away)
              outcome        str, 1-64 chars
              usage          object or null: int prompt, completion, total; optional int cached, reasoning
              usageEvidence  "provider-reported" | "local-estimate" | "unknown"
    optional  teamId         str or null
              keyId          str or null
              cost           int micro-USD (>= 0) or null: null or absent means the cost is unknown
              pricingVersion str or null
              costEvidence   str or null

Token counts are ints from 0 to 10^12. For ``usage`` the recorder's current names
(``promptTokens``, ``completionTokens``, ``totalTokens``, ``cachedPromptTokens``,
``reasoningTokens``) and OpenAI's (``prompt_tokens``, ...) are accepted as well as the short
ones; the first name present wins. A missing required field, a wrong type or an out-of-range
value raises :class:`MalformedUsageEvent`; any other body field is ignored. Events of other kinds
are not usage: :func:`usage_record` returns ``None`` for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Final, Literal, cast

from tollway.audit.events import USAGE_TOKEN_NAMES, AuditEvent
from tollway.metering.exceptions import MalformedUsageEvent

__all__ = ["EVIDENCE", "STATUS_CLASSES", "Evidence", "StatusClass", "UsageRecord", "usage_record"]

Evidence = Literal["provider-reported", "local-estimate", "unknown"]
EVIDENCE: Final[tuple[Evidence, ...]] = ("provider-reported", "local-estimate", "unknown")
StatusClass = Literal["2xx", "4xx", "5xx", "499", "other"]
STATUS_CLASSES: Final[tuple[StatusClass, ...]] = ("2xx", "4xx", "5xx", "499", "other")

USAGE_KIND: Final = "request_finished"
MAX_ID_CHARS: Final = 256
MAX_OUTCOME_CHARS: Final = 64
MAX_TOKENS: Final = 10**12
MAX_COST_MICRO_USD: Final = 10**15
"""One billion USD: anything above is a bug upstream, not a bill."""
_MAX_TS_MS: Final = 253_402_300_800_000
_TOKEN_NAMES: Final[dict[str, tuple[str, ...]]] = {short: (short, *names) for short, names in USAGE_TOKEN_NAMES.items()}
_REQUIRED_TOKENS: Final = ("prompt", "completion", "total")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One logical request's usage, as the ledger accounts it."""

    event_id: str
    request_id: str
    ts_ms: int
    tenant_id: str
    team_id: str | None
    principal_id: str
    key_id: str | None
    alias: str
    status: int
    outcome: str
    usage_evidence: Evidence
    has_usage: bool
    """False when the event's ``usage`` was null: the token counts are then all 0."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_micro_usd: int | None = None
    """``None``: the cost is unknown (never silently zero)."""
    pricing_version: str | None = None
    cost_evidence: str | None = None

    @property
    def day(self) -> date:
        """The UTC day of the event's ``ts``: the aggregate bucket it counts in."""
        return datetime.fromtimestamp(self.ts_ms / 1000, UTC).date()

    @property
    def status_class(self) -> StatusClass:
        """``499`` is its own class (a client disconnect is not a 4xx the gateway chose)."""
        if self.status == 499:
            return "499"
        if 200 <= self.status < 300:
            return "2xx"
        if 400 <= self.status < 500:
            return "4xx"
        if 500 <= self.status < 600:
            return "5xx"
        return "other"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(body: Mapping[str, Any], name: str, where: str, *, required: bool, limit: int = MAX_ID_CHARS) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise MalformedUsageEvent(f"{where}: body lacks {name!r}")
        return None
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise MalformedUsageEvent(f"{where}: body field {name!r} must be a string of 1-{limit} characters")
    return value


def _tokens(usage: Mapping[str, Any], where: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for field, names in _TOKEN_NAMES.items():
        name = next((n for n in names if n in usage), None)
        if name is None:
            if field in _REQUIRED_TOKENS:
                raise MalformedUsageEvent(f"{where}: usage lacks {field!r}")
            continue
        value = usage[name]
        if not _is_int(value) or not 0 <= value <= MAX_TOKENS:
            raise MalformedUsageEvent(f"{where}: usage field {name!r} must be an integer of 0-{MAX_TOKENS}")
        counts[field] = value
    return counts


def _cost(body: Mapping[str, Any], where: str) -> int | None:
    value = body.get("cost")
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_COST_MICRO_USD:
        raise MalformedUsageEvent(f"{where}: body field 'cost' must be integer micro-USD of 0-{MAX_COST_MICRO_USD}")
    return cast(int, value)


def usage_record(event: AuditEvent) -> UsageRecord | None:
    """The usage of a ``request_finished`` event; ``None`` for any other kind. Raises :class:`MalformedUsageEvent`."""
    if event.kind != USAGE_KIND:
        return None
    where = f"{event.kind} event {event.event_id[:MAX_ID_CHARS]}"
    if not 0 < len(event.event_id) <= MAX_ID_CHARS or not 0 < len(event.request_id) <= MAX_ID_CHARS:
        raise MalformedUsageEvent(f"{event.kind} event: eventId and requestId must be 1-{MAX_ID_CHARS} characters")
    if not 0 <= event.ts_ms < _MAX_TS_MS:
        raise MalformedUsageEvent(f"{where}: ts is out of range")
    body = event.body
    status = body.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise MalformedUsageEvent(f"{where}: body field 'status' must be an HTTP status code")
    evidence = body.get("usageEvidence")
    if evidence not in EVIDENCE:
        raise MalformedUsageEvent(f"{where}: body field 'usageEvidence' must be one of {', '.join(EVIDENCE)}")
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, Mapping):
        raise MalformedUsageEvent(f"{where}: body field 'usage' must be an object or null")
    if "usage" not in body:
        raise MalformedUsageEvent(f"{where}: body lacks 'usage'")
    tokens = {} if usage is None else _tokens(usage, where)
    return UsageRecord(
        event_id=event.event_id,
        request_id=event.request_id,
        ts_ms=event.ts_ms,
        tenant_id=cast(str, _text(body, "tenantId", where, required=True)),
        team_id=_text(body, "teamId", where, required=False),
        principal_id=cast(str, _text(body, "principalId", where, required=True)),
        key_id=_text(body, "keyId", where, required=False),
        alias=cast(str, _text(body, "alias", where, required=True)),
        status=status,
        outcome=cast(str, _text(body, "outcome", where, required=True, limit=MAX_OUTCOME_CHARS)),
        usage_evidence=cast(Evidence, evidence),
        has_usage=usage is not None,
        prompt_tokens=tokens.get("prompt", 0),
        completion_tokens=tokens.get("completion", 0),
        total_tokens=tokens.get("total", 0),
        cached_tokens=tokens.get("cached", 0),
        reasoning_tokens=tokens.get("reasoning", 0),
        cost_micro_usd=_cost(body, where),
        pricing_version=_text(body, "pricingVersion", where, required=False),
        cost_evidence=_text(body, "costEvidence", where, required=False),
    )
