"""The lease store on the ``quota-leases`` table (partition key ``pk``, TTL attribute ``expiresAt``).

One item per counter::

    pk = budget#tenant:acme#cost#day#2026-11-29   granted = 41250000   limit = 100000000   expiresAt = 1796515200

A take is one conditional ``UpdateItem``: ``ADD granted :n`` if ``attribute_not_exists(granted) OR
granted <= :limit - :n``. When that check fails the counter is near its limit: the store reads it
(consistently) and asks for the remainder with a second conditional update, conditioned the same
way, so a give-back that lands in between only helps. A lost race is retried a few times, then the
take grants 0. ``granted`` therefore never exceeds the limit of the take that wrote it. A give-back
is ``ADD granted -:n`` if ``granted >= :n``: a counter never goes negative (an item its TTL
already removed simply stays removed).

botocore runs in a small dedicated thread pool, so a slow DynamoDB never blocks the event loop nor
starves the loop's default executor. The clients come from :func:`tollway.aws.client` on first use,
in that pool, and botocore is imported there too: nothing AWS-related happens at import. (botocore
rather than boto3: the governance layer does not import boto3, see the import-linter contracts in
``pyproject.toml``.) Every botocore error becomes :class:`LeaseStoreUnavailable` in :func:`_unavailable`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tollway import aws
from tollway.exceptions import aws_error_code
from tollway.governance.store.base import LeaseStoreUnavailable, check_take

__all__ = ["DynamoDBLeaseStore", "LeaseStoreSettings"]

_RACE_RETRIES: Final = 3
"""Second-chance takes after a lost race for the remainder; then the take grants 0."""
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"


class LeaseStoreSettings(BaseModel):
    """Where the lease table lives and how long a call may take (a lease refresh should fail fast)."""

    model_config = ConfigDict(frozen=True)

    table: str = Field(min_length=1, max_length=255)
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    region: str | None = None
    connect_timeout_s: float = Field(default=1.0, gt=0, le=30)
    read_timeout_s: float = Field(default=2.0, gt=0, le=60)
    max_attempts: int = Field(default=2, ge=1, le=10)
    """botocore's total attempts per call (standard retry mode)."""
    threads: int = Field(default=4, ge=1, le=64)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, table: str | None = None) -> LeaseStoreSettings:
        """``TOLLWAY_TABLE_QUOTA_LEASES``, ``AWS_ENDPOINT_URL`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``."""
        env = os.environ if environ is None else environ
        name = table or env.get("TOLLWAY_TABLE_QUOTA_LEASES", "").strip()
        if not name:
            raise LeaseStoreUnavailable("TOLLWAY_TABLE_QUOTA_LEASES is not set: it names the quota-leases table")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        region = env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None
        return cls(table=name, endpoint=endpoint, region=region)


def _unavailable(table: str, operation: str, exc: Exception) -> LeaseStoreUnavailable:
    """A botocore error as :class:`LeaseStoreUnavailable`: table, operation and code, never a value."""
    return LeaseStoreUnavailable(f"quota-leases table {table}: {operation} failed: {aws_error_code(exc)}")


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


class DynamoDBLeaseStore:
    """``client`` (a botocore DynamoDB client) is for tests; otherwise one is built on first use."""

    def __init__(self, settings: LeaseStoreSettings, *, client: Any | None = None) -> None:
        self.settings = settings
        self.table = settings.table
        self._clients: dict[bool, Any] = {} if client is None else {True: client, False: client}
        self._client_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DynamoDBLeaseStore:
        return cls(LeaseStoreSettings.from_env(environ))

    def close(self) -> None:
        """Stop the store's threads (a call in flight finishes); the store cannot be used afterwards."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def warm(self) -> None:
        """Build both clients now, off the request path: loading botocore's service model holds the
        GIL for a while, and done by the first lease refresh under load it stalls the event loop."""
        loop = asyncio.get_running_loop()
        for retry in (True, False):
            await loop.run_in_executor(self._pool(), self._dynamodb, retry)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.settings.threads, thread_name_prefix="tollway-leases")
        return self._executor

    def _dynamodb(self, retry: bool) -> Any:
        """A client, built once (in a pool thread: loading botocore's service model takes a while).

        ``retry=False`` is the client for give-backs, which botocore must not retry: a decrement
        whose response was lost and is sent again would return the same units twice, and another
        replica could then be granted units that are in fact still held.
        """
        with self._client_lock:
            if retry not in self._clients:
                s = self.settings
                self._clients[retry] = aws.client(
                    "dynamodb",
                    region=s.region,
                    endpoint=s.endpoint,
                    connect_timeout_s=s.connect_timeout_s,
                    read_timeout_s=s.read_timeout_s,
                    # botocore counts retries after the first attempt: a give-back is sent once, and a
                    # take or read makes ``max_attempts`` attempts in all, as the settings say.
                    retries=s.max_attempts - 1 if retry else 0,
                )
            return self._clients[retry]

    def _call_sync(self, operation: str, request: dict[str, Any], retry: bool) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response: dict[str, Any] = getattr(self._dynamodb(retry), operation)(**request)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED:
                return None
            raise _unavailable(self.table, operation, exc) from None
        except BotoCoreError as exc:
            raise _unavailable(self.table, operation, exc) from None
        return response

    async def _call(self, operation: str, request: dict[str, Any], *, retry: bool = True) -> dict[str, Any] | None:
        """One DynamoDB call in the store's threads; ``None`` when its condition failed."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool(), self._call_sync, operation, request, retry)
        except RuntimeError as exc:  # the pool was shut down
            raise LeaseStoreUnavailable(f"quota-leases table {self.table}: store closed") from exc

    def _add(self, counter_key: str, n: int, limit: int, expires_at: int | None) -> dict[str, Any]:
        sets = "#limit = :limit" + (", expiresAt = :exp" if expires_at is not None else "")
        values = {":n": _n(n), ":room": _n(limit - n), ":limit": _n(limit)}
        if expires_at is not None:
            values[":exp"] = _n(expires_at)
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": counter_key}},
            "UpdateExpression": f"SET {sets} ADD granted :n",
            "ConditionExpression": "attribute_not_exists(granted) OR granted <= :room",
            "ExpressionAttributeNames": {"#limit": "limit"},
            "ExpressionAttributeValues": values,
        }

    async def take(self, counter_key: str, amount: int, limit: int, expires_at: int | None) -> int:
        want = check_take(amount, limit)
        if want == 0:
            return 0
        if await self._call("update_item", self._add(counter_key, want, limit, expires_at)) is not None:
            return want
        for _ in range(_RACE_RETRIES):
            rest = min(want, limit - await self.granted(counter_key))
            if rest <= 0:
                return 0
            if await self._call("update_item", self._add(counter_key, rest, limit, expires_at)) is not None:
                return rest
        return 0

    async def give_back(self, counter_key: str, amount: int) -> None:
        if amount < 0:
            raise ValueError("amount must not be negative")
        if amount == 0:
            return
        request = {
            "TableName": self.table,
            "Key": {"pk": {"S": counter_key}},
            "UpdateExpression": "ADD granted :neg",
            "ConditionExpression": "granted >= :n",
            "ExpressionAttributeValues": {":neg": _n(-amount), ":n": _n(amount)},
        }
        await self._call("update_item", request, retry=False)

    async def granted(self, counter_key: str) -> int:
        request = {
            "TableName": self.table,
            "Key": {"pk": {"S": counter_key}},
            "ConsistentRead": True,
            "ProjectionExpression": "granted",
        }
        response = await self._call("get_item", request) or {}
        value = response.get("Item", {}).get("granted", {}).get("N")
        return int(value) if value is not None else 0
