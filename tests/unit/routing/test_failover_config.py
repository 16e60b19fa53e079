"""The failover keys: their bounds, their validation, and what the publisher compiles them into."""

from __future__ import annotations

from typing import Any

import pytest

from tollway.config import parse_config, validate
from tollway.config.root import Publisher
from tollway.exceptions import ConfigError
from tollway.secrets import SecretResolver


def _config(**changes: Any) -> dict[str, Any]:
    routes = [
        {"id": "small", "provider": "p", "model": "phys-a", "providerFormat": "openai-chat-completions"},
        {
            "id": "large",
            "provider": "p",
            "model": "phys-b",
            "providerFormat": "openai-chat-completions",
            "priority": 1,
            "contextWindowTokens": 200000,
            "publicModel": "chat-large",
            "capabilities": ["streaming", "assistantPrefill"],
        },
    ]
    model: dict[str, Any] = {"name": "chat", "contextWindowTokens": 8000, "routes": routes, **changes.pop("model", {})}
    return {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "baseUrl": "http://127.0.0.1:9/v1",
                "authMode": "none",
                "providerAccountId": "acct",
                "quotaGroupId": "acct",
            }
        },
        "models": [model],
        **changes,
    }


def _issues(data: dict[str, Any]) -> list[str]:
    return [str(i) for i in validate(parse_config(data))]


def test_the_failover_keys_validate_and_compile() -> None:
    data = _config(
        model={"responseModel": "route", "streamRecovery": "continue"},
        routing={"sameRouteRetries": 2, "maxRetryAfterMs": 8000, "circuitBreaker": {"resetTimeoutMs": 2000}},
    )
    assert _issues(data) == []
    root = Publisher(resolver=SecretResolver(env={})).publish(parse_config(data))
    plan = root.aliases["chat"]
    small, large = plan.groups[0][0], plan.groups[1][0]
    assert (plan.response_model, plan.stream_recovery) == ("route", "continue")
    assert (plan.retry.same_route_retries, plan.retry.max_retry_after_s) == (2, 8.0)
    assert (small.public_model, small.context_window, small.prefill) == ("small", 8000, False)
    assert (large.public_model, large.context_window, large.prefill) == ("chat-large", 200000, True)
    breaker = small.health.policy
    assert (breaker.reset_timeout_s, breaker.max_reset_timeout_s) == (2.0, 10.0), "the cap defaults to 10 s"


def test_the_defaults_keep_the_seeds_rules() -> None:
    cfg = parse_config(_config())
    assert (cfg.models[0].responseModel, cfg.models[0].streamRecovery) == ("alias", "none")
    assert (cfg.routing.sameRouteRetries, cfg.routing.maxRetryAfterMs) == (1, 5000)
    long_reset = _config(routing={"circuitBreaker": {"resetTimeoutMs": 60000}})
    assert _issues(long_reset) == [], "an explicit long first cool-down needs no explicit cap"
    plan = Publisher(resolver=SecretResolver(env={})).publish(parse_config(long_reset)).aliases["chat"]
    assert plan.groups[0][0].health.policy.max_reset_timeout_s == 60.0


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (
            _config(model={"streamRecovery": "continue", "routes": [_config()["models"][0]["routes"][0]]}),
            "streamRecovery",
        ),
        (_config(routing={"circuitBreaker": {"resetTimeoutMs": 9000, "maxResetTimeoutMs": 5000}}), "maxResetTimeoutMs"),
    ],
)
def test_refused_combinations(data: dict[str, Any], path: str) -> None:
    assert any(path in issue for issue in _issues(data))


def test_a_public_model_must_be_a_plain_name() -> None:
    data = _config()
    data["models"][0]["routes"][1]["publicModel"] = "has spaces and <tags>"
    assert any("publicModel" in issue for issue in _issues(data))


@pytest.mark.parametrize(
    "routing",
    [{"sameRouteRetries": -1}, {"sameRouteRetries": 6}, {"maxRetryAfterMs": -1}, {"maxRetryAfterMs": 600001}],
)
def test_bounds(routing: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        parse_config(_config(routing=routing))
