"""scan_requests: the export's reader of a time range, on the memory store and (with a fake client) DynamoDB."""

from __future__ import annotations

from typing import Any

from tests.support.audit_events import admitted, attempt_done, finished, rejected, started
from tollway.audit.store import DynamoDBAuditStore, MemoryAuditStore, StoreSettings, iso_ts

T0 = 1_798_761_600_000


def test_memory_scan_returns_the_half_open_range_by_time_then_id() -> None:
    store = MemoryAuditStore()
    store.apply([admitted("b", T0), started("b", 1, T0 + 1), attempt_done("b", 1, T0 + 2), finished("b", T0 + 3)])
    store.apply([admitted("a", T0)])
    store.apply([rejected("c", T0 + 10)])
    store.apply([admitted("d", T0 + 20)])
    store.apply([finished("no-admission", T0 + 5)])  # no ts yet: not found

    found = list(store.scan_requests(T0, T0 + 20))

    assert [(r.request_id, r.at_ms) for r in found] == [("a", T0), ("b", T0), ("c", T0 + 10)]
    assert found[1].finished_at_ms == T0 + 3 and found[2].rejected
    assert list(store.scan_requests(T0 + 20, T0 + 20)) == []


class _FakeDynamo:
    """Answers Scan with the pages given, and records each call's parameters."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []

    def scan(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        return self.pages[len(self.calls) - 1]


def _item(request_id: str, ts_ms: int) -> dict[str, Any]:
    return {
        "pk": {"S": f"REQ#{request_id}"},
        "sk": {"S": "REQUEST"},
        "ts": {"S": iso_ts(ts_ms)},
        "admittedAt": {"N": str(ts_ms)},
        "content": {"M": {"bucket": {"S": "b"}, "size": {"N": "12"}, "purposes": {"L": [{"S": "audit"}]}}},
    }


def test_dynamodb_scan_filters_the_range_and_follows_every_page() -> None:
    fake = _FakeDynamo(
        [
            {"Items": [_item("r1", T0)], "LastEvaluatedKey": {"pk": {"S": "REQ#r1"}, "sk": {"S": "REQUEST"}}},
            {"Items": [_item("r2", T0 + 7)]},
        ]
    )
    store = DynamoDBAuditStore(StoreSettings(table="audit"), client=fake)

    found = list(store.scan_requests(T0, T0 + 10))

    assert [(r.request_id, r.admitted_at_ms) for r in found] == [("r1", T0), ("r2", T0 + 7)]
    assert found[0].content == {"bucket": "b", "size": 12, "purposes": ["audit"]}
    first, second = fake.calls
    assert first["TableName"] == "audit"
    assert first["FilterExpression"] == "sk = :request AND #ts BETWEEN :since AND :last"
    assert first["ExpressionAttributeValues"][":since"] == {"S": iso_ts(T0)}
    assert first["ExpressionAttributeValues"][":last"] == {"S": iso_ts(T0 + 9)}  # until is exclusive
    assert second["ExclusiveStartKey"] == {"pk": {"S": "REQ#r1"}, "sk": {"S": "REQUEST"}}


def test_dynamodb_scan_of_an_empty_range_reads_nothing() -> None:
    fake = _FakeDynamo([])
    store = DynamoDBAuditStore(StoreSettings(table="audit"), client=fake)
    assert list(store.scan_requests(T0, T0)) == []
    assert fake.calls == []
