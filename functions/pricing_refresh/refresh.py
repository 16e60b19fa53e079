"""One refresh: read the configured sources, compile a snapshot, publish it if it is new.

Failure policy, decided here:

- A source that is unreadable or invalid (or sources that price nothing) **rejects** the whole
  refresh: nothing is written, the pointer keeps naming the last valid snapshot, and the outcome
  says which source failed and where. It does not raise: retrying bad content changes nothing,
  and the next scheduled run reads the sources afresh.
- A failure of the pricing bucket itself (:class:`~tollway.pricing.SnapshotStoreError`) raises,
  so the invocation fails, the schedule's retry policy runs and the error metric alarms.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from functions.pricing_refresh.reader import SourceReader
from functions.pricing_refresh.settings import RefreshSettings
from tollway.pricing import (
    Catalog,
    Overrides,
    PricingSourceError,
    SnapshotCorrupt,
    SnapshotStore,
    compile_snapshot,
    parse_models_dev,
    parse_overrides,
    publish,
    read_pointer,
)

__all__ = ["MAX_REPORTED_ISSUES", "refresh"]

MAX_REPORTED_ISSUES: Final = 20


def _current(store: SnapshotStore, prefix: str) -> str | None:
    try:
        pointer = read_pointer(store, prefix)
    except SnapshotCorrupt:
        return None
    return None if pointer is None else pointer.version


def _rejected(exc: PricingSourceError, store: SnapshotStore, settings: RefreshSettings) -> dict[str, Any]:
    current = _current(store, settings.store.prefix)
    return {
        "status": "rejected",
        "version": None,
        "current": current,
        "previous": current,
        "snapshotWritten": False,
        "source": exc.source,
        "issues": [str(i) for i in exc.issues[:MAX_REPORTED_ISSUES]],
        "issueCount": len(exc.issues),
    }


def refresh(settings: RefreshSettings, store: SnapshotStore, reader: SourceReader, now: datetime) -> dict[str, Any]:
    """The outcome as a JSON-ready dict (``status``: published, unchanged, pending or rejected)."""
    try:
        catalogs: list[Catalog] = [parse_models_dev(reader.read(uri), uri=uri) for uri in settings.sources]
        overrides: Overrides | None = None
        if settings.overrides is not None:
            overrides = parse_overrides(reader.read(settings.overrides), uri=settings.overrides)
        snapshot = compile_snapshot(catalogs, overrides, now=now)
    except PricingSourceError as exc:
        return _rejected(exc, store, settings)
    result = publish(store, snapshot, now=now, prefix=settings.store.prefix)
    return {
        "status": result.status,
        "version": result.version,
        "current": result.current,
        "previous": result.previous,
        "snapshotWritten": result.snapshot_written,
        "effectiveFrom": snapshot.effective_from.isoformat().replace("+00:00", "Z"),
        "prices": len(snapshot.catalog),
        "contracts": len(snapshot.contracts),
        "sources": [s.uri for s in snapshot.sources],
    }
