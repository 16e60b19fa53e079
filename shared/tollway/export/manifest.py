"""The export manifest: what an export holds, where, under which approval, and its own digest.

Layout in the exports bucket (every object created once, never replaced)::

    exports/<exportId>/manifest.json
    exports/<exportId>/shards/<index:05d>-<firstAtMs>-<lastAtMs>-<sourceHash16>.jsonl

A shard's key names its source range: its position in the export, the admission times of its
first and last request, and the first 16 hex digits of the SHA-256 of its source (one
``<requestId>\\t<contentDigest>\\n`` line per row). The same request over the same source makes the
same keys, so a resumed run finds the shards it already wrote; a source that changed in between
(a record expired or deleted) makes other keys, never a different body under an existing key.

The manifest (format 1) is JSON with sorted keys::

    {"format": 1, "exportId": str, "purpose": "audit" | "evaluation" | "training",
     "request": {<the canonical request, ExportRequest.canonical()>}, "requestDigest": sha256,
     "requestedBy": str, "approvals": [{"approvedBy": str, "purpose": str}],
     "filters": {...}, "transformations": {"toolCalls": ..., "pii": ...},
     "source": {"sinceMs": int, "untilMs": int, "scanned": int, "matched": int,
                "first": {"atMs", "requestId"} | null, "last": ... | null,
                "contentDigest": sha256 of every included row's source line, in order},
     "records": int,
     "exclusions": {"deleted": int, "expired": int, "dropped": int, "no_content": int,
                    "integrity_failed": int, "purpose_not_allowed": int, "missing_object": int},
     "shards": [{"index": int, "key": str, "records": int, "bytes": int, "sha256": str,
                 "first": {...}, "last": {...}}],
     "retention": {"classes": [str], "earliestSourceExpiresAt": epoch s | null,
                   "retentionDays": {class: days}},
     "deletionState": {"state": "active", "sourceDeleted": int, "sourceExpired": int},
     "digest": sha256}

``digest`` is the SHA-256 (hex) of the manifest's JSON without ``digest`` (sorted keys, no
whitespace); the object stored is that same JSON with ``digest`` added. Nothing in it depends on
when the job ran: the same request over the same source makes the same bytes. ``deletionState``
is the export's state when it was made; the manifest is immutable, so a later deletion of the
export is recorded beside it (and in the audit trail), never in it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tollway.export.errors import ExportIntegrityError
from tollway.export.request import ExportRequest
from tollway.export.rules import EXCLUSION_REASONS

__all__ = [
    "EXPORTS_ROOT",
    "MANIFEST_FORMAT",
    "MANIFEST_MEDIA_TYPE",
    "SHARD_MEDIA_TYPE",
    "ShardEntry",
    "SourcePosition",
    "build_manifest",
    "encode_manifest",
    "export_prefix",
    "manifest_digest",
    "manifest_key",
    "shard_key",
    "source_line",
    "verify_manifest",
]

MANIFEST_FORMAT: Final = 1
MANIFEST_MEDIA_TYPE: Final = "application/json"
SHARD_MEDIA_TYPE: Final = "application/x-ndjson"
EXPORTS_ROOT: Final = "exports"


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True, order=True)
class SourcePosition:
    """A request's place in the source order: admission (else rejection) time, then request id."""

    at_ms: int
    request_id: str

    def to_json(self) -> dict[str, Any]:
        return {"atMs": self.at_ms, "requestId": self.request_id}


@dataclass(frozen=True, slots=True)
class ShardEntry:
    index: int
    key: str
    records: int
    size: int
    sha256: str
    first: SourcePosition
    last: SourcePosition

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "key": self.key,
            "records": self.records,
            "bytes": self.size,
            "sha256": self.sha256,
            "first": self.first.to_json(),
            "last": self.last.to_json(),
        }


def export_prefix(export_id: str) -> str:
    return f"{EXPORTS_ROOT}/{export_id}/"


def manifest_key(export_id: str) -> str:
    return f"{export_prefix(export_id)}manifest.json"


def status_key(export_id: str) -> str:
    """The run's progress (``tollway.export.job.publish_status``): overwritten as the run goes on."""
    return f"{export_prefix(export_id)}status.json"


def source_line(request_id: str, content_digest: str) -> bytes:
    """One row's share of a source digest."""
    return f"{request_id}\t{content_digest}\n".encode()


def shard_key(export_id: str, index: int, first: SourcePosition, last: SourcePosition, source: bytes) -> str:
    """The key of the ``index``-th shard, whose rows' :func:`source_line` s are ``source``."""
    tag = hashlib.sha256(source).hexdigest()[:16]
    return f"{export_prefix(export_id)}shards/{index:05d}-{first.at_ms}-{last.at_ms}-{tag}.jsonl"


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the manifest's canonical JSON without its ``digest`` field."""
    return hashlib.sha256(_dumps({k: v for k, v in manifest.items() if k != "digest"})).hexdigest()


def build_manifest(
    request: ExportRequest,
    *,
    scanned: int,
    matched: int,
    first: SourcePosition | None,
    last: SourcePosition | None,
    content_digest: str,
    exclusions: Mapping[str, int],
    shards: Sequence[ShardEntry],
    retention_classes: Sequence[str],
    earliest_expires_at: int | None,
    retention_days: Mapping[str, int],
) -> dict[str, Any]:
    """The manifest, its ``digest`` included."""
    canonical = request.canonical()
    counts = {reason: int(exclusions.get(reason, 0)) for reason in EXCLUSION_REASONS}
    doc: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "exportId": request.export_id,
        "purpose": request.purpose,
        "request": canonical,
        "requestDigest": request.digest(),
        "requestedBy": request.requested_by,
        "approvals": [{"approvedBy": request.approved_by, "purpose": request.purpose}],
        "filters": canonical["filters"],
        "transformations": canonical["transformations"],
        "source": {
            "sinceMs": request.since_ms,
            "untilMs": request.until_ms,
            "scanned": scanned,
            "matched": matched,
            "first": None if first is None else first.to_json(),
            "last": None if last is None else last.to_json(),
            "contentDigest": content_digest,
        },
        "records": sum(s.records for s in shards),
        "exclusions": counts,
        "shards": [s.to_json() for s in shards],
        "retention": {
            "classes": sorted(set(retention_classes)),
            "earliestSourceExpiresAt": earliest_expires_at,
            "retentionDays": dict(sorted(retention_days.items())),
        },
        "deletionState": {"state": "active", "sourceDeleted": counts["deleted"], "sourceExpired": counts["expired"]},
    }
    doc["digest"] = manifest_digest(doc)
    return doc


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The stored object: canonical JSON (sorted keys, no whitespace)."""
    return _dumps(manifest)


def verify_manifest(raw: bytes) -> dict[str, Any]:
    """The manifest stored as ``raw``, checked against its own digest; raises :class:`ExportIntegrityError`."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ExportIntegrityError("the manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("digest"), str):
        raise ExportIntegrityError(f"the manifest is not a format-{MANIFEST_FORMAT} manifest with a digest")
    if manifest_digest(doc) != doc["digest"]:
        raise ExportIntegrityError(f"manifest of export {doc.get('exportId')!s}: its digest does not match")
    shards = doc.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise ExportIntegrityError("the manifest's shards are not a list of objects")
    return doc
