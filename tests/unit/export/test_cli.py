"""The ``tollway export`` verbs on the memory sink and queue."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from tests.unit.export.corpus import BASE_MS, capture
from tollway.audit.store import MemoryAuditStore
from tollway.content import MemoryContentStore
from tollway.export import (
    ExportError,
    ExportIntegrityError,
    ExportRequest,
    MemoryExportQueue,
    MemoryExportSink,
    decode_message,
    manifest_key,
    run_export,
)
from tollway.export.cli import create, download, list_exports, show

DAY_MS = 86_400_000
REQUEST = ExportRequest.parse(
    {
        "purpose": "audit",
        "sinceMs": BASE_MS,
        "untilMs": BASE_MS + DAY_MS,
        "requestedBy": "alice",
        "approvedBy": "dpo",
        "shardRecords": 1,
    }
)


async def _exported(sink: MemoryExportSink, request: ExportRequest = REQUEST) -> dict[str, object]:
    audit, content = MemoryAuditStore(), MemoryContentStore()
    for n in range(2):
        found, _ = await capture(content, f"r{n}", BASE_MS + n)
        audit.apply(found)
    return (await run_export(request, audit, content, sink, now_ms=lambda: BASE_MS + DAY_MS)).manifest


def test_create_enqueues_the_request_and_follows_it_to_its_verified_manifest() -> None:
    queue, sink = MemoryExportQueue(), MemoryExportSink()
    naps: list[float] = []

    def worker(seconds: float) -> None:  # the function runs while the CLI sleeps
        naps.append(seconds)
        asyncio.run(_exported(sink, decode_message(queue.bodies[0])))

    statuses = list(create(REQUEST, queue, sink, poll_interval_s=0.5, sleep=worker))
    assert [s.state for s in statuses] == ["queued", "progress", "done"]
    assert decode_message(queue.bodies[0]) == REQUEST
    done = statuses[-1]
    assert done.manifest is not None and done.manifest["records"] == 2 and done.shards == 2
    assert naps == [0.5] and done.message_id == "m1"


def test_create_stops_waiting_at_its_timeout() -> None:
    ticks = iter(range(100))
    statuses = list(
        create(
            REQUEST,
            MemoryExportQueue(),
            MemoryExportSink(),
            timeout_s=3,
            sleep=lambda _: None,
            clock=lambda: next(ticks),
        )
    )
    assert [s.state for s in statuses] == ["queued", "progress", "timeout"]


async def test_list_and_show_read_verified_manifests() -> None:
    sink = MemoryExportSink()
    manifest = await _exported(sink)
    sink.objects["exports/exp-partial/shards/00000-1-1-abc.jsonl"] = b"{}\n"
    listed = list_exports(sink)
    assert [e["exportId"] for e in listed] == sorted([REQUEST.export_id, "exp-partial"])
    done = next(e for e in listed if e["exportId"] == REQUEST.export_id)
    assert done | {"digest": None} == {
        "exportId": REQUEST.export_id,
        "complete": True,
        "valid": True,
        "shards": 2,
        "purpose": "audit",
        "records": 2,
        "requestedBy": "alice",
        "digest": None,
    }
    assert show(sink, REQUEST.export_id) == manifest
    with pytest.raises(ExportError, match="no manifest"):
        show(sink, "exp-partial")


async def test_show_refuses_a_manifest_that_does_not_match_its_digest() -> None:
    sink = MemoryExportSink()
    await _exported(sink)
    key = manifest_key(REQUEST.export_id)
    sink.objects[key] = sink.objects[key].replace(b'"records":2', b'"records":1')
    with pytest.raises(ExportIntegrityError):
        show(sink, REQUEST.export_id)
    assert list_exports(sink)[0]["valid"] is False


async def test_download_writes_only_verified_shards(tmp_path: Path) -> None:
    sink = MemoryExportSink()
    manifest = await _exported(sink)
    paths = download(sink, REQUEST.export_id, tmp_path / "out")
    assert [p.name for p in paths][-1] == "manifest.json"
    for shard, path in zip(manifest["shards"], paths, strict=False):  # type: ignore[call-overload]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"]

    second = manifest["shards"][1]["key"]  # type: ignore[index]
    sink.objects[second] = sink.objects[second].replace(b"r1", b"r9")
    with pytest.raises(ExportIntegrityError, match="digest"):
        download(sink, REQUEST.export_id, tmp_path / "again")
    assert [p.name for p in (tmp_path / "again").iterdir()] == [paths[0].name]
