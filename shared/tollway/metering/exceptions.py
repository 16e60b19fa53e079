"""The metering errors. Their text names events, fields, tables and error codes, never a value from an event.

::

    TollwayError
    └── MeteringError
        ├── MalformedUsageEvent      a request_finished event the ledger cannot account (a poison message)
        ├── InvalidUsageQuery        a GET /v1/usage query that cannot be answered (a 400)
        └── UsageLedgerUnavailable   the ledger table could not be read or written (retry later)
"""

from __future__ import annotations

from tollway.exceptions import TollwayError

__all__ = ["InvalidUsageQuery", "MalformedUsageEvent", "MeteringError", "UsageLedgerUnavailable"]


class MeteringError(TollwayError):
    """Base of every metering error."""


class MalformedUsageEvent(MeteringError, ValueError):
    """An event that decodes as an audit event but breaks the usage contract; retrying cannot fix it."""


class InvalidUsageQuery(MeteringError, ValueError):
    """A usage query with a bad range, grouping or scope; the text is safe to show the caller."""


class UsageLedgerUnavailable(MeteringError, RuntimeError):
    """The ledger store failed (throttled, unreachable, a transaction conflict); the operation may be retried."""
