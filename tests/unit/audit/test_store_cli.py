"""``tollway audit show|list`` rendering the store's views (in-memory store; DynamoDB in the integration tier)."""

from __future__ import annotations

import dataclasses
import io
import json
import time

import pytest

from tests.unit.audit.test_store import T0, admitted, attempt_done, finished, retried_request, started
from tollway.audit.cli import main, parse_since
from tollway.audit.events import AuditEvent
from tollway.audit.store import MemoryAuditStore


def run(store: MemoryAuditStore, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), store=store, out=out)
    return code, out.getvalue()


@pytest.fixture
def store() -> MemoryAuditStore:
    s = MemoryAuditStore()
    s.apply(retried_request("r-done"))
    s.apply([admitted("r-crash", ts=T0 + 1000), started("r-crash", 1, T0 + 1001)])
    return s


def test_show_prints_the_request_line_then_its_attempts_in_order(store: MemoryAuditStore) -> None:
    code, text = run(store, "show", "r-done")

    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("request r-done  complete  status 200  outcome ok  attempts 2  total 99.8 ms")
    assert "usage prompt=11 completion=7 total=18 (provider-reported)" in lines[0]
    assert "principal p-1" in lines[1] and "alias chat" in lines[1] and "stream yes" in lines[1]
    assert "admitted 2025-11-29T07:06:40.000Z" in lines[2] and "finished 2025-11-29T07:06:40.061Z" in lines[2]
    attempts = [line for line in lines if line.startswith("  attempt ")]
    assert [line.split()[1] for line in attempts] == ["1", "2"]
    assert attempts[0].startswith("  attempt 1  error  status 503  error overloaded")
    assert "first-token -" in attempts[0] and "total 40.2 ms" in attempts[0] and "reason first" in attempts[0]
    assert attempts[1].startswith("  attempt 2  ok  status 200") and "first-token 12.5 ms" in attempts[1]
    assert "reason fallback" in attempts[1] and "route route-2" in attempts[1] and "deployment dep-2" in attempts[1]
    assert "INCOMPLETE" not in text


def test_show_marks_incomplete_requests_and_attempts(store: MemoryAuditStore) -> None:
    code, text = run(store, "show", "r-crash")

    assert code == 0
    lines = text.splitlines()
    assert "INCOMPLETE (no request_finished)" in lines[0]
    (attempt,) = [line for line in lines if line.startswith("  attempt ")]
    assert attempt.startswith("  attempt 1  INCOMPLETE (no attempt_finished)")
    assert "started 2025-11-29T07:06:41.001Z" in attempt and "finished -" in attempt


def test_show_marks_a_finish_whose_start_is_not_stored() -> None:
    store = MemoryAuditStore()
    store.apply([attempt_done("r-half", 1, T0), finished("r-half", T0 + 1)])

    _, text = run(store, "show", "r-half")

    assert "(no request_admitted stored)" in text.splitlines()[0]
    assert "attempt 1  ok (no attempt_started stored)" in text


def test_show_json_carries_every_field_and_the_incomplete_flags(store: MemoryAuditStore) -> None:
    code, text = run(store, "show", "r-crash", "--json")

    assert code == 0
    doc = json.loads(text)
    assert doc["incomplete"] is True
    assert doc["request"]["request_id"] == "r-crash" and doc["request"]["incomplete"] is True
    assert doc["request"]["principal_id"] == "p-1" and doc["request"]["status"] is None
    assert [(a["number"], a["incomplete"], a["reason"]) for a in doc["attempts"]] == [(1, True, "first")]

    _, done = run(store, "show", "r-done", "--json")
    full = json.loads(done)
    assert full["incomplete"] is False
    assert [a["outcome"] for a in full["attempts"]] == ["error", "ok"]
    assert full["request"]["usage"] == {"promptTokens": 11, "completionTokens": 7, "totalTokens": 18}


def _with(event: AuditEvent, field: str, value: object) -> AuditEvent:
    """``event`` with one body field replaced."""
    return dataclasses.replace(event, body={**event.body, field: value})


@pytest.mark.parametrize(
    ("usage", "shown", "total"),
    [
        (
            {"promptTokens": 3, "completionTokens": 4, "totalTokens": 7, "cachedPromptTokens": 1, "reasoningTokens": 0},
            "usage prompt=3 completion=4 total=7 cached=1 reasoning=0 (provider-reported)",
            "7",
        ),
        ({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}, "usage prompt=3 completion=4 total=7 (", "7"),
        ({"promptTokens": 3}, "usage prompt=3 (provider-reported)", "-"),
        ({}, "usage - (provider-reported)", "-"),
        (None, "usage - (provider-reported)", "-"),
    ],
    ids=["recorder-names", "openai-names", "no-total", "no-counts", "null"],
)
def test_usage_is_read_under_the_recorders_names_and_openais(
    usage: dict[str, object] | None, shown: str, total: str
) -> None:
    store = MemoryAuditStore()
    store.apply([admitted("r-u", ts=T0), _with(finished("r-u", T0 + 5), "usage", usage)])

    _, text = run(store, "show", "r-u")
    _, listing = run(store, "list", "--since", "2025-11-29T07:00:00Z")

    assert shown in text.splitlines()[0]
    assert listing.splitlines()[1].split()[-1] == total


def test_cost_is_shown_in_dollars_from_integer_micro_usd() -> None:
    store = MemoryAuditStore()
    store.apply([admitted("r-c", ts=T0), _with(finished("r-c", T0 + 5), "cost", 1_234_567)])

    _, text = run(store, "show", "r-c")
    _, raw = run(store, "show", "r-c", "--json")

    assert "cost $1.234567" in text.splitlines()[2]
    assert json.loads(raw)["request"]["cost"] == 1_234_567


def test_an_unknown_cost_is_shown_as_missing(store: MemoryAuditStore) -> None:
    _, text = run(store, "show", "r-done")

    assert "cost -" in text.splitlines()[2]


def test_show_of_an_unknown_request_exits_1(store: MemoryAuditStore, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(store, "show", "r-missing")

    assert (code, text) == (1, "")
    assert "no audit record for request r-missing" in capsys.readouterr().err


def test_list_shows_requests_newest_first_with_incomplete_marked(store: MemoryAuditStore) -> None:
    since = "2025-11-29T07:00:00Z"
    code, text = run(store, "list", "--since", since)

    assert code == 0
    header, *rows = text.splitlines()
    assert header.split() == [
        "ADMITTED",
        "REQUEST",
        "PRINCIPAL",
        "ALIAS",
        "STATUS",
        "OUTCOME",
        "ATTEMPTS",
        "TOTAL_MS",
        "TOKENS",
    ]
    assert [row.split()[1] for row in rows] == ["r-crash", "r-done"]
    assert rows[0].split()[4] == "INCOMPLETE"
    assert rows[1].split()[4:] == ["200", "ok", "2", "99.8", "18"]

    _, later = run(store, "list", "--since", "2025-11-29T07:06:40.500Z", "--json")
    assert [r["request_id"] for r in json.loads(later)] == ["r-crash"]
    _, limited = run(store, "list", "--since", since, "--limit", "1", "--json")
    assert [r["request_id"] for r in json.loads(limited)] == ["r-crash"]
    _, other = run(store, "list", "--since", since, "--principal", "p-nobody", "--json")
    assert json.loads(other) == []


def test_since_takes_a_duration_back_from_now_or_an_iso_time() -> None:
    now = T0 + 3_600_000
    assert parse_since("90s", now) == now - 90_000
    assert parse_since("15m", now) == now - 900_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("7d", now) == now - 7 * 86_400_000
    assert parse_since("1w", now) == now - 7 * 86_400_000
    assert parse_since("2025-11-29T07:06:40Z", now) == T0
    assert parse_since("2025-11-29T07:06:40", now) == T0  # no offset: UTC
    assert parse_since("2025-11-29T08:06:40+01:00", now) == T0
    assert parse_since("2025-11-29", now) == T0 - (7 * 3600 + 6 * 60 + 40) * 1000
    for bad in ("yesterday", "15", "5y", ""):
        with pytest.raises(ValueError, match="--since"):
            parse_since(bad, now)


@pytest.mark.parametrize(
    "argv",
    [["list"], ["list", "--since", "soon"], ["list", "--since", "1h", "--limit", "0"], ["show"], ["nope"]],
    ids=["since-missing", "since-bad", "limit-zero", "id-missing", "unknown-command"],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv, store=MemoryAuditStore())
    assert exited.value.code == 2
    assert "usage: tollway audit" in capsys.readouterr().err


def test_a_recent_duration_lists_what_was_just_admitted() -> None:
    store = MemoryAuditStore()
    now = int(time.time() * 1000)
    store.apply([admitted("r-now", ts=now - 1000), admitted("r-old", ts=now - 3 * 3_600_000)])

    _, text = run(store, "list", "--since", "1h", "--json")

    assert [r["request_id"] for r in json.loads(text)] == ["r-now"]


def test_the_stage_audit_table_matches_the_resource_spec() -> None:
    from tollway.audit.cli import stage_audit_table
    from tollway.cloud.resources import DEFAULT_PREFIX, topology

    assert stage_audit_table("") == topology(DEFAULT_PREFIX).table("audit").name
    assert stage_audit_table("prod-eu") == topology("prod-eu").table("audit").name


def test_list_and_show_a_request_rejected_before_admission(store: MemoryAuditStore) -> None:
    from tests.unit.audit.test_store import rejected

    store.apply([rejected("r-429", T0 + 2000)])

    _, listing = run(store, "list", "--since", "2025-11-29T07:00:00Z")
    _, text = run(store, "show", "r-429")
    _, raw = run(store, "show", "r-429", "--json")

    newest = listing.splitlines()[1].split()
    assert newest[:2] == ["2025-11-29T07:06:42.000Z", "r-429"]
    assert newest[4:7] == ["429", "rejected", "0"]
    lines = text.splitlines()
    assert lines[0].startswith("request r-429  rejected before admission  status 429  outcome rejected  attempts 0")
    assert "principal p-1" in lines[1] and "alias chat" in lines[1]
    assert "rejected 2025-11-29T07:06:42.000Z" in lines[2] and "error rate_limited" in lines[2]
    assert lines[3] == "  no attempts (rejected before admission)"
    assert "INCOMPLETE" not in text
    doc = json.loads(raw)
    assert (doc["incomplete"], doc["request"]["rejected"], doc["request"]["status"]) == (False, True, 429)


def test_show_prints_the_content_reference_and_its_deletion_never_content() -> None:
    from tollway.audit.events import content_deleted, content_stored

    store = MemoryAuditStore()
    store.apply(retried_request("r-done"))
    ref = {
        "bucket": "b",
        "key": "content/standard/acme/2026/12/02/r-done.json.enc",
        "digest": "ab" * 32,
        "size": 321,
        "keyRef": "alias/tollway-content",
        "retentionClass": "standard",
        "mode": "tokenized-content",
        "mediaType": "application/vnd.tollway.content+json",
        "purposes": ["audit", "evaluation"],
    }
    store.apply([content_stored(request_id="r-done", root_digest="d" * 64, ref=ref)])
    code, text = run(store, "show", "r-done")
    assert code == 0
    assert "stored s3://b/content/standard/acme/2026/12/02/r-done.json.enc" in text
    assert "retention standard" in text and "purposes audit,evaluation" in text
    store.apply(
        [content_deleted(request_id="r-done", root_digest="d" * 64, deleted_by="dana", reason="dsr", existed=True)]
    )
    code, text = run(store, "show", "r-done")
    assert "content deleted" in text and "by dana" in text and "reason dsr" in text and "existed yes" in text
