"""The audit store on DynamoDB: one conditional write per item per batch, several in flight at once.

A batch's events are grouped by item (:func:`~tollway.audit.store.plan.plan_batch`), and each
group is one write of all its events, made only if none of them is stored yet:

- A group that holds the item's opening event (``request_admitted``, ``request_rejected``,
  ``attempt_started``) most likely makes a new item, so it is first one ``PutItem`` of the merged
  attributes and the event ids, conditioned on ``attribute_not_exists(pk)``. Besides being atomic
  for readers, it is cheap on the local cloud, whose update path validates an expression in time
  that grows faster than its clauses (an update of 30 attributes took 42 ms on moto server, one of
  2 took 12 ms; a put of 30, 2 ms of moto's CPU).
- Otherwise, and whenever the item exists, one ``UpdateItem`` sets the merged attributes (the
  shared ones ``if_not_exists``), adds every event id to ``eventIds``, and is conditioned on none
  of them being there::

      SET ... ADD eventIds :ids
      ConditionExpression: NOT contains(eventIds, :e0) AND NOT contains(eventIds, :e1) ...

Either way a write applies all its events or none. When its condition fails (the item exists; a
redelivery; a message the shipper resent in another batching), the item's stored ids come back
with the failure (``ReturnValuesOnConditionCheckFailure=ALL_OLD``; a consistent read where an
endpoint does not return them), and the events not stored yet are written again as one update,
until none is left: each failed update finds at least one more of them stored, so that ends. A
replayed message costs one failed write per item and changes nothing.

The groups are written on a bounded thread pool (``StoreSettings.write_concurrency``; botocore's
clients are thread-safe, and the client's connection pool is sized to match). Before the first
write every event's values are checked against DynamoDB's types, so a message with a value
DynamoDB cannot hold fails alone, before anything of it is written.

boto3 (its type serializer) and botocore are imported inside :class:`DynamoDBAuditStore`, never at
module level: this package is part of the core library, which ships as a Lambda layer. The client
comes from :func:`tollway.aws.client`, shared with every audit store of the same settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Final

from tollway import aws
from tollway.audit.events import AuditEvent
from tollway.audit.store.base import ApplyResult, check_limit
from tollway.audit.store.errors import AuditStoreError, MalformedEvent
from tollway.audit.store.layout import EVENT_IDS, PRINCIPAL_INDEX, REQUEST_PK_PREFIX, REQUEST_SK, iso_ts
from tollway.audit.store.plan import EventWrite, ItemWrite, WriteOutcome, merge, plan_batch
from tollway.audit.store.settings import StoreSettings
from tollway.audit.store.views import RequestRecord, RequestView, request_record, request_view
from tollway.exceptions import aws_error_code

__all__ = ["DynamoDBAuditStore"]

MAX_EVENTS_PER_UPDATE: Final = 16
"""Events one update merges at most (its condition has a clause per event); an item with more in
one batch, which the gateway never produces, takes several updates, one after the other."""
_MAX_PAGES: Final = 1000
"""Bound on the pages one read follows (a Scan page is at most 1 MB)."""


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


def _chunks(events: Sequence[EventWrite]) -> Iterable[list[EventWrite]]:
    for start in range(0, len(events), MAX_EVENTS_PER_UPDATE):
        yield list(events[start : start + MAX_EVENTS_PER_UPDATE])


class DynamoDBAuditStore:
    """The store on the audit table. ``client`` (a botocore DynamoDB client) is for tests of odd endpoints."""

    def __init__(self, settings: StoreSettings, *, client: Any | None = None) -> None:
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
        from botocore.exceptions import BotoCoreError

        self.settings = settings
        self.table = settings.table
        if client is None:
            try:
                client = aws.client(
                    "dynamodb",
                    endpoint=settings.endpoint,
                    connect_timeout_s=5,
                    read_timeout_s=10,
                    retries=3,
                    max_pool_connections=settings.write_concurrency,
                )
            except BotoCoreError as exc:  # no region configured, say
                raise AuditStoreError(f"audit table {self.table}: no DynamoDB client: {exc}") from None
        self._client = client
        self._serializer = TypeSerializer()
        self._deserializer = TypeDeserializer()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DynamoDBAuditStore:
        return cls(StoreSettings.from_env(environ))

    @property
    def client(self) -> Any:
        """The botocore DynamoDB client (its ``meta.events`` take hooks: tests count the calls). It is
        shared by every store of the same settings, and so are the hooks."""
        return self._client

    # ------------------------------------------------------------ values and errors

    def _value(self, value: Any) -> dict[str, Any]:
        out: dict[str, Any] = self._serializer.serialize(_to_dynamo(value))
        return out

    def _item(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return {k: _from_dynamo(self._deserializer.deserialize(v)) for k, v in raw.items()}

    def _errors(self, what: str, exc: Exception) -> AuditStoreError:
        """A boto error as :class:`AuditStoreError`: table, operation and error code, never a parameter value."""
        return AuditStoreError(f"audit table {self.table}: {what} failed: {aws_error_code(exc)}")

    def _check(self, w: EventWrite) -> None:
        """:class:`MalformedEvent` for a value DynamoDB cannot hold (out of its number range, say)."""
        for attrs in (w.owned, w.shared):
            for attr, value in attrs.items():
                try:
                    self._value(value)
                except (TypeError, ArithmeticError):
                    # The serializer's text would quote the value.
                    raise MalformedEvent(f"event {w.event_id}: {attr!r} cannot be stored in DynamoDB") from None

    # ------------------------------------------------------------ writing

    def _update(self, pk: str, sk: str, events: Sequence[EventWrite]) -> dict[str, Any]:
        """One UpdateItem applying ``events`` together, only if none of them is applied yet."""
        owned, shared = merge(events)
        names = {"#ids": EVENT_IDS}
        values: dict[str, Any] = {":ids": {"SS": [e.event_id for e in events]}}
        sets = []
        for prefix, attrs, template in (("o", owned, "{n} = {v}"), ("s", shared, "{n} = if_not_exists({n}, {v})")):
            for i, (attr, value) in enumerate(attrs.items()):
                n, v = f"#{prefix}{i}", f":{prefix}{i}"
                names[n] = attr
                values[v] = self._value(value)
                sets.append(template.format(n=n, v=v))
        conditions = []
        for i, e in enumerate(events):
            values[f":e{i}"] = {"S": e.event_id}
            conditions.append(f"NOT contains(#ids, :e{i})")
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": pk}, "sk": {"S": sk}},
            "UpdateExpression": f"SET {', '.join(sets)} ADD #ids :ids",
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def _stored_ids(self, pk: str, sk: str, failure: Mapping[str, Any]) -> set[str]:
        """The item's ``eventIds``: from a failed condition's answer, else a consistent read."""
        raw = failure.get("Item")
        if raw is None:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                raw = self._client.get_item(
                    TableName=self.table,
                    Key={"pk": {"S": pk}, "sk": {"S": sk}},
                    ProjectionExpression="#ids",
                    ExpressionAttributeNames={"#ids": EVENT_IDS},
                    ConsistentRead=True,
                ).get("Item")
            except (ClientError, BotoCoreError) as exc:
                raise self._errors("GetItem", exc) from None
        ids = (raw or {}).get(EVENT_IDS, {}).get("SS", [])
        return {i for i in ids if isinstance(i, str)}

    def _apply_once(self, pk: str, sk: str, events: Sequence[EventWrite]) -> set[str] | None:
        """One conditional update: ``None`` when it applied, else the ids already stored."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.update_item(**self._update(pk, sk, events))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return self._stored_ids(pk, sk, exc.response)
            raise self._errors("UpdateItem", exc) from None
        except BotoCoreError as exc:
            raise self._errors("UpdateItem", exc) from None
        return None

    def _create(self, pk: str, sk: str, events: Sequence[EventWrite]) -> set[str] | None:
        """The item made of ``events`` alone, if it does not exist: ``None`` when made, else the ids it holds."""
        from botocore.exceptions import BotoCoreError, ClientError

        owned, shared = merge(events)
        item = {k: self._value(v) for k, v in (shared | owned).items()}
        item |= {"pk": {"S": pk}, "sk": {"S": sk}, EVENT_IDS: {"SS": [e.event_id for e in events]}}
        try:
            self._client.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return self._stored_ids(pk, sk, exc.response)
            raise self._errors("PutItem", exc) from None
        except BotoCoreError as exc:
            raise self._errors("PutItem", exc) from None
        return None

    def _write(self, w: ItemWrite) -> frozenset[str]:
        """Every event of ``w`` not yet stored, in as few writes as the stored ones allow; the ids applied."""
        applied: set[str] = set()
        for n, pending in enumerate(_chunks(w.events)):
            if n == 0 and any(e.opens for e in pending):
                stored = self._create(w.pk, w.sk, pending)
                if stored is None:
                    applied.update(e.event_id for e in pending)
                    continue
                pending = [e for e in pending if e.event_id not in stored]
            while pending:
                stored = self._apply_once(w.pk, w.sk, pending)
                if stored is None:
                    applied.update(e.event_id for e in pending)
                    break
                left = [e for e in pending if e.event_id not in stored]
                if len(left) == len(pending):
                    raise AuditStoreError(
                        f"audit table {self.table}: UpdateItem: condition failed, yet no event stored"
                    )
                pending = left
        return frozenset(applied)

    def _attempt(self, w: ItemWrite) -> WriteOutcome:
        try:
            return self._write(w)
        except Exception as exc:  # it fails the messages of this write, and only them
            return exc

    def apply_batch(self, messages: Sequence[Sequence[AuditEvent]]) -> list[ApplyResult | Exception]:
        plan = plan_batch(messages, self.settings.retention_days, check=self._check)
        workers = min(self.settings.write_concurrency, len(plan.writes))
        if workers <= 1:
            outcomes = [self._attempt(w) for w in plan.writes]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="audit-store") as pool:
                outcomes = list(pool.map(self._attempt, plan.writes))
        return plan.results(outcomes)

    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        (result,) = self.apply_batch([events])
        if isinstance(result, Exception):
            raise result
        return result

    # ------------------------------------------------------------ reading

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
            "ExpressionAttributeValues": {":pk": {"S": f"{REQUEST_PK_PREFIX}{request_id}"}},
            "ConsistentRead": True,
        }
        return request_view(request_id, list(self._pages("Query", request)))

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        """With a principal: the ``by-principal`` index, newest first. Without: a Scan, sorted here."""
        check_limit(limit)
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
            items = self._pages("Scan", request)
            found = sorted(items, key=lambda i: (str(i.get("ts", "")), str(i.get("pk", ""))), reverse=True)[:limit]
        return [request_record(i) for i in found]

    def scan_requests(self, since_ms: int, until_ms: int) -> Iterator[RequestRecord]:
        """A paged Scan of the table, filtered to ``REQUEST`` items with ``ts`` in ``[since_ms, until_ms)``.

        The filter runs after the read, so this reads (and pays for) the whole table, at most
        ``_MAX_PAGES`` pages of 1 MB: fine for the export of a test or small stage, not for a
        production table, which would give the export a time index (a GSI on a day bucket and
        ``ts``) and Query it day by day. Items come lazily, in the table's order.
        """
        if until_ms <= since_ms:
            return
        request = {
            "FilterExpression": "sk = :request AND #ts BETWEEN :since AND :last",
            "ExpressionAttributeNames": {"#ts": "ts"},
            "ExpressionAttributeValues": {
                ":request": {"S": REQUEST_SK},
                ":since": {"S": iso_ts(max(0, since_ms))},
                ":last": {"S": iso_ts(max(0, until_ms - 1))},
            },
            "ConsistentRead": True,
        }
        for item in self._pages("Scan", request):
            yield request_record(item)
