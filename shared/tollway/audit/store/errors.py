"""The audit store's two errors: the store failed, or an event cannot be placed."""

from __future__ import annotations

from tollway.exceptions import TollwayError

__all__ = ["AuditStoreError", "MalformedEvent"]


class AuditStoreError(TollwayError, RuntimeError):
    """The store could not be read or written; the message names the table, never an event body."""


class MalformedEvent(TollwayError, ValueError):
    """An event that decodes but cannot be placed; the message names the event and field, never a value."""
