from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.unit.export.corpus import BASE_MS, chat_record
from tollway.audit.store import RequestRecord
from tollway.content import ContentRef
from tollway.export import ExportFilters
from tollway.export.rules import allows, check_fetched, matches, screen

DAY_MS = 86_400_000


def ref(mode: str = "tokenized-content", purposes: tuple[str, ...] = ("audit",), **extra: Any) -> ContentRef:
    return ContentRef(
        bucket="b",
        key="content/standard/acme/2027/01/01/r1.json.enc",
        digest="0" * 64,
        size=10,
        key_ref="k",
        retention_class=extra.get("retention_class", "standard"),
        mode=mode,  # type: ignore[arg-type]
        purposes=purposes,
    )


def record(**fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "request_id": "r1",
        "admitted_at_ms": BASE_MS,
        "finished_at_ms": BASE_MS + 5,
        "tenant_id": "acme",
        "alias": "chat",
        "principal_id": "alice",
        "outcome": "ok",
        "expires_at": (BASE_MS + 90 * DAY_MS) // 1000,
        "content": ref().to_body(),
    }
    return RequestRecord(**(base | fields))


@pytest.mark.parametrize(
    ("purpose", "mode", "consent", "allowed"),
    [
        ("audit", "tokenized-content", ("audit",), True),
        ("audit", "encrypted-raw", ("audit",), True),
        ("audit", "tokenized-content", ("training",), True),
        ("evaluation", "tokenized-content", ("audit",), False),
        ("evaluation", "tokenized-content", ("audit", "evaluation"), True),
        ("evaluation", "encrypted-raw", ("audit", "evaluation"), False),
        ("training", "tokenized-content", ("audit", "evaluation"), False),
        ("training", "tokenized-content", ("training",), True),
        ("training", "encrypted-raw", ("audit", "evaluation", "training"), False),
    ],
)
def test_purpose_rules(purpose: Any, mode: str, consent: tuple[str, ...], allowed: bool) -> None:
    assert allows(purpose, ref(mode, consent)) is allowed


def test_an_eligible_record_yields_its_reference() -> None:
    found = screen(record(), "audit", now_ms=BASE_MS + DAY_MS)
    assert isinstance(found, ContentRef) and found.key.endswith("r1.json.enc")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"content_deleted": {"deletedBy": "dpo", "reason": "erasure", "existed": True}}, "deleted"),
        ({"expires_at": (BASE_MS + DAY_MS) // 1000 - 1}, "expired"),
        ({"content": None, "content_dropped": {"mode": "tokenized-content", "reason": "queue_full"}}, "dropped"),
        ({"content": None}, "no_content"),
        ({"content": {"bucket": "b"}}, "integrity_failed"),
        ({"content": ref("tokenized-content", ("audit", "pirate")).to_body()}, "integrity_failed"),
        ({"content": ref("encrypted-raw", ("audit", "training")).to_body()}, "purpose_not_allowed"),
    ],
)
def test_each_exclusion_reason(fields: dict[str, Any], reason: str) -> None:
    assert screen(record(**fields), "training", now_ms=BASE_MS + DAY_MS) == reason


def test_deletion_is_reported_before_expiry() -> None:
    gone = record(content_deleted={"deletedBy": "dpo", "reason": "erasure", "existed": True}, expires_at=1)
    assert screen(gone, "audit", now_ms=BASE_MS) == "deleted"


def test_content_past_its_retention_class_is_expired_while_its_object_still_exists() -> None:
    short = record(content=ref(retention_class="short").to_body())
    assert screen(short, "audit", now_ms=BASE_MS + 2 * DAY_MS, retention_days={"short": 1}) == "expired"
    assert isinstance(screen(short, "audit", now_ms=BASE_MS + 2 * DAY_MS, retention_days={"short": 3}), ContentRef)


def test_the_fetch_excludes_a_missing_object_and_content_of_another_request() -> None:
    r, content_ref = record(), ref()
    assert check_fetched(r, content_ref, None) == "missing_object"
    assert check_fetched(r, content_ref, chat_record("r2", BASE_MS)) == "integrity_failed"
    raw = dataclasses.replace(chat_record("r1", BASE_MS), mode="encrypted-raw")
    assert check_fetched(r, content_ref, raw) == "integrity_failed"
    assert check_fetched(r, content_ref, chat_record("r1", BASE_MS)) is None


def test_filters_select_any_of_their_values_and_an_empty_filter_selects_all() -> None:
    r = record()
    assert matches(r, ExportFilters())
    assert matches(r, ExportFilters(tenants=("acme", "globex"), outcomes=("ok",)))
    assert not matches(r, ExportFilters(aliases=("embed",)))
    assert not matches(r, ExportFilters(principals=("bob",)))
