"""Planning, with no I/O: each event as its share of one item update, and a batch's events merged per item.

An event becomes an :class:`EventWrite`: the item it belongs to, the attributes it owns (set) and
the attributes it shares with another kind (filled in only when absent). :func:`plan_batch` takes
every message of a queue batch and groups their events by item, in batch order, into
:class:`ItemWrite` s; a store then writes each group as few conditional updates as idempotency
allows (:func:`merge` says what one update of several events sets). A message with a malformed
event is left out whole, before anything is written, and fails alone; a message whose events
share an item write that failed fails with it (:meth:`BatchPlan.results`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tollway.audit.events import KNOWN_KINDS, AuditEvent
from tollway.audit.store.base import ApplyResult
from tollway.audit.store.errors import MalformedEvent
from tollway.audit.store.layout import (
    ATTEMPT_SK_PREFIX,
    MAX_ATTEMPT,
    MAX_ID_CHARS,
    REQUEST_PK_PREFIX,
    REQUEST_SK,
    iso_ts,
)

__all__ = ["BatchPlan", "EventWrite", "ItemWrite", "WriteOutcome", "merge", "plan_batch", "plan_event"]

_MAX_TS_MS: Final = 253_402_300_800_000
"""Year 10000: beyond it ``ts`` would not be fixed width."""
_MAX_USAGE_KEYS: Final = 32


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    """The body key, also the item attribute."""
    kind: str
    """``str``, ``int``, ``number``, ``bool`` or ``usage``."""
    required: bool = False


def _fields(*names: str, kind: str) -> tuple[_Field, ...]:
    return tuple(_Field(n, kind) for n in names)


_ADMITTED_FIELDS: Final = (
    _Field("principalId", "str", required=True),
    *_fields("tenantId", "teamId", "keyId", "alias", "operation", "contentMode", "traceId", kind="str"),
    _Field("stream", "bool"),
    _Field("maxAttempts", "int"),
)
_FINISHED_FIELDS: Final = (
    *_fields("status", "attempts", kind="int"),
    *_fields("outcome", "errorCode", "usageEvidence", "pricingVersion", "cancellation", kind="str"),
    *_fields("admissionMs", "totalMs", "cost", kind="number"),
    _Field("usage", "usage"),
    _Field("pii", "pii"),
)
_REJECTED_FIELDS: Final = (
    _Field("principalId", "str", required=True),
    *_fields("tenantId", "teamId", "keyId", "alias", "operation", "outcome", "errorCode", kind="str"),
    _Field("stream", "bool"),
    _Field("status", "int", required=True),
    _Field("attempts", "int"),
)
_ATTEMPT_STARTED_FIELDS: Final = _fields("providerFormat", "physicalModel", "reason", kind="str")
_ATTEMPT_ROUTE_FIELDS: Final = _fields("routeId", "deploymentId", kind="str")
_ATTEMPT_FINISHED_FIELDS: Final = (
    *_fields("outcome", "errorCategory", kind="str"),
    _Field("upstreamStatus", "int"),
    *_fields("connectMs", "firstTokenMs", "totalMs", kind="number"),
    _Field("cancelled", "bool"),
)


@dataclass(frozen=True, slots=True)
class EventWrite:
    """One event as its share of one item update: ``owned`` is set, ``shared`` only filled in when absent."""

    pk: str
    sk: str
    event_id: str
    owned: dict[str, Any]
    shared: dict[str, Any]
    opens: bool = False
    """The kind that comes first for its item (``request_admitted``, ``request_rejected``,
    ``attempt_started``): a write holding it most likely makes a new item. A hint, never a rule."""


def _valid(value: object, kind: str) -> bool:
    if value is None:
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "pii":
        return _pii_manifest(value)
    return (
        isinstance(value, dict)
        and len(value) <= _MAX_USAGE_KEYS
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items())
    )


def _counts(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= _MAX_USAGE_KEYS
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items())
    )


def _pii_manifest(value: object) -> bool:
    """The PII manifest: short strings, and two maps of counts; nothing else (no value could hide in it)."""
    if not isinstance(value, dict) or set(value) - {
        "profile",
        "detectorVersion",
        "scope",
        "digest",
        "counts",
        "recovery",
    }:
        return False
    return all(
        _counts(v) if k in ("counts", "recovery") else isinstance(v, str) and len(v) <= 200 for k, v in value.items()
    )


def _pick(event: AuditEvent, fields: Iterable[_Field]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if f.name not in event.body:
            if f.required:
                raise MalformedEvent(f"{event.kind} event {event.event_id}: body lacks {f.name!r}")
            continue
        value = event.body[f.name]
        if not _valid(value, f.kind) or (f.required and not value):
            raise MalformedEvent(f"{event.kind} event {event.event_id}: body field {f.name!r} is not a valid {f.kind}")
        out[f.name] = copy.deepcopy(value)
    return out


def _principal(event: AuditEvent, fields: Iterable[_Field]) -> dict[str, Any]:
    picked = _pick(event, fields)
    if len(picked["principalId"]) > MAX_ID_CHARS:  # an index key: DynamoDB caps its size
        where = f"{event.kind} event {event.event_id}"
        raise MalformedEvent(f"{where}: principalId must be at most {MAX_ID_CHARS} characters")
    return picked


def plan_event(event: AuditEvent, retention_s: int) -> EventWrite | None:
    """The item update for ``event``; ``None`` for an unknown kind. Raises :class:`MalformedEvent`."""
    if event.kind not in KNOWN_KINDS:
        return None
    where = f"{event.kind} event {event.event_id}"
    if not 0 < len(event.event_id) <= MAX_ID_CHARS:
        raise MalformedEvent(f"{event.kind} event: eventId must be 1-{MAX_ID_CHARS} characters")
    if not 0 < len(event.request_id) <= MAX_ID_CHARS:
        raise MalformedEvent(f"{where}: requestId must be 1-{MAX_ID_CHARS} characters")
    if not 0 <= event.ts_ms < _MAX_TS_MS:
        raise MalformedEvent(f"{where}: ts is out of range")
    pk = f"{REQUEST_PK_PREFIX}{event.request_id}"
    expires = event.ts_ms // 1000 + retention_s
    common: dict[str, Any] = {"requestId": event.request_id}
    if event.kind == "request_admitted":
        owned = _principal(event, _ADMITTED_FIELDS) | {
            "admittedAt": event.ts_ms,
            "ts": iso_ts(event.ts_ms),
            "rootDigest": event.root_digest,
            "expiresAt": expires,
        }
        return EventWrite(pk, REQUEST_SK, event.event_id, owned, common, opens=True)
    if event.kind == "request_finished":
        owned = _pick(event, _FINISHED_FIELDS) | {"finishedAt": event.ts_ms}
        return EventWrite(
            pk, REQUEST_SK, event.event_id, owned, common | {"rootDigest": event.root_digest, "expiresAt": expires}
        )
    if event.kind == "request_rejected":
        # The admitted lifecycle's events own these attributes, should a request ever have both.
        shared = _principal(event, _REJECTED_FIELDS) | {
            "ts": iso_ts(event.ts_ms),
            "rootDigest": event.root_digest,
            "expiresAt": expires,
        }
        return EventWrite(pk, REQUEST_SK, event.event_id, {"rejectedAt": event.ts_ms}, common | shared, opens=True)
    if event.kind in _REQUEST_LEVEL:
        return _request_level(event, pk, common, expires)
    if event.attempt is None or not 1 <= event.attempt <= MAX_ATTEMPT:
        raise MalformedEvent(f"{where}: attempt must be 1-{MAX_ATTEMPT}")
    sk = f"{ATTEMPT_SK_PREFIX}{event.attempt:04d}"
    common |= {"attempt": event.attempt}
    route = _pick(event, _ATTEMPT_ROUTE_FIELDS)
    if event.kind == "attempt_started":
        owned = (
            _pick(event, _ATTEMPT_STARTED_FIELDS)
            | route
            | {"startedAt": event.ts_ms, "rootDigest": event.root_digest, "expiresAt": expires}
        )
        return EventWrite(pk, sk, event.event_id, owned, common, opens=True)
    owned = _pick(event, _ATTEMPT_FINISHED_FIELDS) | {"finishedAt": event.ts_ms}
    return EventWrite(
        pk, sk, event.event_id, owned, common | route | {"rootDigest": event.root_digest, "expiresAt": expires}
    )


_REQUEST_LEVEL: Final = frozenset({"content_stored", "content_dropped", "content_deleted", "export_finished"})
_REF_FIELDS: Final = {
    "bucket": str,
    "key": str,
    "digest": str,
    "size": int,
    "keyRef": str,
    "retentionClass": str,
    "mode": str,
    "mediaType": str,
    "purposes": list,
}
_MAX_REF_CHARS: Final = 1024


def _content_ref(value: object) -> bool:
    """A content reference: exactly its fields, short strings and a size (no content could hide in it)."""
    optional = {"mediaType", "purposes"}
    if not isinstance(value, dict) or set(value) - set(_REF_FIELDS) or set(_REF_FIELDS) - set(value) - optional:
        return False
    purposes = value.get("purposes", [])
    if (
        not isinstance(purposes, list)
        or len(purposes) > 8
        or not all(isinstance(p, str) and len(p) <= 32 for p in purposes)
    ):
        return False
    return all(
        isinstance(v, _REF_FIELDS[k])
        and not isinstance(v, bool)
        and (not isinstance(v, str) or len(v) <= _MAX_REF_CHARS)
        for k, v in value.items()
    )


def _short_strings(event: AuditEvent, *names: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        value = event.body.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
            raise MalformedEvent(f"{event.kind} event {event.event_id}: body field {name!r} is not a short string")
        out[name] = value
    return out


def _request_level(event: AuditEvent, pk: str, common: dict[str, Any], expires: int) -> EventWrite:
    """The content and export kinds: attributes of the request item they name."""
    where = f"{event.kind} event {event.event_id}"
    if event.kind == "content_stored":
        ref = event.body.get("content")
        if not _content_ref(ref):
            raise MalformedEvent(f"{where}: body field 'content' is not a content reference")
        owned = {"content": copy.deepcopy(ref), "contentStoredAt": event.ts_ms}
    elif event.kind == "content_dropped":
        owned = {"contentDropped": _short_strings(event, "mode", "reason"), "contentDroppedAt": event.ts_ms}
    elif event.kind == "content_deleted":
        evidence = _short_strings(event, "deletedBy", "reason")
        existed = event.body.get("existed")
        if not isinstance(existed, bool):
            raise MalformedEvent(f"{where}: body field 'existed' is not a bool")
        owned = {"contentDeleted": evidence | {"existed": existed}, "contentDeletedAt": event.ts_ms}
    else:  # export_finished: the export job's own record
        manifest = event.body.get("manifest")
        if not isinstance(manifest, dict) or len(orjson.dumps(manifest)) > 8192:
            raise MalformedEvent(f"{where}: body field 'manifest' is not a small object")
        owned = _short_strings(event, "requestedBy", "approvedBy", "purpose") | {
            "principalId": event.body["requestedBy"],
            "operation": "dataset.export",
            "exportManifest": copy.deepcopy(manifest),
            "admittedAt": event.ts_ms,
            "finishedAt": event.ts_ms,
            "ts": iso_ts(event.ts_ms),
            "outcome": "exported",
        }
        return EventWrite(pk, REQUEST_SK, event.event_id, owned, common | {"expiresAt": expires}, opens=True)
    return EventWrite(pk, REQUEST_SK, event.event_id, owned, common)


def merge(events: Iterable[EventWrite]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What applying ``events`` to one item, in order, sets: ``(set, fill in when absent)``.

    One update with these gives the item that one update per event would: an attribute some
    event owns takes its last owner's value; one that only events sharing it carry takes the
    item's value, else the first of theirs.
    """
    events = list(events)
    owned: dict[str, Any] = {}
    for e in events:
        owned.update(e.owned)
    shared: dict[str, Any] = {}
    for e in events:
        for attr, value in e.shared.items():
            if attr not in owned and attr not in shared:
                shared[attr] = value
    return owned, shared


@dataclass(frozen=True, slots=True)
class ItemWrite:
    """Every event of one item in one batch, distinct and in batch order, to be written together."""

    pk: str
    sk: str
    events: tuple[EventWrite, ...]
    origins: tuple[int, ...]
    """Per event, the message it came from first."""
    messages: tuple[int, ...]
    """Every message with an event of this item, a repeat of an event included: they fail if it fails."""


WriteOutcome = frozenset[str] | Exception
"""A store's answer for one :class:`ItemWrite`: the event ids it applied (the others were already
stored), or the error that failed it."""


@dataclass(frozen=True, slots=True)
class BatchPlan:
    writes: tuple[ItemWrite, ...]
    malformed: dict[int, MalformedEvent]
    """Messages left out whole: nothing of them is written."""
    unknown: tuple[int, ...]
    """Per message, events of a kind this store does not know (skipped)."""
    repeats: tuple[int, ...]
    """Per message, events an earlier message of the batch (or the same one) already holds."""

    def results(self, outcomes: Sequence[WriteOutcome]) -> list[ApplyResult | Exception]:
        """Per message, in order: its counts, or the error that failed it (its own, else the first of its writes')."""
        count = len(self.unknown)
        applied = [0] * count
        duplicates = list(self.repeats)
        errors: dict[int, Exception] = dict(self.malformed)
        for write, outcome in zip(self.writes, outcomes, strict=True):
            if isinstance(outcome, Exception):
                for m in write.messages:
                    errors.setdefault(m, outcome)
                continue
            for event, origin in zip(write.events, write.origins, strict=True):
                if event.event_id in outcome:
                    applied[origin] += 1
                else:
                    duplicates[origin] += 1
        return [
            errors[m] if m in errors else ApplyResult(applied[m], duplicates[m], self.unknown[m]) for m in range(count)
        ]


def plan_batch(
    messages: Sequence[Sequence[AuditEvent]],
    retention_days: int,
    *,
    check: Callable[[EventWrite], None] | None = None,
) -> BatchPlan:
    """Every message's events, grouped by item in batch order; ``check`` may reject a write the backend cannot hold."""
    retention_s = retention_days * 86_400
    malformed: dict[int, MalformedEvent] = {}
    unknown = [0] * len(messages)
    repeats = [0] * len(messages)
    groups: dict[tuple[str, str], list[tuple[EventWrite, int]]] = {}
    touched: dict[tuple[str, str], set[int]] = {}
    seen: set[tuple[str, str, str]] = set()
    for m, events in enumerate(messages):
        writes: list[EventWrite] = []
        skipped = 0
        try:
            for event in events:
                write = plan_event(event, retention_s)
                if write is None:
                    skipped += 1
                    continue
                if check is not None:
                    check(write)
                writes.append(write)
        except MalformedEvent as exc:
            malformed[m] = exc
            continue
        unknown[m] = skipped
        for w in writes:
            key = (w.pk, w.sk)
            touched.setdefault(key, set()).add(m)
            if (w.pk, w.sk, w.event_id) in seen:
                repeats[m] += 1
                continue
            seen.add((w.pk, w.sk, w.event_id))
            groups.setdefault(key, []).append((w, m))
    items = tuple(
        ItemWrite(
            pk,
            sk,
            tuple(w for w, _ in group),
            tuple(m for _, m in group),
            tuple(sorted(touched[(pk, sk)])),
        )
        for (pk, sk), group in groups.items()
    )
    return BatchPlan(items, malformed, tuple(unknown), tuple(repeats))
