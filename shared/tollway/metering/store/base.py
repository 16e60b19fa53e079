"""The usage ledger's interface, its settings and the outcome of applying one event.

A ledger accounts each logical request once. :meth:`UsageLedger.apply` writes the request's ledger
item and adds it to every aggregate it counts in, all or nothing; a second ``request_finished`` for
the same request (a redelivery, a resend after a lost acknowledgement) changes nothing and is
reported :attr:`ApplyResult.DUPLICATE`. Events of other kinds are :attr:`ApplyResult.SKIPPED`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tollway.audit.events import AuditEvent
from tollway.metering.exceptions import UsageLedgerUnavailable
from tollway.metering.query import UsageQuery, UsageRow

__all__ = ["DEFAULT_RETENTION_DAYS", "ApplyResult", "LedgerSettings", "UsageLedger"]

DEFAULT_RETENTION_DAYS: Final = 400
TABLE_ENV: Final = "TOLLWAY_TABLE_USAGE_LEDGER"
RETENTION_ENV: Final = "TOLLWAY_USAGE_RETENTION_DAYS"
AGGREGATE_RETENTION_ENV: Final = "TOLLWAY_USAGE_AGGREGATE_RETENTION_DAYS"


class ApplyResult(enum.StrEnum):
    APPLIED = "applied"
    """The request was new: its ledger item and aggregate increments were written."""
    DUPLICATE = "duplicate"
    """The request was already accounted: nothing changed."""
    SKIPPED = "skipped"
    """Not a ``request_finished`` event: not usage."""


class UsageLedger(Protocol):
    def apply(self, event: AuditEvent) -> ApplyResult:
        """Account one event; raises :class:`MalformedUsageEvent` or :class:`UsageLedgerUnavailable`."""
        ...

    def query(self, query: UsageQuery) -> list[UsageRow]:
        """The rows answering ``query``, sorted by key; raises :class:`UsageLedgerUnavailable`."""
        ...


def _days(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 36_500:
        raise UsageLedgerUnavailable(f"{name} must be a whole number of days, 1-36500")
    return int(text)


class LedgerSettings(BaseModel):
    """Where the ledger lives and how long its items are kept, read from the function's environment."""

    model_config = ConfigDict(frozen=True)

    table: str = Field(min_length=1, max_length=255)
    retention_days: int = Field(default=DEFAULT_RETENTION_DAYS, ge=1, le=36_500)
    """Ledger items (one per request) expire this long after their event."""
    aggregate_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    """Aggregates expire this long after the end of their day; ``None``: they are kept."""
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    region: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, table: str | None = None) -> LedgerSettings:
        """``TOLLWAY_TABLE_USAGE_LEDGER``, ``TOLLWAY_USAGE_RETENTION_DAYS``,
        ``TOLLWAY_USAGE_AGGREGATE_RETENTION_DAYS``, ``AWS_ENDPOINT_URL`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``."""
        env = os.environ if environ is None else environ
        name = table or env.get(TABLE_ENV, "").strip()
        if not name:
            raise UsageLedgerUnavailable(f"{TABLE_ENV} is not set: it names the usage-ledger table")
        return cls(
            table=name,
            retention_days=_days(env, RETENTION_ENV) or DEFAULT_RETENTION_DAYS,
            aggregate_retention_days=_days(env, AGGREGATE_RETENTION_ENV),
            endpoint=env.get("AWS_ENDPOINT_URL", "").strip() or None,
            region=env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None,
        )
