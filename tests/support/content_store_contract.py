"""The :class:`~tollway.content.ContentStore` contract, run against every implementation.

A test module subclasses :class:`ContentStoreContract` and provides one fixture, ``store``: a
fresh store with nothing in it. What only a stored, encrypted object can show (no plaintext at
rest, tampering with its bytes) is tested beside the S3 store.

The records hold :data:`CANARY`, a string no message, key or stored byte may ever contain.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tollway.content import ContentError, ContentRecord, ContentRef, ContentStore, ContentUnavailable, content_key

CANARY = "canary-7f3e9a1c Grüße 山田太郎 📞"
CAPTURED_AT_MS = 1_767_225_599_999
"""2025-12-31T23:59:59.999Z."""
RETENTION = "standard"
UNICODE_TEXTS = (
    "José Ñúñez-Müller",
    "山田 太郎",
    "+44 20 7946 0958 📞",
    'Zoë\u200dO\'Brien\tline\nbreak "quoted" \\ back',
    "\U0001d11e outside the BMP " + "é" * 100,
    "\x00 a NUL and \u2028 a line separator",
)


def record(request_id: str = "req_0123456789abcdef01234567", **changes: Any) -> ContentRecord:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "tenant": "acme",
        "principal_id": "alice",
        "alias": "chat-default",
        "operation": "chat",
        "mode": "tokenized-content",
        "captured_at_ms": CAPTURED_AT_MS,
        "request": {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": CANARY},
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        },
        "response": {
            "content": "Hello " + CANARY,
            "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'}],
            "finish_reason": "stop",
        },
        **changes,
    }
    return ContentRecord(**fields)


def _no_canary(err: BaseException) -> None:
    assert CANARY not in str(err) and "山田" not in str(err) and "Grüße" not in str(err)


class ContentStoreContract:
    async def test_a_put_record_gets_back_exactly(self, store: ContentStore) -> None:
        original = record()
        ref = await store.put(original, RETENTION)
        got = await store.get(ref)
        assert got == original
        assert got is not None and got.to_json() == original.to_json()

    async def test_unicode_and_both_capturing_modes_round_trip(self, store: ContentStore) -> None:
        for i, text in enumerate(UNICODE_TEXTS):
            mode = ("tokenized-content", "encrypted-raw")[i % 2]
            original = record(
                f"req_unicode_{i}",
                mode=mode,
                request={"messages": [{"role": "user", "content": text}]},
                response=None if i == 0 else {"content": text, "tool_calls": [], "finish_reason": "length"},
            )
            ref = await store.put(original, RETENTION)
            assert ref.mode == mode
            assert await store.get(ref) == original, text

    async def test_the_reference_says_where_and_what_never_the_content(self, store: ContentStore) -> None:
        original = record()
        ref = await store.put(original, "legal-hold")
        assert ref.key == content_key("legal-hold", "acme", CAPTURED_AT_MS, original.request_id)
        assert ref.key == f"content/legal-hold/acme/2025/12/31/{original.request_id}.json.enc"
        assert (ref.digest, ref.size) == (original.digest(), len(original.to_json()))
        assert (ref.retention_class, ref.mode, ref.key_ref) == ("legal-hold", "tokenized-content", ref.key_ref)
        assert ref.key_ref and ref.bucket
        assert ContentRef.from_body(ref.to_body()) == ref
        assert CANARY not in repr(ref.to_body())

    async def test_putting_the_same_record_again_is_idempotent(self, store: ContentStore) -> None:
        original = record()
        first = await store.put(original, RETENTION)
        second = await store.put(original, RETENTION)
        assert (first.key, first.digest, first.size) == (second.key, second.digest, second.size)
        assert await store.get(first) == await store.get(second) == original

    @pytest.mark.parametrize(
        "change",
        [
            {"digest": record("req_other").digest()},
            {"digest": "0" * 64},
            {"digest": "not a digest"},
            {"size": 1},
            {"mode": "encrypted-raw"},
            {"retention_class": "short"},
        ],
        ids=["other-digest", "zero-digest", "bad-digest", "size", "mode", "retention-class"],
    )
    async def test_a_reference_that_does_not_match_the_object_is_an_error_never_content(
        self, store: ContentStore, change: dict[str, Any]
    ) -> None:
        ref = await store.put(record(), RETENTION)
        with pytest.raises(ContentError) as refused:
            await store.get(dataclasses.replace(ref, **change))
        assert not isinstance(refused.value, ContentUnavailable)
        _no_canary(refused.value)
        assert await store.get(ref) == record(), "the object itself is untouched"

    async def test_a_reference_to_another_records_key_is_an_error(self, store: ContentStore) -> None:
        ref = await store.put(record(), RETENTION)
        other = await store.put(record("req_other", response=None), RETENTION)
        with pytest.raises(ContentError) as refused:
            await store.get(dataclasses.replace(ref, key=other.key))
        _no_canary(refused.value)

    @pytest.mark.parametrize(
        "change",
        [
            {"bucket": "another-bucket"},
            {"key": "config/llm-router.yml"},
            {"key": "content/standard/acme/2025/12/31/../../x.json.enc"},
            {"key": "content/standard/acme/req_0123456789abcdef01234567.json.enc"},
        ],
        ids=["bucket", "outside-layout", "dot-dot", "no-date"],
    )
    async def test_a_reference_outside_the_store_is_refused_before_any_read_or_delete(
        self, store: ContentStore, change: dict[str, Any]
    ) -> None:
        ref = await store.put(record(), RETENTION)
        with pytest.raises(ContentError):
            await store.get(dataclasses.replace(ref, **change))
        with pytest.raises(ContentError):
            await store.delete(dataclasses.replace(ref, **change))
        assert await store.get(ref) == record()

    async def test_a_deleted_object_is_gone_and_deleting_again_says_so(self, store: ContentStore) -> None:
        ref = await store.put(record(), RETENTION)
        kept = await store.put(record("req_kept"), RETENTION)
        assert await store.delete(ref) is True
        assert await store.get(ref) is None
        assert await store.delete(ref) is False
        assert await store.get(ref) is None
        assert await store.get(kept) == record("req_kept")

    async def test_an_object_never_stored_gets_nothing_and_deletes_nothing(self, store: ContentStore) -> None:
        ref = await store.put(record(), RETENTION)
        never = dataclasses.replace(ref, key=ref.key.replace("req_0123", "req_9999"))
        assert await store.get(never) is None
        assert await store.delete(never) is False

    @pytest.mark.parametrize(
        ("retention_class", "changes"),
        [
            ("standard/../x", {}),
            ("", {}),
            (".hidden", {}),
            (RETENTION, {"tenant": "acme/globex"}),
            (RETENTION, {"tenant": ".."}),
            (RETENTION, {"request_id": "req 1"}),
            (RETENTION, {"request_id": "r" * 129}),
            (RETENTION, {"request_id": "é"}),
        ],
    )
    async def test_a_key_segment_that_is_not_url_safe_is_refused(
        self, store: ContentStore, retention_class: str, changes: dict[str, Any]
    ) -> None:
        with pytest.raises(ContentError) as refused:
            await store.put(record(**changes), retention_class)
        assert not isinstance(refused.value, ContentUnavailable)
        _no_canary(refused.value)

    async def test_a_record_that_is_not_json_is_refused_without_naming_it(self, store: ContentStore) -> None:
        with pytest.raises(ContentError) as refused:
            await store.put(record(request={"messages": [{CANARY: 1}], 7: "an int key"}), RETENTION)
        assert not isinstance(refused.value, ContentUnavailable)
        _no_canary(refused.value)

    async def test_a_closed_store_is_unavailable_and_says_so_without_content(self, store: ContentStore) -> None:
        ref = await store.put(record(), RETENTION)
        await store.aclose()
        for call in (store.put(record(), RETENTION), store.get(ref), store.delete(ref)):
            with pytest.raises(ContentUnavailable, match="closed") as refused:
                await call
            _no_canary(refused.value)
            assert refused.value.__cause__ is None
