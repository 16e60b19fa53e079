"""Deleting captured content, with evidence in the audit trail.

``tollway content delete --request ID`` or ``--before DATE`` finds each request's content reference
in the audit store, deletes the object from the content store, and sends a ``content_deleted``
event (who, why, whether the object still existed) through the audit queue, so the request's audit
record says when and by whom its content went. The metadata stays: deletion removes content, not
the record that it existed. A request already marked deleted is skipped; deleting is idempotent
(an object already gone is recorded with ``existed: false``).

The event id is derived from the request id and the object key, so a retried deletion records once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tollway.audit.events import content_deleted
from tollway.audit.store import AuditStore, RequestRecord
from tollway.content.base import ContentError, ContentRef, ContentStore
from tollway.export.audit import ExportAudit, name_based_event_id

__all__ = ["DeletionReport", "delete_content", "records_before"]


@dataclass(slots=True)
class DeletionReport:
    deleted: int = 0
    """Objects deleted (they existed)."""
    missing: int = 0
    """References whose object was already gone (expired by lifecycle, or deleted before)."""
    skipped: int = 0
    """Requests with no content, or already recorded as deleted."""
    not_found: list[str] = field(default_factory=list)
    """Request ids the audit store does not hold."""


def records_before(store: AuditStore, before_ms: int, since_ms: int = 0) -> Iterator[RequestRecord]:
    """Requests admitted before ``before_ms`` that hold a content reference not yet deleted."""
    for record in store.scan_requests(since_ms, before_ms):
        if record.content is not None and record.content_deleted is None:
            yield record


async def delete_content(
    records: Iterable[RequestRecord],
    content: ContentStore,
    audit: ExportAudit,
    *,
    deleted_by: str,
    reason: str,
) -> DeletionReport:
    """Delete each record's content object and record the evidence; raises the store's or the
    queue's unavailability (what was done before it stays done, and a rerun skips nothing twice)."""
    report = DeletionReport()
    for record in records:
        if record.content is None or record.content_deleted is not None:
            report.skipped += 1
            continue
        try:
            ref = ContentRef.from_body(record.content)
        except ContentError:
            report.skipped += 1
            continue
        existed = await content.delete(ref)
        event = content_deleted(
            request_id=record.request_id,
            root_digest=record.root_digest or ref.digest,
            deleted_by=deleted_by,
            reason=reason,
            existed=existed,
        )
        audit.send(
            dataclasses.replace(event, event_id=name_based_event_id("content_deleted", record.request_id, ref.key))
        )
        if existed:
            report.deleted += 1
        else:
            report.missing += 1
    return report
