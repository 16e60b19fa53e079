"""What every audit store offers: apply queue batches idempotently, read a request, list and scan requests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from tollway.audit.events import AuditEvent
    from tollway.audit.store.views import RequestRecord, RequestView

__all__ = ["MAX_LIST_LIMIT", "ApplyResult", "AuditStore", "check_limit"]

MAX_LIST_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: int = 0
    """Events that changed the store."""
    duplicates: int = 0
    """Events already applied (a redelivery, or a repeat within the batch): nothing changed."""
    unknown: int = 0
    """Events of a kind this store does not know: skipped."""


class AuditStore(Protocol):
    def apply_batch(self, messages: Sequence[Sequence[AuditEvent]]) -> list[ApplyResult | Exception]:
        """Write every message's events idempotently, merged per item; per message, its result or its error.

        A message with an event that cannot be placed gets :class:`~tollway.audit.store.MalformedEvent`
        and nothing of it is written; a message whose events share an item write that failed gets that
        write's error (:class:`~tollway.audit.store.AuditStoreError`). The others are unaffected.
        """
        ...

    def apply(self, events: Sequence[AuditEvent]) -> ApplyResult:
        """One message's events: :meth:`apply_batch` of one, raising its error."""
        ...

    def get_request(self, request_id: str) -> RequestView | None:
        """The request with its ordered attempts, or ``None`` when no event of it is stored."""
        ...

    def list_requests(self, since_ms: int, principal_id: str | None = None, limit: int = 50) -> list[RequestRecord]:
        """Admitted or rejected requests with ``ts >= since_ms``, newest first, at most ``limit``."""
        ...

    def scan_requests(self, since_ms: int, until_ms: int) -> Iterator[RequestRecord]:
        """Every admitted or rejected request with ``since_ms <= ts < until_ms``, in no promised order.

        The dataset export's reader (``tollway.export``): it walks a whole time range, so it is lazy
        and unbounded in count (bounded in pages by the backend), and the caller sorts what it keeps.
        A request whose opening event is not stored yet has no ``ts`` and is not found.
        """
        ...


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be 1-{MAX_LIST_LIMIT}")
