from __future__ import annotations

import hashlib

import orjson
import pytest

from tollway.export import EXCLUSION_REASONS, ExportIntegrityError, ExportRequest, manifest_digest, verify_manifest
from tollway.export.manifest import (
    ShardEntry,
    SourcePosition,
    build_manifest,
    encode_manifest,
    manifest_key,
    shard_key,
)

REQUEST = ExportRequest.parse(
    {"purpose": "training", "sinceMs": 0, "untilMs": 10_000, "requestedBy": "alice", "approvedBy": "dpo"}
)


def manifest(**change: object) -> dict[str, object]:
    first, last = SourcePosition(10, "r1"), SourcePosition(20, "r2")
    key = shard_key(REQUEST.export_id, 0, first, last, b"r1\td\nr2\td\n")
    args: dict[str, object] = {
        "scanned": 5,
        "matched": 4,
        "first": first,
        "last": last,
        "content_digest": "c" * 64,
        "exclusions": {"expired": 1, "no_content": 1},
        "shards": [ShardEntry(0, key, 2, 100, "s" * 64, first, last)],
        "retention_classes": ["standard", "standard"],
        "earliest_expires_at": 1234,
        "retention_days": {"standard": 30},
    }
    return build_manifest(REQUEST, **(args | change))  # type: ignore[arg-type]


def test_the_manifest_holds_the_request_counts_shards_and_its_own_digest() -> None:
    doc = manifest()
    assert doc["format"] == 1 and doc["exportId"] == REQUEST.export_id and doc["purpose"] == "training"
    assert doc["approvals"] == [{"approvedBy": "dpo", "purpose": "training"}]
    assert doc["records"] == 2
    assert list(doc["exclusions"]) == list(EXCLUSION_REASONS)  # type: ignore[call-overload]
    assert doc["exclusions"]["expired"] == 1 and doc["exclusions"]["deleted"] == 0  # type: ignore[index]
    assert doc["retention"] == {
        "classes": ["standard"],
        "earliestSourceExpiresAt": 1234,
        "retentionDays": {"standard": 30},
    }
    assert doc["deletionState"] == {"state": "active", "sourceDeleted": 0, "sourceExpired": 1}
    without = orjson.dumps({k: v for k, v in doc.items() if k != "digest"}, option=orjson.OPT_SORT_KEYS)
    assert doc["digest"] == hashlib.sha256(without).hexdigest() == manifest_digest(doc)


def test_the_digest_does_not_depend_on_key_order() -> None:
    doc = manifest()
    reversed_doc = dict(reversed(list(doc.items())))
    assert manifest_digest(reversed_doc) == doc["digest"]
    assert encode_manifest(reversed_doc) == encode_manifest(doc)


def test_a_stored_manifest_verifies_and_a_tampered_one_does_not() -> None:
    raw = encode_manifest(manifest())
    assert verify_manifest(raw)["records"] == 2
    tampered = raw.replace(b'"records":2', b'"records":3')
    with pytest.raises(ExportIntegrityError, match="digest"):
        verify_manifest(tampered)
    with pytest.raises(ExportIntegrityError):
        verify_manifest(b"{}")


def test_keys_name_the_export_and_the_shard_source_range() -> None:
    assert manifest_key("exp-1") == "exports/exp-1/manifest.json"
    key = shard_key("exp-1", 3, SourcePosition(10, "a"), SourcePosition(20, "b"), b"a\td\n")
    assert key.startswith("exports/exp-1/shards/00003-10-20-") and key.endswith(".jsonl")
    assert key != shard_key("exp-1", 3, SourcePosition(10, "a"), SourcePosition(20, "b"), b"a\te\n")
