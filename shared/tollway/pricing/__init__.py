"""The versioned pricing catalog: effective-dated snapshots, cost computation, an explicit unknown price.

See ``docs/pricing.md``. The hot path is :func:`price` (and :func:`reservation_cost`) on a
:class:`PricingSnapshot`: dict lookups and integer arithmetic. Sources are parsed and validated
with pydantic off the request path (:func:`parse_models_dev`, :func:`parse_overrides`,
:func:`compile_snapshot`), published with :func:`publish` and loaded with :class:`SnapshotLoader`.

The stores are :mod:`tollway.pricing.store`; its S3 backend imports botocore only when it builds a
client, so importing this package never pulls in an AWS library.
"""

from tollway.pricing.cost import WORST_CASE_TIER, Cost, TokenCounts, UnknownPrice, price, reservation_cost
from tollway.pricing.errors import PricingError, PricingSourceError, SnapshotCorrupt, SnapshotStoreError
from tollway.pricing.publish import (
    DEFAULT_PREFIX,
    Pointer,
    PublishResult,
    SnapshotLoader,
    load_current,
    pointer_key,
    publish,
    read_pointer,
    snapshot_key,
)
from tollway.pricing.rates import BASE_TIER, Contract, ModelPrice, Rates, Tier, micro_per_mtok
from tollway.pricing.snapshot import PricingSnapshot, SourceInfo, decode_snapshot, encode_snapshot
from tollway.pricing.sources import (
    MODELS_DEV,
    OVERRIDES,
    Catalog,
    Overrides,
    compile_snapshot,
    parse_models_dev,
    parse_overrides,
)
from tollway.pricing.store import MemorySnapshotStore, SnapshotStore

__all__ = [
    "BASE_TIER",
    "DEFAULT_PREFIX",
    "MODELS_DEV",
    "OVERRIDES",
    "WORST_CASE_TIER",
    "Catalog",
    "Contract",
    "Cost",
    "MemorySnapshotStore",
    "ModelPrice",
    "Overrides",
    "Pointer",
    "PricingError",
    "PricingSnapshot",
    "PricingSourceError",
    "PublishResult",
    "Rates",
    "SnapshotCorrupt",
    "SnapshotLoader",
    "SnapshotStore",
    "SnapshotStoreError",
    "SourceInfo",
    "Tier",
    "TokenCounts",
    "UnknownPrice",
    "compile_snapshot",
    "decode_snapshot",
    "encode_snapshot",
    "load_current",
    "micro_per_mtok",
    "parse_models_dev",
    "parse_overrides",
    "pointer_key",
    "price",
    "publish",
    "read_pointer",
    "reservation_cost",
    "snapshot_key",
]
