"""Metering: the usage ledger the reconciler writes from ``request_finished`` events, and ``GET /v1/usage``.

- :mod:`~tollway.metering.record`: the event-body contract, parsed into a :class:`UsageRecord`;
- :mod:`~tollway.metering.layout`: the table's items (one ledger item per request, per-day aggregates);
- :mod:`~tollway.metering.store`: the :class:`UsageLedger` interface, with a DynamoDB and a memory backend;
- :mod:`~tollway.metering.query`: who sees what, and the response body.

See ``docs/usage.md``.
"""

from tollway.metering.exceptions import InvalidUsageQuery, MalformedUsageEvent, MeteringError, UsageLedgerUnavailable
from tollway.metering.layout import UsageScope
from tollway.metering.query import (
    ADMIN_ROLE,
    GROUP_BY,
    MAX_QUERY_DAYS,
    GroupBy,
    UsageQuery,
    UsageRow,
    caller_scope,
    parse_usage_query,
    usage_response,
)
from tollway.metering.record import EVIDENCE, Evidence, UsageRecord, usage_record
from tollway.metering.store import (
    DEFAULT_RETENTION_DAYS,
    ApplyResult,
    DynamoDBUsageLedger,
    LedgerSettings,
    MemoryUsageLedger,
    UsageLedger,
)
from tollway.metering.totals import UsageTotals

__all__ = [
    "ADMIN_ROLE",
    "DEFAULT_RETENTION_DAYS",
    "EVIDENCE",
    "GROUP_BY",
    "MAX_QUERY_DAYS",
    "ApplyResult",
    "DynamoDBUsageLedger",
    "Evidence",
    "GroupBy",
    "InvalidUsageQuery",
    "LedgerSettings",
    "MalformedUsageEvent",
    "MemoryUsageLedger",
    "MeteringError",
    "UsageLedger",
    "UsageLedgerUnavailable",
    "UsageQuery",
    "UsageRecord",
    "UsageRow",
    "UsageScope",
    "UsageTotals",
    "caller_scope",
    "parse_usage_query",
    "usage_record",
    "usage_response",
]
