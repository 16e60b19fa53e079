"""A result's JSON, its digest and its verification when read back."""

from __future__ import annotations

import orjson
import pytest

from tollway.conformance.result import (
    CaseOutcome,
    ConformanceResult,
    InvalidResult,
    capability_verdicts,
    parse_result,
    report_lines,
)
from tollway.conformance.suite import SUITE_VERSION, suite_digest

STARTED = 1_790_000_000.123


def result(*cases: CaseOutcome) -> ConformanceResult:
    return ConformanceResult(
        suite_version=SUITE_VERSION,
        suite_digest=suite_digest(),
        deployment="openai-prod",
        provider_type="openai",
        provider_format="openai-chat-completions",
        model="gpt-4o-mini",
        started_at=STARTED,
        finished_at=STARTED + 4.5,
        cases=cases
        or (
            CaseOutcome("chat.buffered", "chat", "pass", "", 12),
            CaseOutcome("chat.stream", "streaming", "fail", "upstream error: truncated", 30),
            CaseOutcome("json_schema.buffered", "json_schema", "skipped", "the x format has no json_schema"),
        ),
    )


def test_a_result_reads_back_equal_and_carries_its_own_digest() -> None:
    original = result()
    raw = original.to_json()
    doc = orjson.loads(raw)

    assert parse_result(raw) == original
    assert doc["digest"] == original.digest
    assert doc["suite"] == {"version": SUITE_VERSION, "digest": suite_digest()}
    assert (doc["startedAt"], doc["finishedAt"]) == ("2026-09-21T14:13:20.123Z", "2026-09-21T14:13:24.623Z")
    assert doc["capabilities"]["streaming"] == "fail"


def test_the_digest_covers_every_field() -> None:
    base = result()
    other = result(*base.cases[:2])
    assert base.digest != other.digest


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("cases", 1, "outcome"), "pass"),
        (("cases", 1, "reason"), ""),
        (("capabilities", "streaming"), "pass"),
        (("model",), "gpt-4o"),
        (("finishedAt",), "2026-09-21T14:13:25.000Z"),
    ],
)
def test_an_edited_result_does_not_verify(path: tuple[object, ...], value: object) -> None:
    doc = orjson.loads(result().to_json())
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(InvalidResult, match="digest"):
        parse_result(orjson.dumps(doc))


def test_a_document_that_is_no_result_is_refused() -> None:
    with pytest.raises(InvalidResult):
        parse_result(b"{not json")
    with pytest.raises(InvalidResult):
        parse_result(b'{"kind": "something-else"}')
    doc = orjson.loads(result().to_json())
    del doc["digest"]
    with pytest.raises(InvalidResult):
        parse_result(orjson.dumps(doc))


def test_a_failed_case_fails_its_capability_and_one_that_never_ran_is_skipped() -> None:
    verdicts = capability_verdicts(
        [
            CaseOutcome("usage.buffered", "usage", "pass"),
            CaseOutcome("usage.stream", "usage", "fail", "no usage reported"),
            CaseOutcome("chat.buffered", "chat", "pass"),
        ]
    )
    assert verdicts["usage"] == "fail"
    assert verdicts["chat"] == "pass"
    assert verdicts["vision"] == "skipped"


def test_the_report_has_a_line_per_case_and_says_which_declared_capability_did_not_pass() -> None:
    lines = report_lines(result(), ["chat", "streaming"])
    assert len(lines) == 1 + 3 + 2
    assert lines[2].split()[:2] == ["FAIL", "chat.stream"]
    assert lines[-1].startswith("  FAILED: streaming did not pass")
