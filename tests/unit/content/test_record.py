"""The content record's plaintext, its object key and the audit trail's reference to it: pure
functions, so every malformed input is checked here rather than through a store."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from tollway.content import CONTENT_MEDIA_TYPE, ContentError, ContentRecord, ContentRef, content_key

CAPTURED_AT_MS = 1_767_225_599_999
"""2025-12-31T23:59:59.999Z: the last millisecond of a day, so the key's date is the UTC one."""


def record(**changes: Any) -> ContentRecord:
    fields: dict[str, Any] = {
        "request_id": "req_0123456789abcdef01234567",
        "tenant": "acme",
        "principal_id": "alice",
        "alias": "chat-default",
        "operation": "chat",
        "mode": "tokenized-content",
        "captured_at_ms": CAPTURED_AT_MS,
        "request": {"messages": [{"role": "user", "content": "Grüße, 山田 📞"}], "tools": []},
        "response": {"content": "hello", "tool_calls": [], "finish_reason": "stop"},
        **changes,
    }
    return ContentRecord(**fields)


def ref_body(**changes: Any) -> dict[str, Any]:
    return {
        "bucket": "tollway-content-123456789012-eu-west-1",
        "key": "content/standard/acme/2025/12/31/req_1.json.enc",
        "digest": "ab" * 32,
        "size": 120,
        "keyRef": "arn:aws:kms:eu-west-1:123456789012:key/1234",
        "retentionClass": "standard",
        "mode": "encrypted-raw",
        "mediaType": CONTENT_MEDIA_TYPE,
        **changes,
    }


def test_to_json_is_deterministic_whatever_the_order_of_nested_keys() -> None:
    one = record(request={"messages": [{"role": "user", "content": "x"}], "tools": [{"b": 1, "a": 2}]})
    two = record(request={"tools": [{"a": 2, "b": 1}], "messages": [{"content": "x", "role": "user"}]})
    assert one.to_json() == two.to_json()
    assert one.digest() == two.digest() == hashlib.sha256(one.to_json()).hexdigest()
    doc = orjson.loads(one.to_json())
    assert list(doc) == sorted(doc)
    assert doc["format"] == 1 and doc["requestId"] == one.request_id and doc["capturedAt"] == CAPTURED_AT_MS


@pytest.mark.parametrize("response", [None, {"content": "Zoë \U0001d11e", "tool_calls": [], "finish_reason": "stop"}])
def test_from_json_round_trips_a_record_exactly(response: dict[str, Any] | None) -> None:
    original = record(mode="encrypted-raw", response=response)
    again = ContentRecord.from_json(original.to_json())
    assert again == original
    assert again.to_json() == original.to_json()


def _doc(**changes: Any) -> bytes:
    doc = orjson.loads(record().to_json())
    for key, value in changes.items():
        if value is _DELETE:
            del doc[key]
        else:
            doc[key] = value
    return orjson.dumps(doc)


_DELETE = object()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'"a string"',
        b"null",
        _doc(format=2),
        _doc(format=_DELETE),
        _doc(mode="metadata-only"),
        _doc(mode="disabled"),
        _doc(mode=["tokenized-content"]),
        _doc(requestId=_DELETE),
        _doc(capturedAt="yesterday"),
        _doc(request=[["messages", []]]),
        _doc(request="messages"),
        _doc(response=["stop"]),
    ],
)
def test_from_json_refuses_what_is_not_a_content_record_and_names_no_content(raw: bytes) -> None:
    with pytest.raises(ContentError) as refused:
        ContentRecord.from_json(raw)
    assert "Grüße" not in str(refused.value) and "hello" not in str(refused.value)
    assert refused.value.__cause__ is None


def test_the_content_key_leads_with_the_retention_class_and_dates_in_utc() -> None:
    assert content_key("standard", "acme", CAPTURED_AT_MS, "req_1") == (
        "content/standard/acme/2025/12/31/req_1.json.enc"
    )
    assert content_key("legal-hold", "globex", CAPTURED_AT_MS + 1, "req_2") == (
        "content/legal-hold/globex/2026/01/01/req_2.json.enc"
    )
    assert content_key("short", "t", 0, "r") == "content/short/t/1970/01/01/r.json.enc"


def test_a_reference_round_trips_through_its_body() -> None:
    ref = ContentRef.from_body(ref_body())
    body = ref.to_body()
    assert {k: body[k] for k in ref_body()} == ref_body()
    assert ContentRef.from_body(ref.to_body()) == ref
    assert ref.mode == "encrypted-raw" and ref.media_type == CONTENT_MEDIA_TYPE


def test_a_reference_without_a_media_type_gets_the_record_media_type() -> None:
    body = ref_body()
    del body["mediaType"]
    assert ContentRef.from_body(body).media_type == CONTENT_MEDIA_TYPE


@pytest.mark.parametrize(
    "body",
    [
        {},
        {k: v for k, v in ref_body().items() if k != "digest"},
        {k: v for k, v in ref_body().items() if k != "keyRef"},
        ref_body(bucket=""),
        ref_body(key=7),
        ref_body(digest=None),
        ref_body(size="120"),
        ref_body(size=-1),
        ref_body(size=True),
        ref_body(retentionClass=["standard"]),
        ref_body(mediaType=""),
        ref_body(mode="metadata-only"),
        ref_body(mode="disabled"),
        ref_body(mode="anything"),
        ref_body(mode=["encrypted-raw"]),
    ],
)
def test_a_malformed_reference_is_a_content_error(body: dict[str, Any]) -> None:
    with pytest.raises(ContentError):
        ContentRef.from_body(body)
