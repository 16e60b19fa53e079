"""Reading: items (plain Python values) as requests and attempts.

Every reader goes through here, and none assumes an attribute is present except the keys: an item
can be read before all its events are stored, or (on the local cloud, which applies an update's
actions one by one) while an update is still being applied. The request id comes from the
partition key; every other field is ``None`` when absent or of the wrong type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tollway.audit.store.layout import ATTEMPT_SK_PREFIX, REQUEST_SK, request_id_of

__all__ = ["AttemptView", "RequestRecord", "RequestView", "attempt_view", "request_record", "request_view"]


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One physical attempt. ``started_at_ms`` is ``None`` while its ``attempt_started`` is not stored."""

    number: int
    started_at_ms: int | None
    finished_at_ms: int | None
    route_id: str | None = None
    deployment_id: str | None = None
    provider_format: str | None = None
    physical_model: str | None = None
    reason: str | None = None
    outcome: str | None = None
    error_category: str | None = None
    upstream_status: int | None = None
    connect_ms: float | None = None
    first_token_ms: float | None = None
    total_ms: float | None = None
    cancelled: bool | None = None
    expires_at: int | None = None

    @property
    def incomplete(self) -> bool:
        """No ``attempt_finished``: the attempt's outcome is unknown (a crash, or still in flight)."""
        return self.finished_at_ms is None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One logical request. ``admitted_at_ms`` is ``None`` while its ``request_admitted`` is not stored.

    A request rejected before admission has ``rejected_at_ms`` and no attempts: it is complete.
    """

    request_id: str
    admitted_at_ms: int | None
    finished_at_ms: int | None
    principal_id: str | None = None
    tenant_id: str | None = None
    team_id: str | None = None
    key_id: str | None = None
    alias: str | None = None
    operation: str | None = None
    stream: bool | None = None
    content_mode: str | None = None
    max_attempts: int | None = None
    root_digest: str | None = None
    trace_id: str | None = None
    """The request's OpenTelemetry trace id, when it was traced."""
    status: int | None = None
    outcome: str | None = None
    error_code: str | None = None
    attempt_count: int | None = None
    admission_ms: float | None = None
    total_ms: float | None = None
    usage: dict[str, int] | None = None
    usage_evidence: str | None = None
    cost: int | None = None
    """Integer micro-USD (``None``: unknown)."""
    pricing_version: str | None = None
    cancellation: str | None = None
    pii: dict[str, Any] | None = None
    """The PII manifest, for a request under a PII profile (docs/pii.md)."""
    expires_at: int | None = None
    rejected_at_ms: int | None = None
    """When its ``request_rejected`` was appended: answered 4xx before admission."""
    content: dict[str, Any] | None = None
    """The reference to its captured content (``tollway.content.ContentRef.to_body()``), if stored."""
    content_dropped: dict[str, Any] | None = None
    """``{"mode", "reason"}`` when its content was to be captured but was not."""
    content_deleted: dict[str, Any] | None = None
    """Deletion evidence: ``{"deletedBy", "reason", "existed"}``; ``content_deleted_at_ms`` says when."""
    content_deleted_at_ms: int | None = None
    export_manifest: dict[str, Any] | None = None
    """For an export job's record (``operation: dataset.export``): its manifest's summary."""

    @property
    def rejected(self) -> bool:
        return self.rejected_at_ms is not None

    @property
    def incomplete(self) -> bool:
        """No terminal event: no ``request_finished``, and not rejected."""
        return self.finished_at_ms is None and self.rejected_at_ms is None

    @property
    def at_ms(self) -> int | None:
        """When the request entered the record: admitted, else rejected."""
        return self.admitted_at_ms if self.admitted_at_ms is not None else self.rejected_at_ms


@dataclass(frozen=True, slots=True)
class RequestView:
    request: RequestRecord
    attempts: tuple[AttemptView, ...]
    """Ordered by attempt number."""

    @property
    def incomplete(self) -> bool:
        return self.request.incomplete or any(a.incomplete for a in self.attempts)


def _str(item: Mapping[str, Any], key: str) -> str | None:
    value = item.get(key)
    return value if isinstance(value, str) else None


def _int(item: Mapping[str, Any], key: str) -> int | None:
    value = item.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(item: Mapping[str, Any], key: str) -> float | None:
    value = item.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bool(item: Mapping[str, Any], key: str) -> bool | None:
    value = item.get(key)
    return value if isinstance(value, bool) else None


def _usage(item: Mapping[str, Any]) -> dict[str, int] | None:
    value = item.get("usage")
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def _pii(item: Mapping[str, Any]) -> dict[str, Any] | None:
    value = item.get("pii")
    if not isinstance(value, dict):
        return None
    return {str(k): _plain(v) for k, v in value.items()}


def _map(item: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = item.get(key)
    return _plain(value) if isinstance(value, dict) else None


def _plain(value: Any) -> Any:
    """DynamoDB's numbers are ``Decimal``s: the manifest's counts come back as ints."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def request_record(item: Mapping[str, Any], request_id: str | None = None) -> RequestRecord:
    """The request of a ``REQUEST`` item, however little of it is stored; the id from its key."""
    rid = request_id or request_id_of(item.get("pk")) or _str(item, "requestId") or ""
    return RequestRecord(
        request_id=rid,
        admitted_at_ms=_int(item, "admittedAt"),
        finished_at_ms=_int(item, "finishedAt"),
        principal_id=_str(item, "principalId"),
        tenant_id=_str(item, "tenantId"),
        team_id=_str(item, "teamId"),
        key_id=_str(item, "keyId"),
        alias=_str(item, "alias"),
        operation=_str(item, "operation"),
        stream=_bool(item, "stream"),
        content_mode=_str(item, "contentMode"),
        max_attempts=_int(item, "maxAttempts"),
        root_digest=_str(item, "rootDigest"),
        trace_id=_str(item, "traceId"),
        status=_int(item, "status"),
        outcome=_str(item, "outcome"),
        error_code=_str(item, "errorCode"),
        attempt_count=_int(item, "attempts"),
        admission_ms=_float(item, "admissionMs"),
        total_ms=_float(item, "totalMs"),
        usage=_usage(item),
        usage_evidence=_str(item, "usageEvidence"),
        cost=_int(item, "cost"),
        pricing_version=_str(item, "pricingVersion"),
        cancellation=_str(item, "cancellation"),
        pii=_pii(item),
        expires_at=_int(item, "expiresAt"),
        rejected_at_ms=_int(item, "rejectedAt"),
        content=_map(item, "content"),
        content_dropped=_map(item, "contentDropped"),
        content_deleted=_map(item, "contentDeleted"),
        content_deleted_at_ms=_int(item, "contentDeletedAt"),
        export_manifest=_map(item, "exportManifest"),
    )


def _attempt_number(sk: str) -> int | None:
    digits = sk.removeprefix(ATTEMPT_SK_PREFIX)
    return int(digits) if digits.isascii() and digits.isdigit() else None


def attempt_view(item: Mapping[str, Any]) -> AttemptView | None:
    """The attempt of an ``ATTEMPT#nnnn`` item; ``None`` for a sort key that names no attempt."""
    sk = item.get("sk")
    number = _attempt_number(sk) if isinstance(sk, str) and sk.startswith(ATTEMPT_SK_PREFIX) else None
    if number is None:
        return None
    return AttemptView(
        number=number,
        started_at_ms=_int(item, "startedAt"),
        finished_at_ms=_int(item, "finishedAt"),
        route_id=_str(item, "routeId"),
        deployment_id=_str(item, "deploymentId"),
        provider_format=_str(item, "providerFormat"),
        physical_model=_str(item, "physicalModel"),
        reason=_str(item, "reason"),
        outcome=_str(item, "outcome"),
        error_category=_str(item, "errorCategory"),
        upstream_status=_int(item, "upstreamStatus"),
        connect_ms=_float(item, "connectMs"),
        first_token_ms=_float(item, "firstTokenMs"),
        total_ms=_float(item, "totalMs"),
        cancelled=_bool(item, "cancelled"),
        expires_at=_int(item, "expiresAt"),
    )


def request_view(request_id: str, items: Iterable[Mapping[str, Any]]) -> RequestView | None:
    """The view of one request's items; ``None`` when there are none."""
    request: Mapping[str, Any] | None = None
    attempts: list[AttemptView] = []
    seen = False
    for item in items:
        seen = True
        if item.get("sk") == REQUEST_SK:
            request = item
        elif (attempt := attempt_view(item)) is not None:
            attempts.append(attempt)
    if not seen:
        return None
    record = request_record(request or {}, request_id)
    return RequestView(record, tuple(sorted(attempts, key=lambda a: a.number)))
