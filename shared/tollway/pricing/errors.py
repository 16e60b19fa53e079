"""The pricing package's errors, under :class:`tollway.exceptions.TollwayError`::

    TollwayError
    └── PricingError
        ├── PricingSourceError       a source is unreadable or invalid (carries every issue with its path)
        ├── SnapshotCorrupt          a published pointer or snapshot does not decode or fails its digest
        └── SnapshotStoreError       the snapshot store could not be read or written (an outage)

An unknown price is not an error: :func:`tollway.pricing.price` returns
:class:`tollway.pricing.UnknownPrice` for it, so no caller can mistake it for zero.

Messages name sources, paths, keys and error codes, never a credential.
"""

from __future__ import annotations

from collections.abc import Sequence

from tollway.exceptions import ConfigIssue, TollwayError

__all__ = ["PricingError", "PricingSourceError", "SnapshotCorrupt", "SnapshotStoreError"]


class PricingError(TollwayError):
    """Root of the pricing errors."""


class PricingSourceError(PricingError):
    """A pricing source that cannot become part of a snapshot; ``issues`` locate each problem."""

    def __init__(self, source: str, issues: Sequence[ConfigIssue]) -> None:
        self.source = source
        self.issues = tuple(issues)
        shown = "; ".join(str(i) for i in self.issues[:5])
        more = f" (and {len(self.issues) - 5} more)" if len(self.issues) > 5 else ""
        super().__init__(f"pricing source {source}: {shown or 'invalid'}{more}")


class SnapshotCorrupt(PricingError):
    """A published object that is not a valid pointer or snapshot, or whose digest does not match."""


class SnapshotStoreError(PricingError):
    """The store failed (not a missing key: that reads as ``None``)."""
