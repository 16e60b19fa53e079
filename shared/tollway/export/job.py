"""One export run: source records → rules → content → rows → shards → manifest → audit event.

:func:`run_export` reads the request's source range from the audit store, keeps what its filters
select in source order (admission time, then request id: the order every run sees), screens each
record (:mod:`tollway.export.rules`), fetches the content of those that pass (a few at a time, in
order), transforms it into a row (:mod:`tollway.export.transform`) and cuts the rows into shards
of ``shardRecords``. Only one shard's rows are held at once.

Each shard is written once (:meth:`ExportSink.put_if_absent`) under a key named after its source
range (:func:`tollway.export.manifest.shard_key`). A run that failed part way (the content store
throttled, the function timed out) is resumed by running the same request again: it recomputes
the same shards, finds the ones already stored with the same digest and skips them, and writes
the rest. A stored shard whose digest differs under the same key is an :class:`ExportConflict`
(never overwritten). The manifest is written last, only if absent; an identical one already there
is success (a repeated run), a different one an :class:`ExportConflict`: an export is immutable.
Then the ``export_finished`` audit event goes to the audit queue (:mod:`tollway.export.audit`).

``ContentUnavailable`` and ``AuditStoreError`` propagate: the queue message is retried and the
retry resumes. The clock (``now_ms``) decides only expiry; nothing written depends on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from tollway.audit.store.views import RequestRecord
from tollway.content.base import ContentError, ContentRecord, ContentRef, ContentStore, ContentUnavailable
from tollway.export.audit import ExportAudit, finished_event
from tollway.export.errors import ExportConflict, ExportError
from tollway.export.manifest import (
    MANIFEST_MEDIA_TYPE,
    SHARD_MEDIA_TYPE,
    ShardEntry,
    SourcePosition,
    build_manifest,
    encode_manifest,
    manifest_key,
    shard_key,
    source_line,
    status_key,
    verify_manifest,
)
from tollway.export.request import ExportRequest
from tollway.export.rules import EXCLUSION_REASONS, EXPORT_OPERATION, ExclusionReason, check_fetched, matches, screen
from tollway.export.sink import ExportSink
from tollway.export.transform import dumps, row

__all__ = ["AuditReader", "ExportProgress", "ExportResult", "Progress", "run_export", "status_publisher"]

DEFAULT_FETCH_CONCURRENCY: Final = 8


class AuditReader(Protocol):
    """What the job needs of the audit store (:class:`tollway.audit.store.AuditStore` has it)."""

    def scan_requests(self, since_ms: int, until_ms: int) -> Iterator[RequestRecord]: ...


@dataclass(frozen=True, slots=True)
class ExportProgress:
    """One step of a run: ``scanned`` (the source is read), ``shard`` (one shard written or found),
    ``manifest`` (stored or found identical) and ``audited`` (the audit event sent)."""

    export_id: str
    phase: str
    records: int = 0
    """Rows in the shards so far."""
    shards: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)


Progress = Callable[[ExportProgress], None]


@dataclass(frozen=True, slots=True)
class ExportResult:
    export_id: str
    manifest_key: str
    manifest: dict[str, Any]
    shards_written: int
    shards_reused: int
    manifest_written: bool
    """``False`` when an identical manifest was already stored (a repeated run)."""

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])


@dataclass(slots=True)
class _Shard:
    rows: list[bytes] = field(default_factory=list)
    source: list[bytes] = field(default_factory=list)
    first: SourcePosition | None = None
    last: SourcePosition | None = None


@dataclass(slots=True)
class _Run:
    request: ExportRequest
    sink: ExportSink
    progress: Progress
    shard: _Shard = field(default_factory=_Shard)
    shards: list[ShardEntry] = field(default_factory=list)
    exclusions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EXCLUSION_REASONS, 0))
    content_digest: Any = field(default_factory=hashlib.sha256)
    classes: set[str] = field(default_factory=set)
    earliest_expiry: int | None = None
    written: int = 0
    reused: int = 0

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    def exclude(self, reason: ExclusionReason) -> None:
        self.exclusions[reason] += 1

    def add(self, record: RequestRecord, ref: ContentRef, content: ContentRecord) -> None:
        position = SourcePosition(record.at_ms or 0, record.request_id)
        line = source_line(record.request_id, ref.digest)
        shard = self.shard
        shard.rows.append(dumps(row(content, ref.digest, self.request.transformations)) + b"\n")
        shard.source.append(line)
        shard.first = shard.first or position
        shard.last = position
        self.content_digest.update(line)
        self.classes.add(ref.retention_class)
        if record.expires_at is not None:
            self.earliest_expiry = min(record.expires_at, self.earliest_expiry or record.expires_at)
        if len(shard.rows) >= self.request.shard_records:
            self.flush()

    def flush(self) -> None:
        shard, self.shard = self.shard, _Shard()
        if not shard.rows or shard.first is None or shard.last is None:
            return
        body = b"".join(shard.rows)
        digest = hashlib.sha256(body).hexdigest()
        index = len(self.shards)
        key = shard_key(self.request.export_id, index, shard.first, shard.last, b"".join(shard.source))
        found = self.sink.head(key)
        if found is None and self.sink.put_if_absent(key, body, content_type=SHARD_MEDIA_TYPE):
            self.written += 1
        else:
            found = found or self.sink.head(key)
            if found is None or found.sha256 != digest:
                raise ExportConflict(f"export {self.request.export_id}: shard {key} exists with other content")
            self.reused += 1
        self.shards.append(ShardEntry(index, key, len(shard.rows), len(body), digest, shard.first, shard.last))
        detail = {"key": key, "excluded": sum(self.exclusions.values())}
        self.progress(ExportProgress(self.request.export_id, "shard", self.records, len(self.shards), detail))


def _source(reader: AuditReader, request: ExportRequest) -> list[RequestRecord]:
    found = [
        r
        for r in reader.scan_requests(request.since_ms, request.until_ms)
        if r.operation != EXPORT_OPERATION and r.at_ms is not None and request.since_ms <= r.at_ms < request.until_ms
    ]
    found.sort(key=lambda r: (r.at_ms or 0, r.request_id))
    return found


async def _fetch(store: ContentStore, ref: ContentRef) -> ContentRecord | ContentError | None:
    try:
        return await store.get(ref)
    except ContentUnavailable:
        raise
    except ContentError as exc:  # it failed its integrity check: excluded, never exported
        return exc


async def _include(
    run: _Run,
    store: ContentStore,
    candidates: Sequence[tuple[RequestRecord, ContentRef]],
) -> None:
    """Fetch ``candidates`` (one window, at once) and add them in order, or count why not."""
    fetched = await asyncio.gather(*(_fetch(store, ref) for _, ref in candidates))
    for (record, ref), content in zip(candidates, fetched, strict=True):
        if isinstance(content, ContentError):
            run.exclude("integrity_failed")
            continue
        reason = check_fetched(record, ref, content)
        if reason is not None or content is None:
            run.exclude(reason or "missing_object")
            continue
        run.add(record, ref, content)


def status_publisher(sink: ExportSink) -> Progress:
    """A :data:`Progress` that keeps ``exports/<id>/status.json`` current: the phase, the records
    scanned and matched, included so far, excluded so far and the shards written. It never fails
    the run: a status that cannot be written is skipped (the manifest is what counts)."""
    seen: dict[str, Any] = {"scanned": 0, "matched": 0}

    def publish(event: ExportProgress) -> None:
        if event.phase == "scanned":
            seen.update(scanned=event.detail.get("scanned", 0), matched=event.detail.get("matched", 0))
        status = {
            "exportId": event.export_id,
            "phase": event.phase,
            "scanned": seen["scanned"],
            "matched": seen["matched"],
            "records": event.records,
            "excluded": event.detail.get("excluded", seen.get("excluded", 0)),
            "shards": event.shards,
        }
        seen["excluded"] = status["excluded"]
        try:
            sink.put_status(status_key(event.export_id), orjson.dumps(status))
        except ExportError:
            pass

    return publish


def _now_ms() -> int:
    return int(time.time() * 1000)


def _check_same_request(run: _Run) -> None:
    """An export id already made from another request is a conflict before anything is written."""
    existing = run.sink.get(manifest_key(run.request.export_id))
    if existing is not None and verify_manifest(existing).get("requestDigest") != run.request.digest():
        raise ExportConflict(
            f"export {run.request.export_id} was made from another request: an export is immutable; "
            "use another export id"
        )


def _store_manifest(run: _Run, manifest: dict[str, Any]) -> bool:
    """Whether the manifest was written now (``False``: an identical one was there)."""
    key = manifest_key(run.request.export_id)
    if run.sink.put_if_absent(key, encode_manifest(manifest), content_type=MANIFEST_MEDIA_TYPE):
        return True
    existing = run.sink.get(key)
    if existing is None or verify_manifest(existing)["digest"] != manifest["digest"]:
        raise ExportConflict(
            f"export {run.request.export_id} already has a different manifest: an export is immutable "
            "(its request or source changed since); make a new export"
        )
    return False


async def run_export(
    request: ExportRequest,
    audit_reader: AuditReader,
    content_store: ContentStore,
    export_sink: ExportSink,
    *,
    audit: ExportAudit | None = None,
    progress: Progress | None = None,
    now_ms: Callable[[], int] = _now_ms,
    retention_days: Mapping[str, int] | None = None,
    fetch_concurrency: int = DEFAULT_FETCH_CONCURRENCY,
) -> ExportResult:
    """Run (or resume, or repeat) the export ``request``; see the module docstring."""
    report = progress or (lambda _: None)
    retention = dict(retention_days or {})
    now = now_ms()
    run = _Run(request, export_sink, report)
    _check_same_request(run)
    source = _source(audit_reader, request)
    selected = [r for r in source if matches(r, request.filters)]
    report(ExportProgress(request.export_id, "scanned", detail={"scanned": len(source), "matched": len(selected)}))

    window: list[tuple[RequestRecord, ContentRef]] = []
    for record in selected:
        verdict = screen(record, request.purpose, now_ms=now, retention_days=retention)
        if isinstance(verdict, str):
            run.exclude(verdict)
            continue
        window.append((record, verdict))
        if len(window) >= max(1, fetch_concurrency):
            await _include(run, content_store, window)
            window = []
    await _include(run, content_store, window)
    run.flush()

    first = run.shards[0].first if run.shards else None
    last = run.shards[-1].last if run.shards else None
    manifest = build_manifest(
        request,
        scanned=len(source),
        matched=len(selected),
        first=first,
        last=last,
        content_digest=run.content_digest.hexdigest(),
        exclusions=run.exclusions,
        shards=run.shards,
        retention_classes=sorted(run.classes),
        earliest_expires_at=run.earliest_expiry,
        retention_days=retention,
    )
    written = _store_manifest(run, manifest)
    key = manifest_key(request.export_id)
    excluded = sum(run.exclusions.values())
    report(
        ExportProgress(request.export_id, "manifest", run.records, len(run.shards), {"key": key, "excluded": excluded})
    )
    if audit is not None:
        audit.send(finished_event(manifest, key))
        report(ExportProgress(request.export_id, "audited", run.records, len(run.shards)))
    return ExportResult(request.export_id, key, manifest, run.written, run.reused, written)
