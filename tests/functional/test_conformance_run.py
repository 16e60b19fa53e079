"""``tollway conformance run`` against the mock providers, through the gateway's own codecs and transports.

Every format the mock speaks passes the whole suite (each case its format can represent); a
deployment whose streams the mock breaks (``midstream_error``) is recorded as failing the
streamed cases, and ``requireConformance`` then refuses the routes that declare those capabilities.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tollway.cli import main
from tollway.config import load_config
from tollway.config.root import Publisher
from tollway.conformance import DirectoryStore, check_config
from tollway.exceptions import ConfigError
from tollway.mock.server import MockServerThread

PROVIDER_KEY = "mock-provider-key-conformance-0001"
BROKEN = "midstream_error=1"


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def _provider(kind: str, url: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {"type": kind, "baseUrl": url, "providerAccountId": name, "quotaGroupId": name}
    if kind == "bedrock":
        return {**found, "awsRegion": "eu-west-1"}
    return {**found, "credentials": [{"id": "k", "secretRef": "env:CONFORMANCE_TEST_KEY"}]}


def _config(url: str) -> dict[str, Any]:
    return {
        "providers": {
            "mock-openai": _provider("openai-compatible", f"{url}/v1", "openai"),
            "mock-anthropic": _provider("anthropic", url, "anthropic"),
            "mock-gemini": _provider("gemini", url, "gemini"),
            "mock-bedrock": _provider("bedrock", url, "bedrock"),
            "broken-openai": _provider("openai-compatible", f"{url}/_fault/{BROKEN}/v1", "broken"),
        },
        "conformance": {"requireConformance": True, "results": "results"},
        "models": [
            {
                "name": "chat-openai",
                "capabilities": ["streaming", "tools", "vision", "json_object", "json_schema"],
                "routes": [
                    {
                        "id": "o",
                        "provider": "mock-openai",
                        "model": "gpt-mock",
                        "providerFormat": "openai-chat-completions",
                    }
                ],
            },
            {
                "name": "chat-claude",
                "capabilities": ["streaming", "tools", "vision"],
                "routes": [
                    {
                        "id": "a",
                        "provider": "mock-anthropic",
                        "model": "claude-mock",
                        "providerFormat": "anthropic-messages",
                    },
                    {"id": "g", "provider": "mock-gemini", "model": "gemini-mock", "providerFormat": "gemini"},
                    {
                        "id": "b",
                        "provider": "mock-bedrock",
                        "model": "mock.claude-v1:0",
                        "providerFormat": "bedrock-converse",
                    },
                ],
            },
            {
                "name": "chat-broken",
                "capabilities": ["streaming"],
                "routes": [
                    {
                        "id": "x",
                        "provider": "broken-openai",
                        "model": "gpt-mock",
                        "providerFormat": "openai-chat-completions",
                    }
                ],
            },
        ],
    }


@pytest.fixture
def config(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONFORMANCE_TEST_KEY", PROVIDER_KEY)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock.base_url)))
    return path


def _run(config: Path, deployment: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["conformance", "run", "--deployment", deployment, "--config", str(config), "--timeout", "20"])
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("deployment", "skipped"),
    [
        ("mock-openai", set()),
        ("mock-anthropic", {"json_object.buffered", "json_schema.buffered"}),
        ("mock-gemini", set()),
        ("mock-bedrock", {"json_object.buffered", "json_schema.buffered"}),
    ],
)
def test_every_mock_format_passes_every_case_it_can_represent(
    config: Path, deployment: str, skipped: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _run(config, deployment, capsys)

    assert code == 0, lines
    (result,) = DirectoryStore(config.parent / "results").read_all().values()
    outcomes = {c.case: c.outcome for c in result.cases}
    assert {case for case, outcome in outcomes.items() if outcome == "skipped"} == skipped
    assert all(outcome == "pass" for case, outcome in outcomes.items() if case not in skipped)
    assert lines[-2].startswith("  ok: every declared capability passed")
    assert sum(line.startswith(("  PASS", "  SKIPPED")) for line in lines) == len(outcomes)


def test_a_broken_stream_fails_the_streamed_cases_and_requireconformance_refuses_the_route(
    config: Path, mock: MockServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _run(config, "broken-openai", capsys)

    assert code == 1
    assert any(line.startswith("  FAILED: usage, streaming did not pass") for line in lines), lines
    store = DirectoryStore(config.parent / "results")
    result = store.read("broken-openai", "gpt-mock")
    assert result is not None
    assert {c.case for c in result.cases if c.outcome == "fail"} == {"chat.stream", "usage.stream", "tools.stream"}
    assert (result.capabilities["chat"], result.capabilities["streaming"]) == ("pass", "fail")

    _run(config, "mock-openai", capsys)
    issues = check_config(load_config(config), config.parent)
    by_path = {i.path: i.message for i in issues}
    assert set(by_path) == {"models[1].routes[0]", "models[1].routes[1]", "models[1].routes[2]", "models[2].routes[0]"}
    assert "has no conformance result" in by_path["models[1].routes[0]"]
    assert "failed conformance for capability 'streaming' (case chat.stream failed:" in by_path["models[2].routes[0]"]

    assert main(["config", "validate", str(config), "--conformance"]) == 1
    assert "capability 'streaming'" in capsys.readouterr().err


def test_results_hold_no_prompt_completion_or_credential(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for deployment in ("mock-anthropic", "broken-openai"):
        _run(config, deployment, capsys)
    stored = [p.read_bytes() for p in (config.parent / "results").rglob("*.json")]

    assert len(stored) == 4  # the latest and the history, of each
    for raw in stored:
        assert orjson.loads(raw)["kind"] == "tollway.conformance.result"
        for secret_or_content in (PROVIDER_KEY, "Mock reply", "hello", "weather", "mock-city", "Mock midstream"):
            assert secret_or_content.encode() not in raw


def test_show_prints_the_stored_result_and_fails_without_one(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    show = ["conformance", "show", "--deployment", "mock-gemini", "--config", str(config)]
    assert main(show) == 1
    assert "no result in" in capsys.readouterr().out
    _run(config, "mock-gemini", capsys)
    assert main(show) == 0
    assert capsys.readouterr().out.startswith("mock-gemini gemini-mock (gemini, suite 1)")


def test_an_unknown_deployment_or_model_is_a_usage_error(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as unknown:
        main(["conformance", "run", "--deployment", "nope", "--config", str(config)])
    with pytest.raises(SystemExit) as model:
        main(["conformance", "run", "--deployment", "mock-openai", "--model", "other", "--config", str(config)])
    assert unknown.value.code == model.value.code == 2
    assert "not a provider" in capsys.readouterr().err


def test_publication_refuses_a_route_without_a_result_and_publishes_once_it_passes(
    tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONFORMANCE_TEST_KEY", PROVIDER_KEY)
    doc = _config(mock.base_url)
    doc["models"] = doc["models"][:1]  # chat-openai: every capability, on mock-openai
    doc["providers"] = {"mock-openai": doc["providers"]["mock-openai"]}
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(doc))
    publisher = Publisher(config_dir=tmp_path)
    try:
        with pytest.raises(ConfigError) as refused:
            publisher.publish(load_config(path))
        assert [(i.path, "has no conformance result" in i.message) for i in refused.value.issues] == [
            ("models[0].routes[0]", True)
        ]

        assert _run(path, "mock-openai", capsys)[0] == 0
        root = publisher.publish(load_config(path))
        assert "chat-openai" in root.aliases
    finally:
        asyncio.run(publisher.aclose())
