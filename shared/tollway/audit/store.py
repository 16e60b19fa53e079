"""The audit store: one item per logical request and one per physical attempt, written idempotently by ``eventId``.

Layout, in the audit table (string keys ``pk``/``sk``, TTL attribute ``expiresAt``, index
``by-principal`` on ``principalId``/``ts``)::

    pk = REQ#<requestId>  sk = REQUEST        request_admitted + request_finished metadata
    pk = REQ#<requestId>  sk = ATTEMPT#0001   attempt_started + attempt_finished metadata

Each event is one conditional update of one item. The item keeps the ids of the events applied to
it in ``eventIds`` and the update is conditioned on ``NOT contains(eventIds, :eventId)``, so a
duplicate delivery changes nothing and creates nothing. Out-of-order delivery converges to the
same item: each kind writes its own attributes, and the attributes two kinds both carry
(``rootDigest``, ``routeId``, ``deploymentId``, ``expiresAt``) are owned by the start kind, which
sets them, while the terminal kind only fills them in when absent (``if_not_exists``).

Which events an item holds shows in its timestamps: ``admittedAt``/``finishedAt`` on a request,
``startedAt``/``finishedAt`` on an attempt. No ``finishedAt`` means incomplete: the gateway
crashed (or the terminal event is still in flight). Only ``request_admitted`` sets the index keys
(``principalId``, and ``ts`` as fixed-width ISO-8601 UTC, so string order is time order).

``expiresAt`` (epoch seconds) is the owning event's ``ts`` plus the retention
(``TOLLWAY_AUDIT_RETENTION_DAYS``, default 90).

Only the metadata fields named below are copied from an event body, with their types checked:
whatever else a body carries is ignored, so no unexpected field (or content) reaches the table.
A malformed event raises :class:`MalformedEvent` before anything of its batch is written; an
unknown kind is skipped and counted.

boto3 is imported inside :class:`DynamoDBAuditStore`, never at module level: this module is part of
the core library, which ships as a Lambda layer.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tollway.audit.events import EVENT_KINDS, AuditEvent
from tollway.exceptions import aws_error_code

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "MAX_LIST_LIMIT",
    "ApplyResult",
    "AttemptView",
    "AuditStore",
    "AuditStoreError",
    "DynamoDBAuditStore",
    "MalformedEvent",
    "MemoryAuditStore",
    "RequestRecord",
    "RequestView",
    "StoreSettings",
    "iso_ts",
]

DEFAULT_RETENTION_DAYS: Final = 90
MAX_LIST_LIMIT: Final = 1000
REQUEST_SK: Final = "REQUEST"
ATTEMPT_SK_PREFIX: Final = "ATTEMPT#"
EVENT_IDS: Final = "eventIds"
PRINCIPAL_INDEX: Final = "by-principal"
MAX_ATTEMPT: Final = 9999
"""``ATTEMPT#<n:04d>`` sorts attempts by number only up to four digits."""
_MAX_ID_CHARS: Final = 256
_MAX_TS_MS: Final = 253_402_300_800_000
"""Year 10000: beyond it ``ts`` would not be fixed width."""
_MAX_USAGE_KEYS: Final = 32
_MAX_PAGES: Final = 1000
"""Bound on the pages one read follows (a Scan page is at most 1 MB)."""
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class AuditStoreError(RuntimeError):
    """The store could not be read or written; the message names the table, never an event body."""


class MalformedEvent(ValueError):
    """An event that decodes but cannot be placed; the message names the event and field, never a value."""


# ---------------------------------------------------------------- settings


class StoreSettings(BaseModel):
    """Where the store lives, read from the environment the function (or the CLI) runs in."""

    model_config = ConfigDict(frozen=True)

    table: str = Field(min_length=1, max_length=255)
    retention_days: int = Field(default=DEFAULT_RETENTION_DAYS, ge=1, le=36_500)
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, table: str | None = None) -> StoreSettings:
        """``TOLLWAY_TABLE_AUDIT``, ``TOLLWAY_AUDIT_RETENTION_DAYS`` and ``AWS_ENDPOINT_URL``; ``table`` wins."""
        env = os.environ if environ is None else environ
        name = table or env.get("TOLLWAY_TABLE_AUDIT", "").strip()
        if not name:
            raise AuditStoreError("TOLLWAY_TABLE_AUDIT is not set: it names the audit table")
        days = env.get("TOLLWAY_AUDIT_RETENTION_DAYS", "").strip() or str(DEFAULT_RETENTION_DAYS)
        if not days.isdigit():
            raise AuditStoreError("TOLLWAY_AUDIT_RETENTION_DAYS must be a whole number of days")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        return cls(table=name, retention_days=int(days), endpoint=endpoint)


# ---------------------------------------------------------------- results and views


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: int = 0
    """Events that changed the store."""
    duplicates: int = 0
    """Events already applied (a redelivery): nothing changed."""
    unknown: int = 0
    """Events of a kind this store does not know: skipped."""


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
    """One logical request. ``admitted_at_ms`` is ``None`` while its ``request_admitted`` is not stored."""

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
    expires_at: int | None = None

    @property
    def incomplete(self) -> bool:
        """No ``request_finished``."""
        return self.finished_at_ms is None


@dataclass(frozen=True, slots=True)
class RequestView:
    request: RequestRecord
    attempts: tuple[AttemptView, ...]
    """Ordered by attempt number."""

    @property
    def incomplete(self) -> bool:
        return self.request.incomplete or any(a.incomplete for a in self.attempts)


class AuditStore(Protocol):
    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        """Write ``events`` idempotently; :class:`MalformedEvent` before any write if one cannot be placed."""
        ...

    def get_request(self, request_id: str) -> RequestView | None:
        """The request with its ordered attempts, or ``None`` when no event of it is stored."""
        ...

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        """Admitted requests with ``ts >= since_ms``, newest first, at most ``limit``."""
        ...


# ---------------------------------------------------------------- planning: event -> item write


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
    *_fields("tenantId", "teamId", "keyId", "alias", "operation", "contentMode", kind="str"),
    _Field("stream", "bool"),
    _Field("maxAttempts", "int"),
)
_FINISHED_FIELDS: Final = (
    *_fields("status", "attempts", kind="int"),
    *_fields("outcome", "errorCode", "usageEvidence", "pricingVersion", "cancellation", kind="str"),
    *_fields("admissionMs", "totalMs", "cost", kind="number"),
    _Field("usage", "usage"),
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
class _Write:
    """One event as one item update: ``owned`` is set, ``shared`` only filled in when absent."""

    pk: str
    sk: str
    event_id: str
    owned: dict[str, Any]
    shared: dict[str, Any]


def iso_ts(ms: int) -> str:
    """Epoch milliseconds as fixed-width ISO-8601 UTC (``2025-01-31T12:00:00.000Z``): string order is time order."""
    t = _EPOCH + timedelta(milliseconds=ms)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.{ms % 1000:03d}Z"


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
    return (
        isinstance(value, dict)
        and len(value) <= _MAX_USAGE_KEYS
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items())
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


def _plan(event: AuditEvent, retention_s: int) -> _Write | None:
    """The item update for ``event``; ``None`` for an unknown kind. Raises :class:`MalformedEvent`."""
    if event.kind not in EVENT_KINDS:
        return None
    where = f"{event.kind} event {event.event_id}"
    if not 0 < len(event.event_id) <= _MAX_ID_CHARS:
        raise MalformedEvent(f"{event.kind} event: eventId must be 1-{_MAX_ID_CHARS} characters")
    if not 0 < len(event.request_id) <= _MAX_ID_CHARS:
        raise MalformedEvent(f"{where}: requestId must be 1-{_MAX_ID_CHARS} characters")
    if not 0 <= event.ts_ms < _MAX_TS_MS:
        raise MalformedEvent(f"{where}: ts is out of range")
    pk = f"REQ#{event.request_id}"
    expires = event.ts_ms // 1000 + retention_s
    common: dict[str, Any] = {"requestId": event.request_id}
    if event.kind == "request_admitted":
        fields = _pick(event, _ADMITTED_FIELDS)
        if len(fields["principalId"]) > _MAX_ID_CHARS:  # an index key: DynamoDB caps its size
            raise MalformedEvent(f"{where}: principalId must be at most {_MAX_ID_CHARS} characters")
        owned = fields | {
            "admittedAt": event.ts_ms,
            "ts": iso_ts(event.ts_ms),
            "rootDigest": event.root_digest,
            "expiresAt": expires,
        }
        return _Write(pk, REQUEST_SK, event.event_id, owned, common)
    if event.kind == "request_finished":
        owned = _pick(event, _FINISHED_FIELDS) | {"finishedAt": event.ts_ms}
        return _Write(
            pk, REQUEST_SK, event.event_id, owned, common | {"rootDigest": event.root_digest, "expiresAt": expires}
        )
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
        return _Write(pk, sk, event.event_id, owned, common)
    owned = _pick(event, _ATTEMPT_FINISHED_FIELDS) | {"finishedAt": event.ts_ms}
    return _Write(
        pk, sk, event.event_id, owned, common | route | {"rootDigest": event.root_digest, "expiresAt": expires}
    )


def _plan_all(events: Sequence[AuditEvent], retention_days: int) -> tuple[list[_Write], int]:
    """Every write of a batch, or :class:`MalformedEvent` before any is made; also the unknown count."""
    retention_s = retention_days * 86_400
    writes: list[_Write] = []
    unknown = 0
    for event in events:
        write = _plan(event, retention_s)
        if write is None:
            unknown += 1
        else:
            writes.append(write)
    return writes, unknown


# ---------------------------------------------------------------- views: items -> records


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


def _request_record(request_id: str, item: Mapping[str, Any]) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
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
        expires_at=_int(item, "expiresAt"),
    )


def _attempt_view(item: Mapping[str, Any]) -> AttemptView:
    return AttemptView(
        number=int(str(item["sk"]).removeprefix(ATTEMPT_SK_PREFIX)),
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


def _view(request_id: str, items: Iterable[Mapping[str, Any]]) -> RequestView | None:
    """The view of one request's items (plain Python values); ``None`` when there are none."""
    request: Mapping[str, Any] | None = None
    attempts: list[AttemptView] = []
    seen = False
    for item in items:
        seen = True
        sk = str(item["sk"])
        if sk == REQUEST_SK:
            request = item
        elif sk.startswith(ATTEMPT_SK_PREFIX):
            attempts.append(_attempt_view(item))
    if not seen:
        return None
    record = _request_record(request_id, request or {})
    return RequestView(record, tuple(sorted(attempts, key=lambda a: a.number)))


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be 1-{MAX_LIST_LIMIT}")


# ---------------------------------------------------------------- in-memory


class MemoryAuditStore:
    """The store in a dict, for unit tests: the same planning and views as DynamoDB, no I/O."""

    def __init__(self, *, retention_days: int = DEFAULT_RETENTION_DAYS) -> None:
        self.retention_days = retention_days
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        """``(pk, sk)`` → the item's attributes, as DynamoDB would hold them (``eventIds`` a set)."""
        self._lock = threading.Lock()

    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        writes, unknown = _plan_all(events, self.retention_days)
        applied = duplicates = 0
        with self._lock:
            for w in writes:
                item = self.items.setdefault((w.pk, w.sk), {"pk": w.pk, "sk": w.sk})
                ids: set[str] = item.setdefault(EVENT_IDS, set())
                if w.event_id in ids:
                    duplicates += 1
                    continue
                item.update(w.owned)
                for key, value in w.shared.items():
                    item.setdefault(key, value)
                ids.add(w.event_id)
                applied += 1
        return ApplyResult(applied, duplicates, unknown)

    def get_request(self, request_id: str) -> RequestView | None:
        pk = f"REQ#{request_id}"
        with self._lock:
            items = [copy.deepcopy(item) for (p, _), item in self.items.items() if p == pk]
        return _view(request_id, items)

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        _check_limit(limit)
        since = iso_ts(max(0, since_ms))
        with self._lock:
            found = [
                copy.deepcopy(item)
                for (_, sk), item in self.items.items()
                if sk == REQUEST_SK
                and isinstance(item.get("ts"), str)
                and item["ts"] >= since
                and (principal_id is None or item.get("principalId") == principal_id)
            ]
        found.sort(key=lambda i: (i["ts"], i["pk"]), reverse=True)
        return [_request_record(str(i["requestId"]), i) for i in found[:limit]]


# ---------------------------------------------------------------- DynamoDB


def _to_dynamo(value: Any) -> Any:
    """Floats as ``Decimal`` (boto3's serializer refuses floats), recursively."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    return value


def _from_dynamo(value: Any) -> Any:
    """``Decimal`` back to ``int`` or ``float``, sets to sorted lists, recursively."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(value)
    return value


class DynamoDBAuditStore:
    """The store on the audit table. ``client`` (a boto3 DynamoDB client) is for tests of odd endpoints."""

    def __init__(self, settings: StoreSettings, *, client: Any | None = None) -> None:
        import boto3
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        self.settings = settings
        self.table = settings.table
        if client is None:
            config = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 3, "mode": "standard"})
            try:
                client = boto3.client("dynamodb", endpoint_url=settings.endpoint, config=config)
            except BotoCoreError as exc:  # no region configured, say
                raise AuditStoreError(f"audit table {self.table}: no DynamoDB client: {exc}") from None
        self._client = client
        self._serializer = TypeSerializer()
        self._deserializer = TypeDeserializer()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DynamoDBAuditStore:
        return cls(StoreSettings.from_env(environ))

    def _value(self, value: Any) -> dict[str, Any]:
        out: dict[str, Any] = self._serializer.serialize(_to_dynamo(value))
        return out

    def _item(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return {k: _from_dynamo(self._deserializer.deserialize(v)) for k, v in raw.items()}

    def _errors(self, what: str, exc: Exception) -> AuditStoreError:
        """A boto error as :class:`AuditStoreError`: table, operation and error code, never a parameter value."""
        return AuditStoreError(f"audit table {self.table}: {what} failed: {aws_error_code(exc)}")

    def _update(self, w: _Write) -> dict[str, Any]:
        """The UpdateItem request for one write; :class:`MalformedEvent` for a value DynamoDB cannot hold."""
        names = {"#ids": EVENT_IDS}
        values = {":id": {"S": w.event_id}, ":ids": {"SS": [w.event_id]}}
        sets = []
        for prefix, attrs, template in (("o", w.owned, "{n} = {v}"), ("s", w.shared, "{n} = if_not_exists({n}, {v})")):
            for i, (attr, value) in enumerate(attrs.items()):
                n, v = f"#{prefix}{i}", f":{prefix}{i}"
                names[n] = attr
                try:
                    values[v] = self._value(value)
                except (TypeError, ArithmeticError):
                    # Out of DynamoDB's number range, say; the serializer's text would quote the value.
                    raise MalformedEvent(f"event {w.event_id}: {attr!r} cannot be stored in DynamoDB") from None
                sets.append(template.format(n=n, v=v))
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": w.pk}, "sk": {"S": w.sk}},
            "UpdateExpression": f"SET {', '.join(sets)} ADD #ids :ids",
            "ConditionExpression": "NOT contains(#ids, :id)",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }

    def _write(self, update: dict[str, Any]) -> bool:
        """One conditional update; False when the event was already applied."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.update_item(**update)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise self._errors("UpdateItem", exc) from None
        except BotoCoreError as exc:
            raise self._errors("UpdateItem", exc) from None
        return True

    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        writes, unknown = _plan_all(events, self.settings.retention_days)
        updates = [self._update(w) for w in writes]
        applied = sum(1 for u in updates if self._write(u))
        return ApplyResult(applied, len(updates) - applied, unknown)

    def _pages(self, operation: str, request: dict[str, Any]) -> Iterable[dict[str, Any]]:
        """Items of a Query or Scan, page by page (bounded), deserialized."""
        from botocore.exceptions import BotoCoreError, ClientError

        call = getattr(self._client, "query" if operation == "Query" else "scan")
        for _ in range(_MAX_PAGES):
            try:
                page = call(TableName=self.table, **request)
            except (ClientError, BotoCoreError) as exc:
                raise self._errors(operation, exc) from None
            for raw in page.get("Items", []):
                yield self._item(raw)
            if "LastEvaluatedKey" not in page:
                return
            request = {**request, "ExclusiveStartKey": page["LastEvaluatedKey"]}
        raise AuditStoreError(f"audit table {self.table}: {operation} read more than {_MAX_PAGES} pages")

    def get_request(self, request_id: str) -> RequestView | None:
        request = {
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": f"REQ#{request_id}"}},
            "ConsistentRead": True,
        }
        return _view(request_id, list(self._pages("Query", request)))

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        """With a principal: the ``by-principal`` index, newest first. Without: a Scan, sorted here."""
        _check_limit(limit)
        since = {"S": iso_ts(max(0, since_ms))}
        if principal_id is not None:
            request = {
                "IndexName": PRINCIPAL_INDEX,
                "KeyConditionExpression": "principalId = :p AND #ts >= :since",
                "ExpressionAttributeNames": {"#ts": "ts"},
                "ExpressionAttributeValues": {":p": {"S": principal_id}, ":since": since},
                "ScanIndexForward": False,
                "Limit": limit,
            }
            found: list[dict[str, Any]] = []
            for item in self._pages("Query", request):
                found.append(item)
                if len(found) >= limit:
                    break
        else:
            request = {
                "FilterExpression": "sk = :request AND #ts >= :since",
                "ExpressionAttributeNames": {"#ts": "ts"},
                "ExpressionAttributeValues": {":request": {"S": REQUEST_SK}, ":since": since},
            }
            found = sorted(self._pages("Scan", request), key=lambda i: (i["ts"], i["pk"]), reverse=True)[:limit]
        return [_request_record(str(i["requestId"]), i) for i in found]
