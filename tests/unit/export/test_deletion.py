"""Deleting captured content: the object goes, the audit record gets the evidence, and an export
afterwards counts the request as deleted."""

from __future__ import annotations

import pytest

from tests.unit.export.corpus import BASE_MS, capture
from tollway.audit.store import MemoryAuditStore
from tollway.content import ContentRef, MemoryContentStore
from tollway.export import MemoryExportAudit
from tollway.export.deletion import delete_content, records_before


@pytest.fixture
async def stores() -> tuple[MemoryAuditStore, MemoryContentStore]:
    audit, content = MemoryAuditStore(), MemoryContentStore(bucket="content-bucket")
    for i, offset in enumerate((100, 200, 300)):
        found, _ = await capture(content, f"r{i}", BASE_MS + offset)
        audit.apply(found)
    found, _ = await capture(content, "plain", BASE_MS + 400, mode="metadata-only")
    audit.apply(found)
    return audit, content


async def test_deletion_removes_the_object_and_records_who_why_and_whether_it_existed(
    stores: tuple[MemoryAuditStore, MemoryContentStore],
) -> None:
    audit, content = stores
    sent = MemoryExportAudit()
    records = list(records_before(audit, BASE_MS + 250))
    assert [r.request_id for r in records] == ["r0", "r1"]
    refs = [ContentRef.from_body(r.content or {}) for r in records]
    report = await delete_content(records, content, sent, deleted_by="dana", reason="retention review")
    assert (report.deleted, report.missing, report.skipped) == (2, 0, 0)
    assert [await content.get(ref) for ref in refs] == [None, None]
    assert content.objects == 1  # r2 is after the cut
    assert [(e.kind, e.request_id, e.body) for e in sent.events] == [
        ("content_deleted", rid, {"deletedBy": "dana", "reason": "retention review", "existed": True})
        for rid in ("r0", "r1")
    ]
    audit.apply(sent.events)
    view = audit.get_request("r0")
    assert view is not None and view.request.content_deleted == {
        "deletedBy": "dana",
        "reason": "retention review",
        "existed": True,
    }
    assert view.request.content_deleted_at_ms is not None
    # Deleted once: a second pass finds nothing left to delete before the cut.
    assert list(records_before(audit, BASE_MS + 250)) == []


async def test_an_object_already_gone_is_recorded_as_such_and_metadata_only_is_skipped(
    stores: tuple[MemoryAuditStore, MemoryContentStore],
) -> None:
    audit, content = stores
    view = audit.get_request("r2")
    assert view is not None and view.request.content is not None
    await content.delete(ContentRef.from_body(view.request.content))  # gone by lifecycle, say
    plain = audit.get_request("plain")
    assert plain is not None
    sent = MemoryExportAudit()
    report = await delete_content([view.request, plain.request], content, sent, deleted_by="ops", reason="dsr")
    assert (report.deleted, report.missing, report.skipped) == (0, 1, 1)
    assert [e.body["existed"] for e in sent.events] == [False]
    # The event id is a function of the request and the object, so a retried deletion records once.
    again = MemoryExportAudit()
    await delete_content([view.request], content, again, deleted_by="ops", reason="dsr")
    assert again.events[0].event_id == sent.events[0].event_id
