"""The preservation corpus and how the runner reads an answer: preserved, altered, omitted, hallucinated."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tollway.pii.conformance import (
    CORPUS_VERSION,
    Case,
    ConformanceError,
    DeploymentResult,
    Outcome,
    Results,
    answer_text,
    classify,
    load_corpus,
    load_results,
)
from tollway.pii.detectors import BUILTIN_KINDS, build_detector
from tollway.pii.placeholders import PLACEHOLDER_RE

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
P1 = "[TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]"
FORGED = "[TWPII1_EMAIL_MOCKMOCKMOCKMOCK_MOCKMOCKMOCKM]"


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (f"Sent to {EMAIL}, charged {CARD}.", Outcome(preserved=2)),
        (f"Sent to {EMAIL}.", Outcome(preserved=1, omitted=1)),
        ("Done.", Outcome(omitted=2)),
        (f"Sent to [TWPII1_email_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB], charged {CARD}.", Outcome(preserved=1, altered=1)),
        (f"Sent to TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB and {CARD}", Outcome(preserved=1, altered=1)),
        (f"Sent to [TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3N], charged {CARD}.", Outcome(preserved=1, altered=1)),
        (f"Sent to {P1}, charged {CARD}.", Outcome(preserved=1, altered=1)),
        (f"Sent to {EMAIL}, charged {CARD} {FORGED}", Outcome(preserved=2, hallucinated=1)),
        (f"Sent to {FORGED}.", Outcome(altered=1, omitted=1)),
        (f"{EMAIL} {CARD} [twpii1_email_x] [twpii1_email_x]", Outcome(preserved=2, hallucinated=1)),
        ("[twpii1_a] [twpii1_b] [twpii1_c]", Outcome(altered=2, hallucinated=1)),
    ],
)
def test_an_answer_is_read_value_by_value(answer: str, outcome: Outcome) -> None:
    assert classify(answer, [EMAIL, CARD]) == outcome


def test_a_value_listed_twice_counts_once() -> None:
    assert classify(EMAIL, [EMAIL, EMAIL]) == Outcome(preserved=1)


def test_the_answer_text_holds_content_and_decoded_tool_arguments() -> None:
    args = orjson.dumps({"to": 'a "quoted" name', "nested": {"cards": [CARD]}, "n": 3}).decode()
    response = {
        "choices": [
            {
                "message": {
                    "content": f"mail {EMAIL}",
                    "tool_calls": [
                        {"function": {"name": "send", "arguments": args}},
                        {"function": {"name": "raw", "arguments": "not json [TWPII1_"}},
                    ],
                }
            }
        ]
    }
    text = answer_text(response)
    assert text.split("\n") == [f"mail {EMAIL}", 'a "quoted" name', CARD, "not json [TWPII1_"]


# --- the corpus ----------------------------------------------------------------------------------

CORPUS = load_corpus()
DETECTOR = build_detector(sorted(BUILTIN_KINDS))
_SYNTHETIC_EMAIL = re.compile(r"@example\.(com|org|net|co\.uk)$")


def _last_text(case: Case) -> str:
    content = case.messages[-1]["content"]
    assert isinstance(content, str)
    return content


def test_the_bundled_corpus_is_versioned_and_covers_every_shape() -> None:
    assert CORPUS.version == CORPUS_VERSION
    assert 20 <= len(CORPUS.cases) <= 40
    assert len({c.id for c in CORPUS.cases}) == len(CORPUS.cases)
    shapes = Counter(c.shape for c in CORPUS.cases)
    assert {"prose", "list", "json", "table", "code", "multi-turn", "tool-history", "tool-call"} <= set(shapes)
    assert all(c.tool_choice and c.tools for c in CORPUS.cases if c.shape == "tool-call")
    assert any(m.get("tool_calls") for c in CORPUS.cases for m in c.messages)


@pytest.mark.parametrize("case", CORPUS.cases, ids=lambda c: c.id)
def test_every_case_lists_exactly_what_the_detectors_find_in_its_last_message(case: Case) -> None:
    """A value the detectors missed would reach the provider as it is and read as preserved."""
    text = _last_text(case)
    found = {text[s.start : s.end] for s in DETECTOR.find(text)}
    assert found == set(case.values)
    assert case.messages[-1]["role"] in ("user", "tool")
    assert not any(a != b and a in b for a in case.values for b in case.values), "a value inside another"
    assert all(_SYNTHETIC_EMAIL.search(v) for v in case.values if "@" in v)
    # The mock echoes the last message's first 64 words; every value must be among them.
    assert len(text.split()) <= 60


def test_a_case_becomes_a_chat_completions_request() -> None:
    case = next(c for c in CORPUS.cases if c.shape == "tool-call")
    body = case.body("pii-alias")
    assert body["model"] == "pii-alias"
    assert body["tool_choice"] == case.tool_choice
    assert body["tools"] == list(case.tools)
    assert "tools" not in next(c for c in CORPUS.cases if c.shape == "prose").body("m")


def test_a_corpus_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"version": "x", "cases": [{"id": "a", "messages": [], "values": ["v"]}]}')
    with pytest.raises(ConformanceError, match="needs messages"):
        load_corpus(path)
    with pytest.raises(ConformanceError, match="cannot read"):
        load_corpus(tmp_path / "missing.json")


# --- results -------------------------------------------------------------------------------------


def test_results_round_trip_through_their_json() -> None:
    result = DeploymentResult("pii-a", 26, 55, 0.9, 0.05, 0.05, 0.1, failed=1, errors={"502 pii_unresolved": 1})
    results = Results(CORPUS_VERSION, "2026-01-01T00:00:00Z", {"route-a": result})
    again = load_results(results.to_json())
    assert again == results
    doc = orjson.loads(results.to_json())
    assert doc["corpus"] == "preservation-v1"
    assert doc["deployments"]["route-a"]["preserved"] == 0.9
    assert results.summary() == [
        "route-a (through pii-a): 26 cases, 55 values: preserved 90.0%, altered 5.0%, omitted 5.0%, "
        "hallucinated 10.0% of answers; 1 failed: 502 pii_unresolved 1"
    ]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"not json", "not a conformance result"),
        (b'{"corpus": "c", "measuredAt": "t"}', "deployments"),
        (
            b'{"corpus": "c", "measuredAt": "t", "deployments": {"a": {"cases": 1, "values": 1, "preserved": 1.5, '
            b'"altered": 0, "omitted": 0, "hallucinated": 0}}}',
            "a.preserved must be a rate between 0 and 1",
        ),
    ],
)
def test_a_results_file_that_is_not_one_is_refused(raw: bytes, fragment: str) -> None:
    with pytest.raises(ConformanceError, match=re.escape(fragment)):
        load_results(raw)


def test_the_placeholder_grammar_is_what_the_runner_looks_for() -> None:
    assert PLACEHOLDER_RE.fullmatch(P1) and PLACEHOLDER_RE.fullmatch(FORGED)


# --- the command ---------------------------------------------------------------------------------


def test_the_command_measures_each_model_under_its_label_and_writes_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tollway import cli
    from tollway.pii import conformance

    asked: list[Any] = []

    def fake_run(base_url: str, key: str, models: Any, corpus: Any, **options: Any) -> Results:
        asked.append((base_url, key, models, corpus.version, options))
        bad = DeploymentResult("b", 26, 55, 0.5, 0.0, 0.5, 0.0, failed=2, errors={"503 overloaded": 2})
        good = DeploymentResult("a", 26, 55, 1.0, 0.0, 0.0, 0.0)
        return Results(CORPUS_VERSION, "2026-01-01T00:00:00Z", {"a": good, "route-b": bad})

    monkeypatch.setattr(conformance, "run", fake_run)
    monkeypatch.setenv("TOLLWAY_KEY", "tw-key")
    out = tmp_path / "results.json"
    argv = ["pii", "conformance", "--base-url", "http://gw/v1", "--model", "a", "--model", "b=route-b"]
    assert cli.main([*argv, "--out", str(out), "--concurrency", "2"]) == 1  # a request failed: 503
    assert asked == [("http://gw/v1", "tw-key", [("a", "a"), ("b", "route-b")], CORPUS_VERSION, asked[0][4])]
    assert asked[0][4] == {"concurrency": 2, "timeout_s": 120.0}
    assert set(load_results(out.read_bytes()).deployments) == {"a", "route-b"}
    assert "route-b (through b): 26 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "a", "--model", "a"], "each label once"),
        (["--model", "a", "--key", ""], "--key (or $TOLLWAY_KEY) is required"),
        (["--model", "a", "--corpus", "/nonexistent/corpus.json"], "cannot read the corpus"),
    ],
)
def test_the_command_refuses_bad_arguments_with_status_2(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tollway import cli

    monkeypatch.setenv("TOLLWAY_KEY", "")
    with pytest.raises(SystemExit) as exc:
        cli.main(["pii", "conformance", "--base-url", "http://gw/v1", "--key", "k", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
