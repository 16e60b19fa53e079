"""The audit store in a dict, for unit tests: the same planning, merging and views as DynamoDB, no I/O."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from tollway.audit.events import AuditEvent
from tollway.audit.store.base import ApplyResult, check_limit
from tollway.audit.store.layout import EVENT_IDS, REQUEST_PK_PREFIX, REQUEST_SK, iso_ts
from tollway.audit.store.plan import ItemWrite, WriteOutcome, merge, plan_batch
from tollway.audit.store.settings import DEFAULT_RETENTION_DAYS
from tollway.audit.store.views import RequestRecord, RequestView, request_record, request_view

__all__ = ["MemoryAuditStore"]


class MemoryAuditStore:
    """Each item write is one merged update of the events not yet in the item's ``eventIds``."""

    def __init__(self, *, retention_days: int = DEFAULT_RETENTION_DAYS) -> None:
        self.retention_days = retention_days
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        """``(pk, sk)`` → the item's attributes, as DynamoDB would hold them (``eventIds`` a set)."""
        self.updates = 0
        """Item updates made (each merges one or more events), for tests of the merging."""
        self._lock = threading.Lock()

    def write_item(self, w: ItemWrite) -> WriteOutcome:
        """One item write: the events of ``w`` not stored yet, as one update. A test double that
        fails some writes, as DynamoDB would when throttled, overrides this."""
        with self._lock:
            item = self.items.setdefault((w.pk, w.sk), {"pk": w.pk, "sk": w.sk})
            ids: set[str] = item.setdefault(EVENT_IDS, set())
            fresh = [e for e in w.events if e.event_id not in ids]
            if not fresh:
                return frozenset()
            owned, shared = merge(fresh)
            item.update(copy.deepcopy(owned))
            for key, value in shared.items():
                item.setdefault(key, copy.deepcopy(value))
            ids.update(e.event_id for e in fresh)
            self.updates += 1
            return frozenset(e.event_id for e in fresh)

    def apply_batch(self, messages: Sequence[Sequence[AuditEvent]]) -> list[ApplyResult | Exception]:
        plan = plan_batch(messages, self.retention_days)
        outcomes: list[WriteOutcome] = []
        for w in plan.writes:
            try:
                outcomes.append(self.write_item(w))
            except Exception as exc:  # it fails the messages of this write, and only them
                outcomes.append(exc)
        return plan.results(outcomes)

    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        (result,) = self.apply_batch([events])
        if isinstance(result, Exception):
            raise result
        return result

    def get_request(self, request_id: str) -> RequestView | None:
        pk = f"{REQUEST_PK_PREFIX}{request_id}"
        with self._lock:
            items = [copy.deepcopy(item) for (p, _), item in self.items.items() if p == pk]
        return request_view(request_id, items)

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        check_limit(limit)
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
        return [request_record(i) for i in found[:limit]]

    def scan_requests(self, since_ms: int, until_ms: int) -> Iterator[RequestRecord]:
        """The requests in ``[since_ms, until_ms)``, by ``ts`` then request id (a snapshot taken at the call)."""
        since, until = iso_ts(max(0, since_ms)), iso_ts(max(0, until_ms))
        with self._lock:
            found = [
                copy.deepcopy(item)
                for (_, sk), item in self.items.items()
                if sk == REQUEST_SK and isinstance(item.get("ts"), str) and since <= item["ts"] < until
            ]
        found.sort(key=lambda i: (i["ts"], i["pk"]))
        return iter([request_record(i) for i in found])
