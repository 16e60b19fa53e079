"""The usage ledger on the ``usage-ledger`` table (layout: :mod:`tollway.metering.layout`).

One request is one ``TransactWriteItems``: a ``Put`` of the ledger item conditioned on
``attribute_not_exists(pk)``, and one ``Update`` per aggregate (``SET`` its labels, ``ADD`` its
counters). Either all of it lands or none does, so an aggregate never counts a request twice nor
misses one the ledger holds. A redelivered event fails the ``Put``'s condition: DynamoDB cancels
the transaction with ``ConditionalCheckFailed`` as the first cancellation reason, which is
:attr:`ApplyResult.DUPLICATE`. Any other failure (a ``TransactionConflict`` on a hot aggregate,
throttling, an unreachable endpoint) is :class:`UsageLedgerUnavailable`, and the message is
retried by SQS; a retry after a lost success response is a duplicate, as it should be.

The botocore client comes from :func:`tollway.aws.client` on first use (shared with every ledger
of the same endpoint and region): nothing AWS-related happens at import, and tests pass their own
``client``. Every botocore error is mapped in :func:`_unavailable`, which names the table, the
operation and the error code, never a value.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

from tollway import aws
from tollway.audit.events import AuditEvent
from tollway.exceptions import aws_error_code
from tollway.metering.exceptions import UsageLedgerUnavailable
from tollway.metering.layout import Increment, day_range, plan
from tollway.metering.query import UsageQuery, UsageRow, rows_from_items, source_partition
from tollway.metering.record import usage_record
from tollway.metering.store.base import ApplyResult, LedgerSettings

__all__ = ["DynamoDBUsageLedger"]

_CANCELLED: Final = "TransactionCanceledException"
_CONDITION_FAILED: Final = "ConditionalCheckFailed"
_MAX_PAGES: Final = 1000
_REASONS: Final = re.compile(r"\[([A-Za-z, ]+)\]")


def _reasons(exc: Exception) -> list[str]:
    """The cancellation reason codes of a cancelled transaction, in item order (``None`` for an item that was fine)."""
    response: Mapping[str, Any] = getattr(exc, "response", None) or {}
    listed = response.get("CancellationReasons")
    if isinstance(listed, list):
        return [str(r.get("Code", "None")) if isinstance(r, dict) else "None" for r in listed]
    # Older botocore models leave the reasons in the message only: "... reasons [ConditionalCheckFailed, None]".
    found = _REASONS.search(str(response.get("Error", {}).get("Message", "")))
    return [r.strip() for r in found.group(1).split(",")] if found else []


def _unavailable(table: str, operation: str, exc: Exception) -> UsageLedgerUnavailable:
    """A botocore error as :class:`UsageLedgerUnavailable`: table, operation, code (and reasons), never a value."""
    code = aws_error_code(exc)
    reasons = sorted({r for r in _reasons(exc) if r != "None"}) if code == _CANCELLED else []
    detail = f" ({', '.join(reasons)})" if reasons else ""
    return UsageLedgerUnavailable(f"usage-ledger table {table}: {operation} failed: {code}{detail}")


def _typed(value: Any) -> dict[str, Any]:
    """A plain value (str, int, None, or a dict of them) as DynamoDB's typed JSON."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, dict):
        return {"M": {k: _typed(v) for k, v in value.items()}}
    raise TypeError(f"no DynamoDB type for {type(value).__name__}")


def _plain(typed: Mapping[str, Any]) -> Any:
    """DynamoDB's typed JSON back to plain values (numbers are integers in this table)."""
    ((kind, value),) = typed.items()
    if kind == "N":
        return int(value) if re.fullmatch(r"-?\d+", value) else float(value)
    if kind == "M":
        return {k: _plain(v) for k, v in value.items()}
    if kind == "NULL":
        return None
    return value


def _update(table: str, inc: Increment) -> dict[str, Any]:
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    sets = []
    for i, (attr, label) in enumerate(inc.labels.items()):
        names[f"#l{i}"], values[f":l{i}"] = attr, {"S": label}
        sets.append(f"#l{i} = :l{i}")
    if inc.expires_at is not None:
        names["#exp"], values[":exp"] = "expiresAt", {"N": str(inc.expires_at)}
        sets.append("#exp = :exp")
    adds = []
    for i, (attr, n) in enumerate(inc.counters.items()):
        names[f"#c{i}"], values[f":c{i}"] = attr, {"N": str(n)}
        adds.append(f"#c{i} :c{i}")
    return {
        "Update": {
            "TableName": table,
            "Key": {"pk": {"S": inc.pk}, "sk": {"S": inc.sk}},
            "UpdateExpression": f"SET {', '.join(sets)} ADD {', '.join(adds)}",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
    }


class DynamoDBUsageLedger:
    """``client`` (a botocore DynamoDB client) is for tests; otherwise one from :mod:`tollway.aws` on first use."""

    def __init__(self, settings: LedgerSettings, *, client: Any | None = None) -> None:
        self.settings = settings
        self.table = settings.table
        self._client = client
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DynamoDBUsageLedger:
        return cls(LedgerSettings.from_env(environ))

    def _dynamodb(self) -> Any:
        """The client: bounded timeouts, standard retries (3 after the first attempt), built on first use."""
        with self._lock:
            if self._client is None:
                from botocore.exceptions import BotoCoreError

                try:
                    self._client = aws.client(
                        "dynamodb",
                        region=self.settings.region,
                        endpoint=self.settings.endpoint,
                        connect_timeout_s=5,
                        read_timeout_s=10,
                        retries=3,
                    )
                except BotoCoreError as exc:  # no region configured, say
                    raise UsageLedgerUnavailable(f"no DynamoDB client: {type(exc).__name__}") from None
            return self._client

    def apply(self, event: AuditEvent) -> ApplyResult:
        from botocore.exceptions import BotoCoreError, ClientError

        record = usage_record(event)
        if record is None:
            return ApplyResult.SKIPPED
        s = self.settings
        writes = plan(record, retention_days=s.retention_days, aggregate_retention_days=s.aggregate_retention_days)
        put = {
            "Put": {
                "TableName": self.table,
                "Item": {k: _typed(v) for k, v in writes.ledger_item.items()},
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        items = [put, *(_update(self.table, inc) for inc in writes.increments)]
        try:
            self._dynamodb().transact_write_items(TransactItems=items)
        except ClientError as exc:
            if aws_error_code(exc) == _CANCELLED and _reasons(exc)[:1] == [_CONDITION_FAILED]:
                return ApplyResult.DUPLICATE
            raise _unavailable(self.table, "TransactWriteItems", exc) from None
        except BotoCoreError as exc:
            raise _unavailable(self.table, "TransactWriteItems", exc) from None
        return ApplyResult.APPLIED

    def _pages(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._dynamodb()
        for _ in range(_MAX_PAGES):
            try:
                page = client.query(TableName=self.table, **request)
            except (ClientError, BotoCoreError) as exc:
                raise _unavailable(self.table, "Query", exc) from None
            for raw in page.get("Items", []):
                yield {k: _plain(v) for k, v in raw.items()}
            if "LastEvaluatedKey" not in page:
                return
            request = {**request, "ExclusiveStartKey": page["LastEvaluatedKey"]}
        raise UsageLedgerUnavailable(f"usage-ledger table {self.table}: Query read more than {_MAX_PAGES} pages")

    def query(self, query: UsageQuery) -> list[UsageRow]:
        lo, hi = day_range(query.from_day, query.to_day)
        request = {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :lo AND :hi",
            "ExpressionAttributeValues": {
                ":pk": {"S": source_partition(query.scope, query.group_by)},
                ":lo": {"S": lo},
                ":hi": {"S": hi},
            },
        }
        return rows_from_items(self._pages(request), query)
