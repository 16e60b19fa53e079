"""Lease stores: the authoritative counters that replicas take leases from (see :mod:`.store`)."""

from tollway.governance.lease_stores.dynamodb import DynamoDBLeaseStore, LeaseStoreSettings
from tollway.governance.lease_stores.memory import MemoryLeaseStore
from tollway.governance.lease_stores.store import LeaseStore, LeaseStoreUnavailable

__all__ = ["DynamoDBLeaseStore", "LeaseStore", "LeaseStoreSettings", "LeaseStoreUnavailable", "MemoryLeaseStore"]

_memory_is_a_store: type[LeaseStore] = MemoryLeaseStore
_dynamodb_is_a_store: type[LeaseStore] = DynamoDBLeaseStore
