"""The DynamoDB ledger's requests and error mapping, against a recording fake botocore client.

The moto-backed behaviour (a real transaction, a real condition failure) is in
``tests/integration/test_usage_reconciler_local.py``.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from tests.unit.metering.usage_events import finished
from tollway.metering import (
    ApplyResult,
    DynamoDBUsageLedger,
    LedgerSettings,
    MemoryUsageLedger,
    UsageLedgerUnavailable,
    UsageQuery,
    UsageScope,
)


class FakeClient:
    def __init__(self, *, error: Exception | None = None, pages: list[dict[str, Any]] | None = None) -> None:
        self.error = error
        self.pages = list(pages or [])
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def transact_write_items(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("TransactWriteItems", request))
        if self.error is not None:
            raise self.error
        return {}

    def query(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("Query", request))
        if self.error is not None:
            raise self.error
        return self.pages.pop(0)


def cancelled(*codes: str, listed: bool = True) -> ClientError:
    reasons = ", ".join(codes)
    response: dict[str, Any] = {
        "Error": {
            "Code": "TransactionCanceledException",
            "Message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{reasons}]",
        }
    }
    if listed:
        response["CancellationReasons"] = [{"Code": c} for c in codes]
    return ClientError(response, "TransactWriteItems")


def ledger(client: FakeClient) -> DynamoDBUsageLedger:
    return DynamoDBUsageLedger(LedgerSettings(table="t-usage"), client=client)


def test_one_request_is_one_transaction_a_conditional_put_and_an_add_per_aggregate() -> None:
    client = FakeClient()
    event = finished("req-1", cost=None)

    assert ledger(client).apply(event) is ApplyResult.APPLIED

    ((operation, request),) = client.calls
    assert operation == "TransactWriteItems"
    put, *updates = request["TransactItems"]
    assert put["Put"]["ConditionExpression"] == "attribute_not_exists(pk)"
    item = put["Put"]["Item"]
    assert (item["pk"], item["sk"], item["costMicroUsd"]) == ({"S": "req#req-1"}, {"S": "usage"}, {"NULL": True})
    assert item["usage"]["M"]["total"] == {"N": "140"}
    memory = MemoryUsageLedger()
    memory.apply(event)
    assert sorted((u["Update"]["Key"]["pk"]["S"], u["Update"]["Key"]["sk"]["S"]) for u in updates) == sorted(
        k for k in memory.items if k[0].startswith("agg#")
    )
    for u in (u["Update"] for u in updates):
        assert u["TableName"] == "t-usage" and " ADD " in u["UpdateExpression"]
        added = {u["ExpressionAttributeNames"][n]: u["ExpressionAttributeValues"][v] for n, v in _adds(u)}
        assert added == {
            "requests": {"N": "1"},
            "promptTokens": {"N": "100"},
            "completionTokens": {"N": "40"},
            "totalTokens": {"N": "140"},
            "unknownCostRequests": {"N": "1"},
            "evidenceProviderReported": {"N": "1"},
            "status2xx": {"N": "1"},
        }


def _adds(update: dict[str, Any]) -> list[tuple[str, str]]:
    clause = update["UpdateExpression"].split(" ADD ", 1)[1]
    return [(name, value) for name, value in (part.strip().split(" ") for part in clause.split(","))]


@pytest.mark.parametrize("listed", [True, False], ids=["reasons-listed", "reasons-in-message"])
def test_a_failed_ledger_condition_is_a_duplicate(listed: bool) -> None:
    client = FakeClient(error=cancelled("ConditionalCheckFailed", "None", "None", listed=listed))

    assert ledger(client).apply(finished("req-1")) is ApplyResult.DUPLICATE


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (cancelled("None", "TransactionConflict", "None"), "TransactWriteItems failed: TransactionCanceledException"),
        (
            ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "TransactWriteItems"),
            "TransactWriteItems failed: ProvisionedThroughputExceededException",
        ),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "failed: EndpointConnectionError"),
    ],
    ids=["conflict", "throttled", "unreachable"],
)
def test_other_write_failures_are_unavailable_and_name_table_and_code(error: Exception, text: str) -> None:
    with pytest.raises(UsageLedgerUnavailable) as raised:
        ledger(FakeClient(error=error)).apply(finished("req-1"))

    assert str(raised.value).startswith("usage-ledger table t-usage: ")
    assert text in str(raised.value)
    assert "svc-a" not in str(raised.value) and "acme" not in str(raised.value)


def test_a_conflict_names_its_cancellation_reason() -> None:
    with pytest.raises(UsageLedgerUnavailable, match=r"\(TransactionConflict\)"):
        ledger(FakeClient(error=cancelled("None", "TransactionConflict"))).apply(finished("req-1"))


def test_a_query_reads_one_partition_between_the_days_and_follows_pages() -> None:
    def item(day: str, alias: str, cost: int) -> dict[str, Any]:
        return {
            "pk": {"S": "agg#tenant:acme/principal:alice#alias"},
            "sk": {"S": f"day#{day}#{alias}"},
            "day": {"S": day},
            "value": {"S": alias},
            "requests": {"N": "1"},
            "costMicroUsd": {"N": str(cost)},
        }

    client = FakeClient(
        pages=[
            {"Items": [item("2026-11-28", "chat", 10)], "LastEvaluatedKey": {"pk": {"S": "x"}}},
            {"Items": [item("2026-11-29", "chat", 20), item("2026-11-29", "embed", 5)]},
        ]
    )

    rows = ledger(client).query(
        UsageQuery(UsageScope("acme", "alice"), date(2026, 11, 28), date(2026, 11, 29), "alias")
    )

    assert [(r.key, r.totals.requests, r.totals.cost_micro_usd) for r in rows] == [("chat", 2, 30), ("embed", 1, 5)]
    first, second = (request for _, request in client.calls)
    assert first["KeyConditionExpression"] == "pk = :pk AND sk BETWEEN :lo AND :hi"
    assert first["ExpressionAttributeValues"] == {
        ":pk": {"S": "agg#tenant:acme/principal:alice#alias"},
        ":lo": {"S": "day#2026-11-28"},
        ":hi": {"S": "day#2026-11-29$"},
    }
    assert second["ExclusiveStartKey"] == {"pk": {"S": "x"}}


def test_a_failed_query_is_unavailable() -> None:
    error = ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "Query")

    with pytest.raises(UsageLedgerUnavailable, match="Query failed: ResourceNotFoundException"):
        ledger(FakeClient(error=error)).query(UsageQuery(UsageScope("acme"), date(2026, 11, 28), date(2026, 11, 29)))


def test_settings_come_from_the_environment() -> None:
    env = {
        "TOLLWAY_TABLE_USAGE_LEDGER": "stage-usage-ledger",
        "TOLLWAY_USAGE_RETENTION_DAYS": "90",
        "TOLLWAY_USAGE_AGGREGATE_RETENTION_DAYS": "1825",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }

    assert LedgerSettings.from_env(env) == LedgerSettings(
        table="stage-usage-ledger",
        retention_days=90,
        aggregate_retention_days=1825,
        endpoint="http://127.0.0.1:5000",
        region="eu-west-1",
    )
    assert LedgerSettings.from_env({"TOLLWAY_TABLE_USAGE_LEDGER": "t"}).retention_days == 400
    with pytest.raises(UsageLedgerUnavailable, match="TOLLWAY_TABLE_USAGE_LEDGER is not set"):
        LedgerSettings.from_env({})
    with pytest.raises(UsageLedgerUnavailable, match="TOLLWAY_USAGE_RETENTION_DAYS must be"):
        LedgerSettings.from_env({"TOLLWAY_TABLE_USAGE_LEDGER": "t", "TOLLWAY_USAGE_RETENTION_DAYS": "forever"})
