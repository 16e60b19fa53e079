"""The PII vault: durable token → value mappings for ``session`` and ``host`` scoped placeholders.

Modules: ``base`` (the :class:`PiiVault` interface, :class:`VaultEntry` and the errors),
``memory`` (one process's vault, for tests), ``envelope`` (AES-256-GCM under KMS data keys, with
bounded key caches) and ``dynamodb`` (the durable vault: a DynamoDB table and a KMS key).
docs/pii-vault.md describes the contract, the item layout and the IAM boundary.
"""

from tollway.pii.vault.base import (
    MAX_VALUE_BYTES,
    PiiVault,
    TokenExists,
    VaultEntry,
    VaultError,
    VaultScope,
    VaultUnavailable,
    expiry_deadline,
)
from tollway.pii.vault.dynamodb import DynamoDBPiiVault, DynamoDBVaultSettings
from tollway.pii.vault.memory import MemoryPiiVault

__all__ = [
    "MAX_VALUE_BYTES",
    "DynamoDBPiiVault",
    "DynamoDBVaultSettings",
    "MemoryPiiVault",
    "PiiVault",
    "TokenExists",
    "VaultEntry",
    "VaultError",
    "VaultScope",
    "VaultUnavailable",
    "expiry_deadline",
]

_memory_is_a_vault: type[PiiVault] = MemoryPiiVault
_dynamodb_is_a_vault: type[PiiVault] = DynamoDBPiiVault
