"""``requireConformance``: each reason a route is refused, at its YAML path, and when it is not judged."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tollway.config.schema import RouterConfig
from tollway.conformance import ConformanceStoreError, check_config, check_routes
from tollway.conformance.result import CaseOutcome, ConformanceResult
from tollway.conformance.store import ResultKey
from tollway.conformance.suite import CASES, SUITE_VERSION, suite_digest
from tollway.exceptions import ConfigIssue

NOW = 1_800_000_000.0
HOUR = 3600.0


def config(**conformance: Any) -> RouterConfig:
    provider = {"type": "openai", "baseUrl": "https://api.example.com/v1"}
    route = {"provider": "openai-prod", "model": "gpt-4o-mini", "providerFormat": "openai-chat-completions"}
    return RouterConfig.model_validate(
        {
            "providers": {"openai-prod": provider},
            "conformance": {"requireConformance": True, **conformance},
            "models": [
                {"name": "chat-v1", "capabilities": ["streaming", "tools"], "routes": [{"id": "a", **route}]},
                {
                    "name": "vision-v1",
                    "capabilities": ["streaming"],
                    "routes": [{"id": "b", **route, "capabilities": ["vision", "json_schema"]}],
                },
                {"name": "embed-v1", "operations": ["embeddings"], "routes": [{"id": "c", **route}]},
            ],
        }
    )


def passing(**changes: Any) -> ConformanceResult:
    base = ConformanceResult(
        suite_version=SUITE_VERSION,
        suite_digest=suite_digest(),
        deployment="openai-prod",
        provider_type="openai",
        provider_format="openai-chat-completions",
        model="gpt-4o-mini",
        started_at=NOW - HOUR - 5,
        finished_at=NOW - HOUR,
        cases=tuple(CaseOutcome(c.id, c.capability, "pass") for c in CASES),
    )
    return dataclasses.replace(base, **changes)


def with_case(case_id: str, outcome: str, reason: str) -> ConformanceResult:
    cases = tuple(
        dataclasses.replace(c, outcome=outcome, reason=reason) if c.case == case_id else c  # type: ignore[arg-type]
        for c in passing().cases
    )
    return passing(cases=cases)


def issues(cfg: RouterConfig, result: ConformanceResult | None) -> list[ConfigIssue]:
    results: dict[ResultKey, ConformanceResult] = {} if result is None else {("openai-prod", "gpt-4o-mini"): result}
    return check_routes(cfg, results, NOW)


def test_a_fresh_passing_result_lets_every_route_publish() -> None:
    assert issues(config(), passing()) == []


def test_a_missing_result_is_reported_for_each_chat_route_but_not_the_embeddings_one() -> None:
    found = issues(config(), None)
    assert [i.path for i in found] == ["models[0].routes[0]", "models[1].routes[0]"]
    assert "has no conformance result" in found[0].message
    assert "tollway conformance run --deployment openai-prod" in found[0].message


def test_a_result_older_than_max_age_is_reported() -> None:
    (first, _) = issues(config(maxAgeHours=24), passing(finished_at=NOW - 25 * HOUR))
    assert "25 h old, older than conformance.maxAgeHours (24 h)" in first.message


def test_a_result_of_another_suite_version_or_definition_is_reported() -> None:
    (old, _) = issues(config(), passing(suite_version="0"))
    assert "suite version 0" in old.message
    (edited, _) = issues(config(), passing(suite_digest="0" * 64))
    assert f"not version {SUITE_VERSION}" in edited.message


def test_a_result_measured_over_another_format_is_reported() -> None:
    (first, _) = issues(config(), passing(provider_format="anthropic-messages"))
    assert "measured over anthropic-messages" in first.message


def test_a_failed_declared_capability_names_the_capability_and_the_case() -> None:
    found = issues(config(), with_case("tools.stream", "fail", "the stream carried no tool call delta"))
    assert [i.path for i in found] == ["models[0].routes[0]"]  # the second route does not declare tools
    assert "capability 'tools'" in found[0].message
    assert "case tools.stream failed: the stream carried no tool call delta" in found[0].message


def test_a_route_declares_its_own_capabilities_over_its_alias() -> None:
    found = issues(config(), with_case("json_schema.buffered", "fail", "the answer is not JSON"))
    assert [i.path for i in found] == ["models[1].routes[0]"]
    assert "capability 'json_schema'" in found[0].message


def test_chat_usage_and_errors_are_always_required() -> None:
    found = issues(
        config(), with_case("errors.invalid_request", "fail", "classified as server, expected invalid_request")
    )
    assert [i.path for i in found] == ["models[0].routes[0]", "models[1].routes[0]"]
    assert all("capability 'errors'" in i.message for i in found)


def test_a_declared_capability_that_was_skipped_is_reported_as_untested() -> None:
    found = issues(config(), with_case("vision.buffered", "skipped", "the x format has no vision"))
    assert [i.path for i in found] == ["models[1].routes[0]"]
    assert "was not tested for capability 'vision'" in found[0].message


def test_a_route_override_turns_the_requirement_off_and_on() -> None:
    cfg = config()
    models = list(cfg.models)
    models[0] = models[0].model_copy(
        update={"routes": [models[0].routes[0].model_copy(update={"requireConformance": False})]}
    )
    assert [i.path for i in check_routes(cfg.model_copy(update={"models": models}), {}, NOW)] == ["models[1].routes[0]"]
    off = config(requireConformance=False)
    models = list(off.models)
    models[1] = models[1].model_copy(
        update={"routes": [models[1].routes[0].model_copy(update={"requireConformance": True})]}
    )
    assert [i.path for i in check_routes(off.model_copy(update={"models": models}), {}, NOW)] == ["models[1].routes[0]"]


class Unreadable:
    location = "s3://results/conformance"

    def __init__(self) -> None:
        self.reads = 0

    def write(self, result: ConformanceResult) -> str:
        raise AssertionError("never written")

    def read(self, deployment: str, model: str) -> ConformanceResult | None:
        raise AssertionError("never read one by one")

    def read_all(self) -> dict[ResultKey, ConformanceResult]:
        self.reads += 1
        raise ConformanceStoreError("s3://results/conformance: cannot list (AccessDenied)")


def test_results_that_cannot_be_read_are_one_issue_at_conformance_results() -> None:
    store = Unreadable()
    assert check_config(config(), store=store, now=NOW) == [
        ConfigIssue("conformance.results", "s3://results/conformance: cannot list (AccessDenied)")
    ]


def test_results_are_not_read_when_no_route_requires_conformance() -> None:
    store = Unreadable()
    assert check_config(config(requireConformance=False), store=store, now=NOW) == []
    assert store.reads == 0


@pytest.mark.parametrize("results", ["", "relative/results"])
def test_check_config_reads_the_configured_directory_beside_the_config(tmp_path: Any, results: str) -> None:
    from tollway.conformance.store import DirectoryStore

    base = tmp_path / "cfg"
    target = DirectoryStore(base / (results or ".tollway/conformance"))
    target.write(passing())
    assert check_config(config(results=results), base, now=NOW, environ={}) == []
