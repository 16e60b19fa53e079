"""A queue batch written at once: a request's events merged per item, replays harmless, failures per message.

On the in-memory store, which shares the planning and the merging with DynamoDB (one update per
item and batch when none of its events is stored). The DynamoDB store's own paths (the
conditional create, the update of what is missing, a condition failure that returns no item) run
here against a scripted client; ``tests/integration/test_audit_writer_local.py`` runs them on moto.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.unit.audit.test_store import T0, admitted, attempt_done, finished, retried_request, started
from tollway.audit.events import AuditEvent
from tollway.audit.store import (
    ApplyResult,
    AuditStoreError,
    DynamoDBAuditStore,
    MalformedEvent,
    MemoryAuditStore,
    StoreSettings,
)
from tollway.audit.store.plan import ItemWrite, WriteOutcome


def one_by_one(events: list[AuditEvent]) -> MemoryAuditStore:
    """The reference: one message per event, so one update per event, in order."""
    store = MemoryAuditStore()
    for event in events:
        store.apply([event])
    return store


def test_a_requests_events_in_one_message_are_one_update_per_item() -> None:
    events = retried_request("r-1")
    store = MemoryAuditStore()

    (result,) = store.apply_batch([events])

    assert result == ApplyResult(applied=6)
    assert store.updates == 3  # REQUEST, ATTEMPT#0001, ATTEMPT#0002
    assert store.items == one_by_one(events).items


def test_a_requests_events_split_across_the_messages_of_a_batch_are_merged_too() -> None:
    events = retried_request("r-split")
    store = MemoryAuditStore()

    results = store.apply_batch([events[:2], events[2:5], events[5:]])

    assert results == [ApplyResult(applied=2), ApplyResult(applied=3), ApplyResult(applied=1)]
    assert store.updates == 3
    assert store.items == one_by_one(events).items


def test_replaying_a_batch_however_it_is_batched_changes_nothing_and_counts_duplicates() -> None:
    events = retried_request("r-replay") + retried_request("r-other")
    store = MemoryAuditStore()
    store.apply_batch([events])
    before, updates = copy.deepcopy(store.items), store.updates

    again = store.apply_batch([events[::-1], events[3:8], events[:1]])

    assert again == [ApplyResult(duplicates=12), ApplyResult(duplicates=5), ApplyResult(duplicates=1)]
    assert store.items == before and store.updates == updates


def test_an_item_partly_stored_gets_only_its_missing_events_in_one_update() -> None:
    rid = "r-partial"
    events = [admitted(rid), started(rid, 1, T0 + 1), attempt_done(rid, 1, T0 + 9), finished(rid, T0 + 10)]
    store = MemoryAuditStore()
    store.apply(events[:2])
    updates = store.updates

    (result,) = store.apply_batch([events])

    assert result == ApplyResult(applied=2, duplicates=2)
    assert store.updates == updates + 2  # the request's finish, the attempt's finish
    assert store.items == one_by_one(events).items


def test_a_repeat_within_the_batch_is_written_once_and_counted_where_it_repeats() -> None:
    events = retried_request("r-twice")
    store = MemoryAuditStore()

    results = store.apply_batch([events[:4], events[2:], [events[0], events[0]]])

    assert results == [ApplyResult(applied=4), ApplyResult(applied=2, duplicates=2), ApplyResult(duplicates=2)]
    assert store.items == one_by_one(events).items


def test_merged_writes_give_the_items_of_one_update_per_event_in_every_order_and_batching() -> None:
    rid = "r-order"
    rival = dataclasses.replace(  # another finish of the same attempt: the later one in batch order wins
        attempt_done(rid, 1, T0 + 40, outcome="error", status=502), event_id="rival-finish"
    )
    events = [admitted(rid), started(rid, 1, T0 + 1), attempt_done(rid, 1, T0 + 30), finished(rid, T0 + 31), rival]
    for order in itertools.permutations(events):
        reference = one_by_one(list(order)).items
        for cut in range(len(order) + 1):
            merged = MemoryAuditStore()
            merged.apply_batch([list(order[:cut]), list(order[cut:])])
            assert merged.items == reference, ([e.kind for e in order], cut)


class FailingItem(MemoryAuditStore):
    """The in-memory store, failing every write of one item as DynamoDB would when throttled."""

    def __init__(self, pk: str, sk: str) -> None:
        super().__init__()
        self.failing = (pk, sk)

    def write_item(self, w: ItemWrite) -> WriteOutcome:
        if (w.pk, w.sk) == self.failing:
            raise AuditStoreError("audit table t: UpdateItem failed: ProvisionedThroughputExceededException")
        return super().write_item(w)


def test_a_failed_item_write_fails_exactly_the_messages_with_an_event_of_that_item() -> None:
    a, b = retried_request("r-a"), retried_request("r-b")
    store = FailingItem("REQ#r-a", "ATTEMPT#0002")
    messages = [
        [*a[:2], a[5]],  # r-a's request and first attempt: written
        a[2:5] + b[:1],  # r-a's second attempt fails, so this message fails (its r-b event is written anyway)
        b[1:],  # only r-b: written
        [a[4]],  # a repeat of an event of the failed write: fails with it, not reported a duplicate
    ]

    results = store.apply_batch(messages)

    assert [type(r).__name__ for r in results] == ["ApplyResult", "AuditStoreError", "ApplyResult", "AuditStoreError"]
    assert results[0] == ApplyResult(applied=3) and results[2] == ApplyResult(applied=5)
    assert ("REQ#r-a", "ATTEMPT#0002") not in store.items
    view = store.get_request("r-b")
    assert view is not None and not view.incomplete

    # The failed messages come back; the events already written are duplicates, the rest lands.
    store.failing = ("", "")
    redelivered = store.apply_batch([messages[1], messages[3]])
    assert redelivered == [ApplyResult(applied=2, duplicates=2), ApplyResult(duplicates=1)]
    assert store.items == one_by_one(a + b).items


def test_a_malformed_message_fails_alone_and_nothing_of_it_is_written() -> None:
    events = retried_request("r-ok")
    bad = dataclasses.replace(finished("r-ok", T0 + 99), event_id="bad", body={"status": "CANARY"})
    store = MemoryAuditStore()

    results = store.apply_batch([events[:3], [events[3], bad], events[4:]])

    assert results[0] == ApplyResult(applied=3) and results[2] == ApplyResult(applied=2)
    assert isinstance(results[1], MalformedEvent) and "CANARY" not in str(results[1])
    assert events[3].event_id not in store.items[("REQ#r-ok", "ATTEMPT#0002")]["eventIds"]


# ---------------------------------------------------------------- the DynamoDB store's paths


def _conditional_failure(operation: str, item: dict[str, Any] | None) -> ClientError:
    response: dict[str, Any] = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "failed"}}
    if item is not None:
        response["Item"] = item
    return ClientError(response, operation)


class ScriptedClient:
    """A DynamoDB client holding one table in DynamoDB's typed JSON, its writes conditional as DynamoDB's.

    ``return_item=False`` answers a failed condition without the item, as an endpoint that ignores
    ``ReturnValuesOnConditionCheckFailure`` would.
    """

    def __init__(self, *, return_item: bool = True) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.return_item = return_item

    def _ids(self, key: tuple[str, str]) -> set[str]:
        return set(self.items.get(key, {}).get("eventIds", {}).get("SS", []))

    def _fail(self, operation: str, key: tuple[str, str]) -> ClientError:
        return _conditional_failure(operation, copy.deepcopy(self.items[key]) if self.return_item else None)

    def put_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("PutItem", request))
        item = request["Item"]
        key = (item["pk"]["S"], item["sk"]["S"])
        assert request["ConditionExpression"] == "attribute_not_exists(pk)"
        if key in self.items:
            raise self._fail("PutItem", key)
        self.items[key] = copy.deepcopy(item)
        return {}

    def update_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("UpdateItem", request))
        key = (request["Key"]["pk"]["S"], request["Key"]["sk"]["S"])
        values = request["ExpressionAttributeValues"]
        checked = {v["S"] for k, v in values.items() if k.startswith(":e")}
        assert checked == set(values[":ids"]["SS"]), "the condition covers every event the update adds"
        if checked & self._ids(key):
            raise self._fail("UpdateItem", key)
        item = self.items.setdefault(key, {"pk": {"S": key[0]}, "sk": {"S": key[1]}})
        names = request["ExpressionAttributeNames"]
        sets = request["UpdateExpression"].removeprefix("SET ").split(" ADD ")[0]
        for name, fill, value in re.findall(r"(#\w+) = (?:(if_not_exists)\(#\w+, )?(:\w+)\)?", sets):
            if not fill or names[name] not in item:
                item[names[name]] = values[value]
        item["eventIds"] = {"SS": sorted(self._ids(key) | checked)}
        return {}

    def get_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("GetItem", request))
        assert request["ConsistentRead"] is True
        key = (request["Key"]["pk"]["S"], request["Key"]["sk"]["S"])
        return {"Item": {"eventIds": self.items[key]["eventIds"]}} if key in self.items else {}

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]


def dynamodb(client: ScriptedClient) -> DynamoDBAuditStore:
    return DynamoDBAuditStore(StoreSettings(table="t-audit", write_concurrency=1), client=client)


def test_dynamodb_makes_a_new_item_with_one_put_and_completes_it_with_one_update() -> None:
    rid = "r-dyn"
    client = ScriptedClient()
    store = dynamodb(client)

    results = store.apply_batch([[admitted(rid), started(rid, 1, T0 + 1)], [attempt_done(rid, 1, T0 + 9)]])
    later = store.apply_batch([[finished(rid, T0 + 10)]])

    assert results == [ApplyResult(applied=2), ApplyResult(applied=1)] and later == [ApplyResult(applied=1)]
    assert client.ops() == ["PutItem", "PutItem", "UpdateItem"]  # request, attempt (start and finish), finish
    put = client.calls[1][1]["Item"]
    assert (put["startedAt"], put["finishedAt"], put["outcome"]) == (
        {"N": str(T0 + 1)},
        {"N": str(T0 + 9)},
        {"S": "ok"},
    )


@pytest.mark.parametrize("return_item", [True, False], ids=["item-returned", "item-read"])
def test_dynamodb_writes_only_what_a_partly_stored_item_lacks_and_a_replay_costs_one_call(return_item: bool) -> None:
    rid = "r-dyn-partial"
    events = [admitted(rid), finished(rid, T0 + 10)]
    client = ScriptedClient(return_item=return_item)
    store = dynamodb(client)
    store.apply([events[0]])
    client.calls.clear()

    (result,) = store.apply_batch([events])
    read = ["GetItem"] if not return_item else []
    assert result == ApplyResult(applied=1, duplicates=1)
    assert client.ops() == ["PutItem", *read, "UpdateItem"]
    update = client.calls[-1][1]
    assert update["ExpressionAttributeValues"][":ids"] == {"SS": [events[1].event_id]}
    assert update["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"

    client.calls.clear()
    (replayed,) = store.apply_batch([events])
    assert replayed == ApplyResult(duplicates=2)
    assert client.ops() == ["PutItem", *read]  # the failed create says both are stored: nothing more to write


def test_dynamodb_reports_a_condition_that_fails_with_none_of_its_events_stored() -> None:
    """Not a loop: an update whose condition fails must find one of its events stored, or it is an error."""

    class Contradicting(ScriptedClient):
        def update_item(self, **request: Any) -> dict[str, Any]:
            self.calls.append(("UpdateItem", request))
            raise _conditional_failure("UpdateItem", {"eventIds": {"SS": ["someone-else"]}})

    client = Contradicting()
    (result,) = dynamodb(client).apply_batch([[finished("r-odd", T0)]])

    assert isinstance(result, AuditStoreError) and client.ops() == ["UpdateItem"]


def test_dynamodb_writes_the_items_of_a_batch_concurrently_and_never_more_than_its_bound() -> None:
    """Four writes must be in flight together to pass the barrier; a fifth never is."""
    import threading

    class Concurrent(ScriptedClient):
        def __init__(self) -> None:
            super().__init__()
            self.barrier = threading.Barrier(4, timeout=10)
            self.lock = threading.Lock()
            self.in_flight = self.most = 0

        def put_item(self, **request: Any) -> dict[str, Any]:
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            try:
                self.barrier.wait()  # raises BrokenBarrierError unless 4 callers meet here
                with self.lock:
                    return super().put_item(**request)
            finally:
                with self.lock:
                    self.in_flight -= 1

    client = Concurrent()
    store = DynamoDBAuditStore(StoreSettings(table="t-audit", write_concurrency=4), client=client)
    messages = [[admitted(f"r-{n}"), started(f"r-{n}", 1, T0 + 1)] for n in range(4)]  # 8 new items

    results = store.apply_batch(messages)

    assert results == [ApplyResult(applied=2)] * 4
    assert client.ops() == ["PutItem"] * 8 and client.most == 4
