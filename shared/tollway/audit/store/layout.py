"""The audit table's item layout: keys, the event-id set, the index, and the fixed-width time key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = [
    "ATTEMPT_SK_PREFIX",
    "EVENT_IDS",
    "MAX_ATTEMPT",
    "MAX_ID_CHARS",
    "PRINCIPAL_INDEX",
    "REQUEST_PK_PREFIX",
    "REQUEST_SK",
    "iso_ts",
    "request_id_of",
]

REQUEST_PK_PREFIX: Final = "REQ#"
REQUEST_SK: Final = "REQUEST"
ATTEMPT_SK_PREFIX: Final = "ATTEMPT#"
EVENT_IDS: Final = "eventIds"
PRINCIPAL_INDEX: Final = "by-principal"
MAX_ATTEMPT: Final = 9999
"""``ATTEMPT#<n:04d>`` sorts attempts by number only up to four digits."""
MAX_ID_CHARS: Final = 256
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def iso_ts(ms: int) -> str:
    """Epoch milliseconds as fixed-width ISO-8601 UTC (``2025-01-31T12:00:00.000Z``): string order is time order."""
    t = _EPOCH + timedelta(milliseconds=ms)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.{ms % 1000:03d}Z"


def request_id_of(pk: object) -> str | None:
    """The request id an item's partition key names, or ``None`` for a key that is not a request's.

    Readers take the id from the key, the one attribute every item has from its first write on:
    an item read while an update is still being applied (the local cloud applies an update's
    actions one by one) may lack any other attribute, ``requestId`` included.
    """
    if isinstance(pk, str) and pk.startswith(REQUEST_PK_PREFIX) and len(pk) > len(REQUEST_PK_PREFIX):
        return pk[len(REQUEST_PK_PREFIX) :]
    return None
