"""The usage ledger's store: the :class:`UsageLedger` interface and its two backends.

The ledger applies ``request_finished`` events, one request at a time, all or nothing, and answers
usage queries from the per-day aggregates. What the table holds is :mod:`tollway.metering.layout`,
what a query reads :mod:`tollway.metering.query`; both are shared by the backends, which only
read and write items.

Modules: ``base`` (the interface, its settings and :class:`ApplyResult`), ``memory`` and
``dynamodb`` (the two backends of :class:`UsageLedger`).
"""

from tollway.metering.store.base import DEFAULT_RETENTION_DAYS, ApplyResult, LedgerSettings, UsageLedger
from tollway.metering.store.dynamodb import DynamoDBUsageLedger
from tollway.metering.store.memory import MemoryUsageLedger

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "ApplyResult",
    "DynamoDBUsageLedger",
    "LedgerSettings",
    "MemoryUsageLedger",
    "UsageLedger",
]
