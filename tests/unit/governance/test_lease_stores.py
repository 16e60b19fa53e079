"""The memory lease store's contract, and the DynamoDB store's error mapping (its behaviour runs on moto
in tests/integration/test_leases_dynamodb.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from tollway.governance.store import (
    DynamoDBLeaseStore,
    LeaseStore,
    LeaseStoreSettings,
    LeaseStoreUnavailable,
    MemoryLeaseStore,
)

KEY = "budget#tenant:acme#cost#day#2026-11-29"


async def test_memory_store_grants_the_remainder_then_nothing() -> None:
    store: LeaseStore = MemoryLeaseStore()
    assert await store.take(KEY, 60, 100, 1) == 60
    assert await store.take(KEY, 60, 100, 1) == 40
    assert await store.take(KEY, 1, 100, 1) == 0
    await store.give_back(KEY, 30)
    assert await store.granted(KEY) == 70
    assert await store.take(KEY, 50, 100, 1) == 30


async def test_memory_store_never_over_grants_to_concurrent_takers() -> None:
    store = MemoryLeaseStore()
    grants = await asyncio.gather(*(store.take(KEY, 7, 500, None) for _ in range(200)))
    assert sum(grants) == 500 == store.counters[KEY]
    assert all(g in (0, 7) or g == 500 % 7 for g in grants)


async def test_memory_store_never_goes_below_zero() -> None:
    store = MemoryLeaseStore()
    await store.take(KEY, 5, 10, None)
    await store.give_back(KEY, 6)
    assert await store.granted(KEY) == 5
    with pytest.raises(ValueError):
        await store.take(KEY, -1, 10, None)


class _FailingClient:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls: list[str] = []

    def update_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append("update_item")
        raise self.exc

    def get_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append("get_item")
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "UpdateItem"), "Provisioned"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "EndpointConnectionError"),
    ],
)
async def test_dynamodb_errors_become_one_unavailable_error_naming_table_and_code(exc: Exception, code: str) -> None:
    store = DynamoDBLeaseStore(LeaseStoreSettings(table="t-quota-leases"), client=_FailingClient(exc))
    try:
        for call in (store.take(KEY, 5, 10, None), store.give_back(KEY, 5), store.granted(KEY)):
            with pytest.raises(LeaseStoreUnavailable, match=f"t-quota-leases: .* failed: {code}") as raised:
                await call
            assert raised.value.__cause__ is None
            assert KEY not in str(raised.value)
    finally:
        store.close()


def test_settings_come_from_the_topology_environment() -> None:
    env = {"TOLLWAY_TABLE_QUOTA_LEASES": "dev-quota-leases", "AWS_ENDPOINT_URL": "http://127.0.0.1:4566"}
    settings = LeaseStoreSettings.from_env({**env, "AWS_DEFAULT_REGION": "eu-west-1"})
    assert (settings.table, settings.endpoint, settings.region) == (
        "dev-quota-leases",
        "http://127.0.0.1:4566",
        "eu-west-1",
    )
    with pytest.raises(LeaseStoreUnavailable, match="TOLLWAY_TABLE_QUOTA_LEASES"):
        LeaseStoreSettings.from_env({})
