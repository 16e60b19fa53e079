"""Where the audit store lives and how hard the writer may drive it, read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from tollway.audit.store.errors import AuditStoreError

__all__ = ["DEFAULT_RETENTION_DAYS", "DEFAULT_WRITE_CONCURRENCY", "StoreSettings"]

DEFAULT_RETENTION_DAYS: Final = 90
DEFAULT_WRITE_CONCURRENCY: Final = 16
"""Item writes in flight at once. Against DynamoDB a write is a network round trip, and writes to
different items proceed in parallel, so this is what keeps a batch short there. The local cloud
serializes DynamoDB's writes (``tollway.cloud.moto_server``), so it gains less: the default batch
took 4.3 s with 16, 4.8 s with 1 (``python -m bench.audit_writer``)."""


class StoreSettings(BaseModel):
    """Where the store lives, read from the environment the function (or the CLI) runs in."""

    model_config = ConfigDict(frozen=True)

    table: str = Field(min_length=1, max_length=255)
    retention_days: int = Field(default=DEFAULT_RETENTION_DAYS, ge=1, le=36_500)
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    write_concurrency: int = Field(default=DEFAULT_WRITE_CONCURRENCY, ge=1, le=64)
    """Bound on the item writes of one batch in flight at once (and on the client's connections)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, table: str | None = None) -> StoreSettings:
        """``TOLLWAY_TABLE_AUDIT``, ``TOLLWAY_AUDIT_RETENTION_DAYS`` and ``AWS_ENDPOINT_URL``; ``table`` wins."""
        env = os.environ if environ is None else environ
        name = table or env.get("TOLLWAY_TABLE_AUDIT", "").strip()
        if not name:
            raise AuditStoreError("TOLLWAY_TABLE_AUDIT is not set: it names the audit table")
        days = env.get("TOLLWAY_AUDIT_RETENTION_DAYS", "").strip() or str(DEFAULT_RETENTION_DAYS)
        if not days.isdigit():
            raise AuditStoreError("TOLLWAY_AUDIT_RETENTION_DAYS must be a whole number of days")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        return cls(table=name, retention_days=int(days), endpoint=endpoint)
