"""The export job on the memory backends: what it includes, what it counts, and how it repeats and resumes."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from tests.unit.export.corpus import BASE_MS, DIGEST, capture
from tollway.audit.events import AuditEvent, content_stored
from tollway.audit.store import MemoryAuditStore
from tollway.content import MemoryContentStore
from tollway.export import (
    ExportConflict,
    ExportProgress,
    ExportRequest,
    ExportUnavailable,
    MemoryExportAudit,
    MemoryExportSink,
    manifest_key,
    run_export,
    verify_manifest,
)

DAY_MS = 86_400_000
NOW_MS = BASE_MS + 2 * DAY_MS
EVERYONE = ("audit", "evaluation", "training")


@dataclasses.dataclass
class Source:
    audit: MemoryAuditStore
    content: MemoryContentStore

    async def add(self, request_id: str, offset_ms: int, **kw: Any) -> None:
        found, _ = await capture(self.content, request_id, BASE_MS + offset_ms, **kw)
        self.audit.apply(found)

    def apply(self, *events: AuditEvent) -> None:
        self.audit.apply(list(events))


@pytest.fixture
async def source() -> Source:
    s = Source(MemoryAuditStore(), MemoryContentStore(bucket="content-bucket"))
    await s.add("r01", 100, purposes=EVERYONE)
    await s.add("r02", 200, purposes=("audit",))
    await s.add("r03", 300, mode="encrypted-raw", purposes=EVERYONE)
    await s.add("r04", 400, mode="metadata-only")
    await s.add("r05", 500, dropped=True)
    await s.add("r06", 600, deleted=True, purposes=EVERYONE)
    await s.add("r07", 700, retention_class="short", purposes=EVERYONE)
    await s.add("r08", 800, store_content=False, purposes=EVERYONE)  # the object vanished, no evidence
    await s.add("r09", 900, purposes=("audit", "evaluation"))
    await s.add("r10", 1000, purposes=EVERYONE, tenant="globex")
    await s.add("r11", 1100, purposes=EVERYONE, outcome="error")
    await s.add("r00", 100, purposes=EVERYONE)  # same ms as r01: ordered by request id
    await s.add("late", DAY_MS, purposes=EVERYONE)  # outside the range
    return s


def request(purpose: str = "evaluation", **extra: Any) -> ExportRequest:
    doc = {
        "purpose": purpose,
        "sinceMs": BASE_MS,
        "untilMs": BASE_MS + DAY_MS,
        "requestedBy": "alice",
        "approvedBy": "dpo",
        "filters": {"tenants": ["acme"], "outcomes": ["ok"]},
    }
    return ExportRequest.parse(doc | extra)


async def export(source: Source, req: ExportRequest, sink: MemoryExportSink, **kw: Any) -> Any:
    return await run_export(
        req, source.audit, source.content, sink, now_ms=lambda: NOW_MS, retention_days={"short": 1}, **kw
    )


def rows(sink: MemoryExportSink, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for s in manifest["shards"] for line in sink.objects[s["key"]].splitlines()]


async def test_evaluation_includes_only_consented_tokenized_content_and_counts_every_exclusion(source: Source) -> None:
    sink = MemoryExportSink()
    result = await export(source, request(), sink)
    manifest = result.manifest
    assert [r["requestId"] for r in rows(sink, manifest)] == ["r00", "r01", "r09"]
    assert manifest["records"] == 3
    assert manifest["exclusions"] == {
        "deleted": 1,  # r06
        "expired": 1,  # r07: its retention class keeps content one day
        "dropped": 1,  # r05
        "no_content": 1,  # r04
        "integrity_failed": 0,
        "purpose_not_allowed": 2,  # r02 (no consent), r03 (encrypted-raw)
        "missing_object": 1,  # r08
    }
    assert manifest["source"] | {"contentDigest": None} == {
        "sinceMs": BASE_MS,
        "untilMs": BASE_MS + DAY_MS,
        "scanned": 12,
        "matched": 10,  # r10 (another tenant) and r11 (an error) are filtered out, not excluded
        "first": {"atMs": BASE_MS + 100, "requestId": "r00"},
        "last": {"atMs": BASE_MS + 900, "requestId": "r09"},
        "contentDigest": None,
    }
    assert manifest["retention"]["classes"] == ["standard"]
    assert sink.objects[manifest_key(result.export_id)] == orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS)


async def test_audit_includes_both_capturing_modes_without_consent(source: Source) -> None:
    sink = MemoryExportSink()
    manifest = (await export(source, request("audit"), sink)).manifest
    assert [r["requestId"] for r in rows(sink, manifest)] == ["r00", "r01", "r02", "r03", "r09"]
    assert [r["mode"] for r in rows(sink, manifest)].count("encrypted-raw") == 1
    assert manifest["exclusions"]["purpose_not_allowed"] == 0


async def test_training_needs_training_consent(source: Source) -> None:
    sink = MemoryExportSink()
    manifest = (await export(source, request("training"), sink)).manifest
    assert [r["requestId"] for r in rows(sink, manifest)] == ["r00", "r01"]
    assert manifest["exclusions"]["purpose_not_allowed"] == 3  # r02, r03, r09


async def test_content_that_fails_its_digest_is_excluded_as_integrity_failed(source: Source) -> None:
    found, ref = await capture(source.content, "r12", BASE_MS + 1200, purposes=EVERYONE)
    assert ref is not None
    source.apply(*found[:2])
    forged = dataclasses.replace(ref, digest="0" * 64).to_body()
    source.apply(content_stored(request_id="r12", root_digest=DIGEST, ref=forged))
    manifest = (await export(source, request(), MemoryExportSink())).manifest
    assert manifest["exclusions"]["integrity_failed"] == 1
    assert manifest["records"] == 3


async def test_an_audit_record_past_its_expiry_is_never_exported(source: Source) -> None:
    sink = MemoryExportSink()
    result = await run_export(
        request("audit"), source.audit, source.content, sink, now_ms=lambda: BASE_MS + 91 * DAY_MS
    )
    assert result.manifest["records"] == 0
    # Everything the filters select but r06, whose deletion is reported first (r04, metadata-only, included).
    assert result.manifest["exclusions"]["expired"] == 9


async def test_redaction_and_dropped_tool_calls_reach_the_shards(source: Source) -> None:
    sink = MemoryExportSink()
    req = request(transformations={"toolCalls": "drop", "pii": "redact"})
    manifest = (await export(source, req, sink)).manifest
    shards = b"".join(sink.objects[s["key"]] for s in manifest["shards"])
    assert b"TWPII1" not in shards and b"[REDACTED_EMAIL]" in shards
    assert b'"role":"tool"' not in shards and b"tool_calls" not in shards
    assert manifest["transformations"] == {"toolCalls": "drop", "pii": "redact"}


async def test_a_rerun_makes_the_same_manifest_digest_and_writes_nothing_again(source: Source) -> None:
    req = request(shardRecords=2)
    first, second = MemoryExportSink(), MemoryExportSink()
    a = await export(source, req, first)
    b = await export(source, req, second)
    assert a.digest == b.digest and first.objects == second.objects
    assert [s["records"] for s in a.manifest["shards"]] == [2, 1]

    again = await export(source, req, first)
    assert again.digest == a.digest
    assert (again.shards_written, again.shards_reused, again.manifest_written) == (0, 2, False)
    assert len(first.puts) == len(set(first.puts)) == 3


async def test_a_run_that_failed_on_a_shard_resumes_without_duplicating_shards(source: Source) -> None:
    req = request("audit", shardRecords=2)
    reference = await export(source, req, MemoryExportSink())
    keys = [s["key"] for s in reference.manifest["shards"]]
    assert len(keys) == 3

    sink = MemoryExportSink()
    sink.fail_puts = {keys[1]}
    with pytest.raises(ExportUnavailable):
        await export(source, req, sink)
    assert list(sink.objects) == [keys[0]]  # no manifest: the export is not finished

    seen: list[ExportProgress] = []
    resumed = await export(source, req, sink, progress=seen.append)
    assert resumed.digest == reference.digest
    assert (resumed.shards_written, resumed.shards_reused) == (2, 1)
    assert sink.puts == [keys[0], keys[1], keys[2], manifest_key(req.export_id)]
    assert [p.phase for p in seen] == ["scanned", "shard", "shard", "shard", "manifest"]


async def test_a_shard_with_other_content_under_its_key_is_a_conflict(source: Source) -> None:
    req = request(shardRecords=2)
    sink = MemoryExportSink()
    key = (await export(source, req, MemoryExportSink())).manifest["shards"][0]["key"]
    sink.objects[key] = b"{}\n"
    with pytest.raises(ExportConflict, match="shard"):
        await export(source, req, sink)


async def test_the_manifest_is_immutable(source: Source) -> None:
    sink = MemoryExportSink()
    original = await export(source, request(exportId="q1-eval"), sink)
    stored = sink.objects[manifest_key("q1-eval")]

    with pytest.raises(ExportConflict, match="immutable"):
        await export(source, request(exportId="q1-eval", transformations={"pii": "redact"}), sink)
    assert sink.objects[manifest_key("q1-eval")] == stored
    assert verify_manifest(stored)["digest"] == original.digest


async def test_a_source_that_changed_after_the_export_conflicts_with_its_manifest(source: Source) -> None:
    sink = MemoryExportSink()
    await export(source, request(), sink)
    await source.add("r13", 1300, purposes=EVERYONE)
    with pytest.raises(ExportConflict):
        await export(source, request(), sink)


async def test_the_job_is_audited_once_per_manifest_and_its_record_is_not_a_source(source: Source) -> None:
    sink, audit = MemoryExportSink(), MemoryExportAudit()
    result = await export(source, request(), sink, audit=audit)
    await export(source, request(), sink, audit=audit)
    first, second = audit.events
    assert first.event_id == second.event_id and first.kind == "export_finished"
    assert first.request_id == result.export_id
    assert first.body["manifest"]["digest"] == result.digest
    assert first.body["manifest"]["key"] == manifest_key(result.export_id)
    assert (first.body["requestedBy"], first.body["approvedBy"], first.body["purpose"]) == (
        "alice",
        "dpo",
        "evaluation",
    )

    first = dataclasses.replace(first, ts_ms=BASE_MS + 5000)  # its audit record falls in the source range
    source.audit.apply([first])
    source.audit.apply([second])  # a redelivery changes nothing
    view = source.audit.get_request(result.export_id)
    assert view is not None and view.request.operation == "dataset.export"
    assert view.request.export_manifest is not None and view.request.export_manifest["records"] == 3
    assert (await export(source, request(), sink)).digest == result.digest


async def test_an_empty_range_still_makes_a_manifest() -> None:
    sink = MemoryExportSink()
    result = await run_export(request(), MemoryAuditStore(), MemoryContentStore(), sink, now_ms=lambda: NOW_MS)
    assert result.manifest["records"] == 0 and result.manifest["shards"] == []
    assert result.manifest["source"]["first"] is None
    assert list(sink.objects) == [manifest_key(result.export_id)]


async def test_the_status_object_follows_the_run_with_scanned_included_and_excluded_counts(source: Source) -> None:
    from tollway.export import status_key, status_publisher

    sink = MemoryExportSink()
    seen: list[dict[str, Any]] = []
    publish = status_publisher(sink)

    def watch(event: Any) -> None:
        publish(event)
        seen.append(orjson.loads(sink.objects[status_key(event.export_id)]))

    result = await export(source, request(shardRecords=2), sink, progress=watch)
    assert [s["phase"] for s in seen] == ["scanned", "shard", "shard", "manifest"]
    assert seen[0] | {"exportId": ""} == {
        "exportId": "",
        "phase": "scanned",
        "scanned": 12,
        "matched": 10,
        "records": 0,
        "excluded": 0,
        "shards": 0,
    }
    assert [s["records"] for s in seen[1:]] == [2, 3, 3]
    assert seen[-1]["excluded"] == 7 and seen[-1]["shards"] == 2
    assert seen[-1]["exportId"] == result.export_id
    # The status is the one object an export may overwrite; the manifest is still written once.
    assert sink.puts.count(status_key(result.export_id)) == 0
