"""Audit events: the metadata-only record of one logical request and its physical attempts.

Four kinds, appended in this order for an admitted request (a stream yields one summarized
attempt, never a record per chunk)::

    request_admitted  → (attempt_started → attempt_finished)+ → request_finished

A crash can leave an ``attempt_started`` without its ``attempt_finished``; the store reports that
attempt as incomplete. A request answered 4xx after authentication but before admission (a bad
body, an unknown or forbidden alias, a body too large, a rate limit or budget) is one
``request_rejected`` event instead, and nothing else.

Every event is one UTF-8 JSON object, the WAL record payload and the unit the sink writes
idempotently by ``eventId``::

    {"schemaVersion": 1, "eventId": "<uuidv7>", "kind": "attempt_started",
     "requestId": "<x-request-id>", "attempt": 1 | null, "ts": <epoch ms>,
     "rootDigest": "<published root sha256>", "body": {...}}

Bodies carry metadata only: identities as references, routing ids, timings, outcome, usage with
its evidence, and the content mode. They never carry a prompt, completion, tool argument,
provider error body, credential or PII: the builders below take typed metadata, never a request
or response object, so content cannot reach an event by accident.

Schema evolution is additive within ``schemaVersion``; readers skip unknown kinds and ignore
unknown body fields.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

__all__ = [
    "EVENT_KINDS",
    "KNOWN_KINDS",
    "SCHEMA_VERSION",
    "USAGE_TOKEN_NAMES",
    "AuditEvent",
    "EventKind",
    "attempt_finished",
    "attempt_started",
    "content_deleted",
    "content_dropped",
    "content_stored",
    "decode_event",
    "export_finished",
    "request_admitted",
    "request_finished",
    "request_rejected",
    "usage_counts",
    "uuid7",
]

SCHEMA_VERSION: Final = 1
EventKind = Literal[
    "request_admitted",
    "attempt_started",
    "attempt_finished",
    "request_finished",
    "request_rejected",
    "content_stored",
    "content_dropped",
    "content_deleted",
    "export_finished",
]
EVENT_KINDS: Final[tuple[EventKind, ...]] = (
    "request_admitted",
    "attempt_started",
    "attempt_finished",
    "request_finished",
)
"""An admitted request's kinds, in append order."""
CONTENT_KINDS: Final[tuple[EventKind, ...]] = ("content_stored", "content_dropped", "content_deleted")
"""What became of a request's captured content (``contentMode``), appended after its terminal event."""
KNOWN_KINDS: Final[tuple[EventKind, ...]] = (*EVENT_KINDS, "request_rejected", *CONTENT_KINDS, "export_finished")
"""Every kind this schema version defines; readers skip the others."""
USAGE_TOKEN_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "prompt": ("promptTokens", "prompt_tokens"),
    "completion": ("completionTokens", "completion_tokens"),
    "total": ("totalTokens", "total_tokens"),
    "cached": ("cachedPromptTokens", "cached_prompt_tokens"),
    "reasoning": ("reasoningTokens", "reasoning_tokens"),
}
"""``request_finished``'s ``usage`` counts by short name: the name the recorder writes, then
OpenAI's, which readers accept as well (the first present wins)."""
ContentMode = Literal["metadata-only", "disabled", "tokenized-content", "encrypted-raw"]
UsageEvidenceName = Literal["provider-reported", "local-estimate", "unknown"]


def uuid7(now_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then 74 random bits; sorts by time.

    Built from bytes rather than through ``uuid.UUID``: it runs four times per request on the
    hot path, and the object round trip cost more than the rest of the event (bench py-spy).
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    b = bytearray((ms & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + os.urandom(10))
    b[6] = 0x70 | (b[6] & 0x0F)  # version 7
    b[8] = 0x80 | (b[8] & 0x3F)  # RFC 9562 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def usage_counts(usage: Mapping[str, Any]) -> dict[str, int]:
    """The integer token counts of a ``usage`` object by short name (``prompt``, ``completion``,
    ``total``, ``cached``, ``reasoning``), in that order; a count that is absent is left out."""
    counts: dict[str, int] = {}
    for short, names in USAGE_TOKEN_NAMES.items():
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                counts[short] = value
                break
    return counts


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One decoded event. ``body`` is the kind's metadata (see the builders)."""

    event_id: str
    kind: str
    request_id: str
    attempt: int | None
    ts_ms: int
    root_digest: str
    body: Mapping[str, Any]
    schema_version: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "schemaVersion": self.schema_version,
                "eventId": self.event_id,
                "kind": self.kind,
                "requestId": self.request_id,
                "attempt": self.attempt,
                "ts": self.ts_ms,
                "rootDigest": self.root_digest,
                "body": self.body,
            }
        )


def decode_event(payload: bytes) -> AuditEvent:
    """Parse one event; raises ``ValueError`` on a payload that is not a schema-1 event object.

    An unknown ``kind`` decodes fine (readers decide to skip it); a missing envelope field does not.
    """
    try:
        raw = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"audit event is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("audit event is not a JSON object")
    try:
        version, event_id, kind = raw["schemaVersion"], raw["eventId"], raw["kind"]
        request_id, attempt, ts, digest, body = (
            raw["requestId"],
            raw.get("attempt"),
            raw["ts"],
            raw["rootDigest"],
            raw["body"],
        )
    except KeyError as exc:
        raise ValueError(f"audit event lacks {exc.args[0]!r}") from None
    if version != SCHEMA_VERSION:
        raise ValueError(f"audit event schemaVersion {version!r} is not supported")
    if not (isinstance(event_id, str) and isinstance(kind, str) and isinstance(request_id, str)):
        raise ValueError("audit event ids and kind must be strings")
    if attempt is not None and not isinstance(attempt, int):
        raise ValueError("audit event attempt must be an integer or null")
    if not isinstance(ts, int) or not isinstance(digest, str) or not isinstance(body, dict):
        raise ValueError("audit event ts, rootDigest or body has the wrong type")
    return AuditEvent(event_id, kind, request_id, attempt, ts, digest, body, version)


def _event(kind: EventKind, request_id: str, attempt: int | None, root_digest: str, body: dict[str, Any]) -> AuditEvent:
    now = int(time.time() * 1000)
    return AuditEvent(uuid7(now), kind, request_id, attempt, now, root_digest, body)


def _caller(principal_id: str, tenant: str, team: str | None, key_id: str, alias: str | None) -> dict[str, Any]:
    """Who sent a request and which alias it named: the same fields on every request-level event."""
    return {"principalId": principal_id, "tenantId": tenant, "teamId": team, "keyId": key_id, "alias": alias}


def request_admitted(
    *,
    request_id: str,
    root_digest: str,
    principal_id: str,
    tenant: str,
    team: str | None,
    key_id: str,
    alias: str,
    stream: bool,
    content_mode: ContentMode,
    max_attempts: int,
    trace_id: str | None = None,
    operation: str = "chat.completions",
) -> AuditEvent:
    """``operation`` is the API the client called: ``chat.completions``, ``messages``,
    ``responses`` or ``embeddings``."""
    body: dict[str, Any] = {
        **_caller(principal_id, tenant, team, key_id, alias),
        "operation": operation,
        "stream": stream,
        "contentMode": content_mode,
        "maxAttempts": max_attempts,
    }
    if trace_id is not None:
        body["traceId"] = trace_id  # the request's trace (traced requests only): 32 hex digits
    return _event("request_admitted", request_id, None, root_digest, body)


def attempt_started(
    *,
    request_id: str,
    root_digest: str,
    attempt: int,
    route_id: str,
    deployment_id: str,
    provider_format: str,
    physical_model: str,
    reason: Literal["first", "retry", "fallback", "continuation"],
    root_generation: int | None = None,
    route_bucket: str | None = None,
    pricing_version: str | None = None,
) -> AuditEvent:
    """``reason``: ``retry`` re-tries a deployment already tried; ``fallback`` moves to another;
    ``continuation`` goes on with a stream that another attempt began (``streamRecovery: continue``).
    ``routeBucket`` is the canary/A-B bucket the route decision chose, if the alias splits."""
    return _event(
        "attempt_started",
        request_id,
        attempt,
        root_digest,
        {
            "routeId": route_id,
            "deploymentId": deployment_id,
            "providerFormat": provider_format,
            "physicalModel": physical_model,
            "reason": reason,
            "rootGeneration": root_generation,
            "routeBucket": route_bucket,
            "pricingVersion": pricing_version,
        },
    )


def attempt_finished(
    *,
    request_id: str,
    root_digest: str,
    attempt: int,
    route_id: str,
    deployment_id: str,
    outcome: str,
    error_category: str | None,
    upstream_status: int | None,
    first_token_ms: float | None,
    total_ms: float,
    connect_ms: float | None = None,
    skipped_events: int = 0,
) -> AuditEvent:
    """``outcome``: ok, error, cancelled or midstream_error (``AttemptRecord.outcome``).
    ``connectMs``: connection set-up, ``0`` for a pooled connection reused, ``None`` when unknown.
    ``skippedEvents``: undecodable stream events skipped without failing the attempt."""
    return _event(
        "attempt_finished",
        request_id,
        attempt,
        root_digest,
        {
            "routeId": route_id,
            "deploymentId": deployment_id,
            "outcome": outcome,
            "errorCategory": error_category,
            "upstreamStatus": upstream_status,
            "connectMs": None if connect_ms is None else round(connect_ms, 3),
            "firstTokenMs": None if first_token_ms is None else round(first_token_ms, 3),
            "totalMs": round(total_ms, 3),
            "cancelled": outcome == "cancelled",
            "skippedEvents": skipped_events,
        },
    )


def request_finished(
    *,
    request_id: str,
    root_digest: str,
    status: int,
    outcome: str,
    error_code: str | None,
    attempts: int,
    admission_ms: float,
    total_ms: float,
    usage: Mapping[str, int] | None,
    usage_evidence: UsageEvidenceName,
    cancellation: str | None,
    principal_id: str,
    tenant: str,
    team: str | None,
    key_id: str,
    alias: str,
    cost_micro_usd: int | None = None,
    pricing_version: str | None = None,
    pricing_tier: str | None = None,
    cost_evidence: str | None = None,
    pii: Mapping[str, object] | None = None,
) -> AuditEvent:
    """``pii``: the PII manifest of a request under a PII profile (profile, detector version, scope,
    counts per kind, a digest of the tokenized texts the provider was sent, recovery outcomes): never a value or a
    placeholder. ``usage``: prompt/completion/total (and cached/reasoning) tokens. ``cost`` is integer micro-USD
    (``None``: unknown), priced at ``pricingVersion``; ``costEvidence`` says whether it rests on the
    provider's usage, a local estimate, or the kept reservation. The identity fields repeat
    ``request_admitted``'s so the usage reconciler needs this one event per request."""
    return _event(
        "request_finished",
        request_id,
        None,
        root_digest,
        {
            **_caller(principal_id, tenant, team, key_id, alias),
            "status": status,
            "outcome": outcome,
            "errorCode": error_code,
            "attempts": attempts,
            "admissionMs": round(admission_ms, 3),
            "totalMs": round(total_ms, 3),
            "usage": dict(usage) if usage is not None else None,
            "usageEvidence": usage_evidence,
            "cost": cost_micro_usd,
            "pricingVersion": pricing_version,
            "pricingTier": pricing_tier,
            "costEvidence": cost_evidence,
            "cancellation": cancellation,
            **({"pii": dict(pii)} if pii is not None else {}),
        },
    )


def request_rejected(
    *,
    request_id: str,
    root_digest: str,
    principal_id: str,
    tenant: str,
    team: str | None,
    key_id: str,
    alias: str | None,
    status: int,
    error_code: str,
    stream: bool | None,
    operation: str = "chat.completions",
) -> AuditEvent:
    """An authenticated request answered 4xx before admission: the whole record of that request.

    ``alias`` is a published alias the request named, or ``None``: never a model name the caller
    typed that is not one (it could be anything, content included). ``stream`` is ``None`` when the
    body was not read far enough to know."""
    return _event(
        "request_rejected",
        request_id,
        None,
        root_digest,
        {
            **_caller(principal_id, tenant, team, key_id, alias),
            "operation": operation,
            "stream": stream,
            "status": status,
            "outcome": "rejected",
            "errorCode": error_code,
            "attempts": 0,
        },
    )


def content_stored(*, request_id: str, root_digest: str, ref: Mapping[str, object]) -> AuditEvent:
    """A request's content is in the content store: ``ref`` is ``ContentRef.to_body()`` (bucket, key,
    digest, size, media type, KMS key reference, retention class, mode), never the content."""
    return _event("content_stored", request_id, None, root_digest, {"content": dict(ref)})


def content_dropped(*, request_id: str, root_digest: str, mode: str, reason: str) -> AuditEvent:
    """A request's content was not stored (``queue_full``, ``store_unavailable``, ``too_large``): the
    metadata stands, and the record says the content is missing and why."""
    return _event("content_dropped", request_id, None, root_digest, {"mode": mode, "reason": reason})


def content_deleted(*, request_id: str, root_digest: str, deleted_by: str, reason: str, existed: bool) -> AuditEvent:
    """Deletion evidence: who deleted a request's content object, why, and whether it still existed."""
    return _event(
        "content_deleted",
        request_id,
        None,
        root_digest,
        {"deletedBy": deleted_by, "reason": reason, "existed": existed},
    )


def export_finished(
    *,
    export_id: str,
    root_digest: str,
    requested_by: str,
    approved_by: str,
    purpose: str,
    manifest: Mapping[str, object],
) -> AuditEvent:
    """A dataset export job, as its own audit record (``operation: dataset.export``): who asked, who
    approved, for which purpose, and the manifest's location, digest and counts (never content)."""
    return _event(
        "export_finished",
        export_id,
        None,
        root_digest,
        {"requestedBy": requested_by, "approvedBy": approved_by, "purpose": purpose, "manifest": dict(manifest)},
    )
