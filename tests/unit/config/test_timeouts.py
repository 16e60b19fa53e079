"""Provider timeouts against the request deadline: a default never invalidates what the user wrote.

A provider's ``requestTimeoutMs`` is a per-read socket timeout; the global ``requestTimeoutMs``
is the deadline of the whole request, which bounds every attempt. The per-read timeout in effect
is the smaller of the two. Only a provider timeout the user wrote, above the deadline, is worth a
word: a warning, since it is valid and simply cannot take effect.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from tollway import cli
from tollway.config.loader import load_config_with_warnings, parse_config
from tollway.config.root import Publisher
from tollway.config.validate import check
from tollway.secrets import SecretResolver
from tollway.server.runtime import GatewayRuntime
from tollway.transport.h1 import H1Transport

KEY_ENV = "TOLLWAY_TIMEOUT_TEST_KEY"


def router(global_ms: int, **provider: Any) -> dict[str, Any]:
    return {
        "requestTimeoutMs": global_ms,
        "providers": {
            "p": {
                "type": "openai",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "group",
                "credentials": [{"id": "c", "secretRef": f"env:{KEY_ENV}"}],
                **provider,
            }
        },
        "models": [
            {
                "name": "m-v1",
                "routes": [{"id": "r", "provider": "p", "model": "x", "providerFormat": "openai-chat-completions"}],
            }
        ],
    }


def per_read_timeout_s(data: dict[str, Any]) -> float:
    root = Publisher(resolver=SecretResolver(env={KEY_ENV: "sk-test"})).publish(parse_config(data))
    transport = root.deployments["p"].transport
    assert isinstance(transport, H1Transport)
    return transport.settings.request_timeout_s


def test_a_short_global_deadline_with_default_provider_timeouts_is_valid() -> None:
    data = router(20000)
    assert check(parse_config(data)) == ([], [])
    assert per_read_timeout_s(data) == 20.0


def test_a_written_provider_timeout_above_the_deadline_is_a_warning_and_the_deadline_wins() -> None:
    data = router(20000, requestTimeoutMs=30000)
    errors, warnings = check(parse_config(data))
    assert errors == []
    assert [(w.path, w.message) for w in warnings] == [
        (
            "providers.p.requestTimeoutMs",
            "exceeds the global requestTimeoutMs (20000), which bounds every attempt: "
            "the per-read timeout in effect is 20000",
        )
    ]
    assert per_read_timeout_s(data) == 20.0


def test_a_written_provider_timeout_below_the_deadline_is_used_as_written() -> None:
    data = router(20000, requestTimeoutMs=5000)
    assert check(parse_config(data)) == ([], [])
    assert per_read_timeout_s(data) == 5.0


def test_the_default_connect_timeout_does_not_invalidate_a_short_provider_timeout() -> None:
    """``connectTimeoutMs`` defaults to 3000; a provider ``requestTimeoutMs`` of 2000 is still valid."""
    assert check(parse_config(router(20000, requestTimeoutMs=2000))) == ([], [])
    errors, _ = check(parse_config(router(20000, requestTimeoutMs=2000, connectTimeoutMs=2500)))
    assert [e.path for e in errors] == ["providers.p.connectTimeoutMs"]


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_config_validate_prints_warnings_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, router(20000, requestTimeoutMs=30000))
    assert cli.main(["config", "validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok (1 aliases, 1 providers, 0 principals), 1 warning(s)\n"
    assert err.splitlines() == [
        "  warning: providers.p.requestTimeoutMs: exceeds the global requestTimeoutMs (20000), which bounds "
        "every attempt: the per-read timeout in effect is 20000"
    ]


def test_the_gateway_logs_warnings_when_it_loads_the_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    path = write(tmp_path, router(20000, requestTimeoutMs=30000))
    assert [w.path for w in load_config_with_warnings(path)[1]] == ["providers.p.requestTimeoutMs"]
    with caplog.at_level(logging.WARNING, logger="tollway.runtime"):
        GatewayRuntime.load(path)
    assert [r.getMessage() for r in caplog.records] == [
        "config warning: providers.p.requestTimeoutMs: exceeds the global requestTimeoutMs (20000), which bounds "
        "every attempt: the per-read timeout in effect is 20000"
    ]
