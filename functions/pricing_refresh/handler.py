"""EventBridge schedule → the pricing refresh (:mod:`functions.pricing_refresh.refresh`) → an outcome dict.

The store, the settings, the source reader and the clock come from factories, so tests hand
:func:`build_handler` fakes; the deployed :data:`handler` builds the S3 store and reader from
the environment on its first invocation, never at import.

Logs carry the outcome's status, versions, counts, source URIs and issue paths: never a rate
value or an object body. A rejected source returns normally (the pointer is unchanged); a
pricing-bucket failure raises (:class:`~tollway.pricing.SnapshotStoreError`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from functions.pricing_refresh.reader import SourceReader, UriReader
from functions.pricing_refresh.refresh import refresh
from functions.pricing_refresh.settings import RefreshSettings
from tollway.pricing.store import S3SnapshotStore, SnapshotStore, StoreSettings, s3_client

__all__ = ["Clock", "ReaderFactory", "ScheduleHandler", "StoreFactory", "build_handler", "handler"]

log = logging.getLogger("tollway.pricing_refresh")

StoreFactory = Callable[[RefreshSettings], SnapshotStore]
ReaderFactory = Callable[[RefreshSettings], SourceReader]
Clock = Callable[[], datetime]
ScheduleHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


@functools.lru_cache(maxsize=4)
def _store_for(settings: StoreSettings) -> S3SnapshotStore:
    return S3SnapshotStore.from_settings(settings)


def default_store(settings: RefreshSettings) -> SnapshotStore:
    """The S3 store of the configured bucket, built on first use and reused while the settings hold."""
    return _store_for(settings.store)


def default_reader(settings: RefreshSettings) -> SourceReader:
    return UriReader(s3_client(settings.store.endpoint, settings.store.region))


def _utc_now() -> datetime:
    return datetime.now(UTC)


def build_handler(
    store: StoreFactory = default_store,
    *,
    settings: Callable[[], RefreshSettings] = RefreshSettings.from_env,
    reader: ReaderFactory = default_reader,
    clock: Clock = _utc_now,
) -> ScheduleHandler:
    """A Lambda handler that refreshes the pricing snapshot from ``settings()``'s sources into ``store``."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        config = settings()
        outcome = refresh(config, store(config), reader(config), clock())
        if outcome["status"] == "rejected":
            log.warning(
                "pricing refresh rejected %s (%d issue(s)): %s; still current: %s",
                outcome["source"],
                outcome["issueCount"],
                "; ".join(outcome["issues"][:5]),
                outcome["current"],
            )
        else:
            log.info(
                "pricing refresh %s: version %s (%d price(s), %d contract(s)); current %s, previous %s",
                outcome["status"],
                outcome["version"],
                outcome["prices"],
                outcome["contracts"],
                outcome["current"],
                outcome["previous"],
            )
        return outcome

    return handler


handler = build_handler()
"""The pricing-refresh function, fired by its EventBridge schedule."""
