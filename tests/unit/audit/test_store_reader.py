"""Readers never crash on a partial item: the request id comes from the key, every other field may be missing.

The local cloud applies an update's actions one by one without a lock against reads, so a Scan
or Query can return an item that holds its index keys and nothing else yet; an item can also
hold only a terminal event (its start still in flight). Both stores read through the same views.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.audit.test_store import T0
from tollway.audit.store import DynamoDBAuditStore, MemoryAuditStore, StoreSettings, iso_ts


class ReadOnlyClient:
    """Answers every Scan, Query and key Query with the items given, in DynamoDB's typed JSON."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def scan(self, **_: Any) -> dict[str, Any]:
        return {"Items": self.items}

    def query(self, **_: Any) -> dict[str, Any]:
        return {"Items": self.items}


HALF_WRITTEN = {  # the keys, the index keys, and nothing else yet
    "pk": {"S": "REQ#r-partial"},
    "sk": {"S": "REQUEST"},
    "ts": {"S": iso_ts(T0)},
    "principalId": {"S": "p-1"},
}


def test_a_listed_item_without_request_id_takes_its_id_from_the_key() -> None:
    store = DynamoDBAuditStore(StoreSettings(table="t"), client=ReadOnlyClient([HALF_WRITTEN]))

    for listed in (store.list_requests(0), store.list_requests(0, principal_id="p-1")):
        (record,) = listed
        assert (record.request_id, record.principal_id, record.incomplete) == ("r-partial", "p-1", True)
        assert record.admitted_at_ms is None and record.status is None


def test_odd_items_are_read_as_far_as_they_go() -> None:
    items = [
        {"pk": {"S": "REQ#r-odd"}, "sk": {"S": "ATTEMPT#0002"}},  # an attempt with nothing but its key
        {"pk": {"S": "REQ#r-odd"}, "sk": {"S": "ATTEMPT#x"}},  # not an attempt number: skipped
        {"pk": {"S": "REQ#r-odd"}, "sk": {"S": "REQUEST"}, "status": {"S": "not a number"}},
    ]
    store = DynamoDBAuditStore(StoreSettings(table="t"), client=ReadOnlyClient(items))

    view = store.get_request("r-odd")

    assert view is not None and view.request.request_id == "r-odd" and view.request.status is None
    assert [(a.number, a.started_at_ms, a.incomplete) for a in view.attempts] == [(2, None, True)]


@pytest.mark.parametrize("principal", [None, "p-1"], ids=["scan", "index"])
def test_the_memory_store_lists_a_partial_item_too(principal: str | None) -> None:
    store = MemoryAuditStore()
    store.items[("REQ#r-partial", "REQUEST")] = {
        "pk": "REQ#r-partial",
        "sk": "REQUEST",
        "ts": iso_ts(T0),
        "principalId": "p-1",
    }

    (record,) = store.list_requests(0, principal_id=principal)

    assert record.request_id == "r-partial" and record.incomplete
