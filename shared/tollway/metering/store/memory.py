"""The usage ledger in a dict, for tests: the same parsing, layout and query code as DynamoDB, no I/O."""

from __future__ import annotations

import copy
import threading
from typing import Any

from tollway.audit.events import AuditEvent
from tollway.metering.layout import day_range, plan
from tollway.metering.query import UsageQuery, UsageRow, rows_from_items, source_partition
from tollway.metering.record import usage_record
from tollway.metering.store.base import DEFAULT_RETENTION_DAYS, ApplyResult

__all__ = ["MemoryUsageLedger"]


class MemoryUsageLedger:
    def __init__(
        self, *, retention_days: int = DEFAULT_RETENTION_DAYS, aggregate_retention_days: int | None = None
    ) -> None:
        self.retention_days = retention_days
        self.aggregate_retention_days = aggregate_retention_days
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        """``(pk, sk)`` → the item's attributes, as the table would hold them."""
        self._lock = threading.Lock()

    def apply(self, event: AuditEvent) -> ApplyResult:
        record = usage_record(event)
        if record is None:
            return ApplyResult.SKIPPED
        writes = plan(
            record, retention_days=self.retention_days, aggregate_retention_days=self.aggregate_retention_days
        )
        ledger = writes.ledger_item
        with self._lock:
            if (ledger["pk"], ledger["sk"]) in self.items:
                return ApplyResult.DUPLICATE
            self.items[ledger["pk"], ledger["sk"]] = copy.deepcopy(ledger)
            for inc in writes.increments:
                item = self.items.setdefault((inc.pk, inc.sk), {"pk": inc.pk, "sk": inc.sk})
                item.update(inc.labels)
                if inc.expires_at is not None:
                    item["expiresAt"] = inc.expires_at
                for attr, n in inc.counters.items():
                    item[attr] = item.get(attr, 0) + n
        return ApplyResult.APPLIED

    def query(self, query: UsageQuery) -> list[UsageRow]:
        pk = source_partition(query.scope, query.group_by)
        lo, hi = day_range(query.from_day, query.to_day)
        with self._lock:
            found = [copy.deepcopy(item) for (p, s), item in self.items.items() if p == pk and lo <= s <= hi]
        return rows_from_items(found, query)
