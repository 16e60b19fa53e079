"""Publishing snapshots and loading the current one: an immutable object, then a pointer to it.

Layout, under a prefix (default ``pricing``) of the pricing bucket::

    pricing/snapshots/<version>.json    the snapshot document; written once, never rewritten
    pricing/current.json                the pointer: {"schema": 1, "version", "digest", "key",
                                        "effectiveFrom", "updatedAt"}

:func:`publish` writes the snapshot object first and the pointer only after it, so a reader
that finds a pointer always finds its snapshot. The version is content-addressed, so republishing
the same prices writes nothing (``unchanged``). A snapshot whose ``effectiveFrom`` is still ahead
is stored but not pointed at (``pending``); a later publication after that instant moves the
pointer. On a versioned bucket every pointer write is kept, which is the history of activations.

Two concurrent publications of the same content write identical objects; of different content,
the last pointer write wins, as it would one run later.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway.pricing.errors import SnapshotCorrupt
from tollway.pricing.snapshot import SCHEMA, PricingSnapshot, decode_snapshot, encode_snapshot, iso_utc

if TYPE_CHECKING:
    # Types only: the store package imports its S3 backend, which imports this module for its default
    # prefix, so importing the package here at run time would be a cycle.
    from tollway.pricing.store import SnapshotStore

__all__ = [
    "DEFAULT_PREFIX",
    "Pointer",
    "PublishResult",
    "SnapshotLoader",
    "load_current",
    "pointer_key",
    "publish",
    "read_pointer",
    "snapshot_key",
]

DEFAULT_PREFIX: Final = "pricing"

PublishStatus = Literal["published", "unchanged", "pending"]


def _clean(prefix: str) -> str:
    clean = prefix.strip("/")
    if not clean:
        raise ValueError("the pricing prefix must not be empty")
    return clean


def pointer_key(prefix: str = DEFAULT_PREFIX) -> str:
    return f"{_clean(prefix)}/current.json"


def snapshot_key(version: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{_clean(prefix)}/snapshots/{version}.json"


class Pointer(BaseModel):
    """The pointer object: which snapshot is current, and since when."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(default=SCHEMA, alias="schema")
    version: str = Field(min_length=1, max_length=64)
    digest: str
    key: str
    effectiveFrom: datetime
    updatedAt: datetime

    def encode(self) -> bytes:
        doc = {
            "schema": self.schema_,
            "version": self.version,
            "digest": self.digest,
            "key": self.key,
            "effectiveFrom": iso_utc(self.effectiveFrom),
            "updatedAt": iso_utc(self.updatedAt),
        }
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class PublishResult:
    status: PublishStatus
    version: str
    """The candidate's version."""
    current: str | None
    """The version the pointer names after this publication."""
    previous: str | None
    """The version the pointer named before it (``None``: no pointer, or an unreadable one)."""
    snapshot_written: bool
    """Whether this call wrote the snapshot object (``False`` when it already existed)."""


def read_pointer(store: SnapshotStore, prefix: str = DEFAULT_PREFIX) -> Pointer | None:
    """The pointer, or ``None`` before the first publication; :class:`SnapshotCorrupt` if it does not decode."""
    body = store.get(pointer_key(prefix))
    if body is None:
        return None
    try:
        return Pointer.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        raise SnapshotCorrupt(f"{pointer_key(prefix)} is not a schema-{SCHEMA} pricing pointer") from None


def publish(
    store: SnapshotStore, snapshot: PricingSnapshot, *, now: datetime, prefix: str = DEFAULT_PREFIX
) -> PublishResult:
    """Store ``snapshot`` and, once it is effective, point at it. Store failures propagate.

    An unreadable pointer is replaced: it names nothing a reader could use.
    """
    try:
        pointer = read_pointer(store, prefix)
    except SnapshotCorrupt:
        pointer = None
    previous = pointer.version if pointer is not None else None
    if previous == snapshot.version:
        return PublishResult("unchanged", snapshot.version, previous, previous, False)
    key = snapshot_key(snapshot.version, prefix)
    written = not store.exists(key)
    if written:
        store.put(key, encode_snapshot(snapshot))
    if snapshot.effective_from > now:
        return PublishResult("pending", snapshot.version, previous, previous, written)
    new = Pointer(
        version=snapshot.version,
        digest=snapshot.digest,
        key=key,
        effectiveFrom=snapshot.effective_from,
        updatedAt=now,
    )
    store.put(pointer_key(prefix), new.encode())
    return PublishResult("published", snapshot.version, snapshot.version, previous, written)


def load_current(store: SnapshotStore, prefix: str = DEFAULT_PREFIX) -> PricingSnapshot | None:
    """The snapshot the pointer names, verified; ``None`` before the first publication."""
    pointer = read_pointer(store, prefix)
    return None if pointer is None else _load(store, pointer)


def _load(store: SnapshotStore, pointer: Pointer) -> PricingSnapshot:
    body = store.get(pointer.key)
    if body is None:
        raise SnapshotCorrupt(f"the pointer names {pointer.key}, which does not exist")
    snapshot = decode_snapshot(body)
    if snapshot.version != pointer.version or snapshot.digest != pointer.digest:
        raise SnapshotCorrupt(f"{pointer.key} is not the snapshot the pointer names ({pointer.version})")
    return snapshot


class SnapshotLoader:
    """The gateway's view of the current snapshot, refreshed off the request path with last-valid retention.

    :meth:`reload` reads the small pointer and fetches a snapshot only when the pointer names
    another version. On any failure it raises and :attr:`current` stays what it was.
    """

    def __init__(self, store: SnapshotStore, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._store = store
        self._prefix = prefix
        self.current: PricingSnapshot | None = None

    def reload(self) -> bool:
        """Whether :attr:`current` changed; :class:`PricingError` (and ``current`` unchanged) on failure."""
        pointer = read_pointer(self._store, self._prefix)
        if pointer is None or (self.current is not None and self.current.version == pointer.version):
            return False
        self.current = _load(self._store, pointer)
        return True
