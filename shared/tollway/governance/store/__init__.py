"""The lease stores: the authoritative counters that replicas take leases from.

Modules: ``base`` (the :class:`LeaseStore` interface and :class:`LeaseStoreUnavailable`), ``memory``
and ``dynamodb`` (its two backends; the DynamoDB one with its :class:`LeaseStoreSettings`).
"""

from tollway.governance.store.base import LeaseStore, LeaseStoreUnavailable
from tollway.governance.store.dynamodb import DynamoDBLeaseStore, LeaseStoreSettings
from tollway.governance.store.memory import MemoryLeaseStore

__all__ = ["DynamoDBLeaseStore", "LeaseStore", "LeaseStoreSettings", "LeaseStoreUnavailable", "MemoryLeaseStore"]

_memory_is_a_store: type[LeaseStore] = MemoryLeaseStore
_dynamodb_is_a_store: type[LeaseStore] = DynamoDBLeaseStore
