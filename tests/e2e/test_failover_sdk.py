"""Failover conduct through the official ``openai`` SDK: a real gateway process, the real mock.

Each alias puts one provider fault in front of a client: a stream that ends without ``[DONE]``,
one undecodable event, a cut, a stall, a recovered cut, a fallback answer under
``responseModel: route``, refusals that keep their meaning.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.e2e.conftest import mock_requests
from tests.support.processes import Gateway, Proc, new_key, start_gateway

pytestmark = pytest.mark.e2e

PROVIDER_KEY_ENV = "TOLLWAY_E2E_FAILOVER_KEY"


def _provider(mock_url: str, account: str, spec: str, kind: str = "openai-compatible") -> dict[str, Any]:
    base = f"{mock_url}/_fault/{spec}" if spec else mock_url
    return {
        "type": kind,
        "baseUrl": base if kind == "anthropic" else base + "/v1",
        "providerAccountId": account,
        "quotaGroupId": account,
        "credentials": [{"id": account, "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
        "connectTimeoutMs": 1000,
        "requestTimeoutMs": 10000,
    }


def _route(rid: str, provider: str, priority: int = 0, **extra: Any) -> dict[str, Any]:
    fmt = "anthropic-messages" if provider.startswith("claude") else "openai-chat-completions"
    return {
        "id": rid,
        "provider": provider,
        "model": f"phys-{rid}",
        "providerFormat": fmt,
        "priority": priority,
        **extra,
    }


def _config(mock_url: str, digest: str) -> dict[str, Any]:
    faults = {
        "nodone": "no_done=1",
        "claude-nodone": "no_done=1",
        "skip": "malformed=3,chunks=6",
        "cut": "abort_after=2,chunks=6",
        "stall": "stall_at=2,stall_ms=30000,chunks=6",
        "toolskip": "malformed=2,chunks=4",
        "down": "status=503",
        "filter": "status=400,error_type=content_filter",
        "small": "context_window=40",
        "noprefill": "no_prefill=1",
        "ok": "",
    }
    providers = {
        name: _provider(
            mock_url, f"acct-{name}", spec, "anthropic" if name.startswith("claude") else "openai-compatible"
        )
        for name, spec in faults.items()
    }
    prefill = {"capabilities": ["streaming", "assistantPrefill"]}
    models = [
        {"name": "nodone", "routes": [_route("nodone", "nodone")]},
        {"name": "claude-nodone", "routes": [_route("claude-nodone", "claude-nodone")]},
        {"name": "skip", "routes": [_route("skip", "skip")]},
        {"name": "cut", "routes": [_route("cut", "cut"), _route("cut-never", "ok", 1)]},
        {"name": "stall", "routes": [_route("stall", "stall")]},
        {"name": "toolskip", "capabilities": ["streaming", "tools"], "routes": [_route("toolskip", "toolskip")]},
        {
            "name": "recover",
            "streamRecovery": "continue",
            "routes": [
                _route("rec-primary", "cut"),
                _route("rec-no-prefill", "noprefill", 1),
                _route("rec-prefill", "ok", 2, **prefill),
            ],
        },
        {
            "name": "by-route",
            "responseModel": "route",
            "routes": [_route("primary", "down"), _route("backup", "ok", 1, publicModel="by-route-backup")],
        },
        {"name": "filtered", "routes": [_route("filtered", "filter"), _route("filtered-never", "ok", 1)]},
        {
            "name": "window",
            "routes": [
                _route("window-small", "small", contextWindowTokens=40),
                _route("window-large", "ok", 1, contextWindowTokens=100000),
            ],
        },
    ]
    return {
        "requestTimeoutMs": 20000,
        "streamIdleTimeoutMs": 1000,
        "providers": providers,
        "models": models,
        "routing": {"maxAttempts": 3, "baseBackoffMs": 10, "maxBackoffMs": 50},
        "principals": [
            {
                "id": "client",
                "tenant": "acme",
                "allowedModels": [m["name"] for m in models],
                "keys": [{"id": "client-key", "sha256": digest}],
            }
        ],
    }


@pytest.fixture(scope="module")
def gateway(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    key, digest = new_key()
    path: Path = tmp_path_factory.mktemp("failover") / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock_provider.url, digest)))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-e2e-failover-provider-key"})
    gw.keys = {"client": key}
    yield gw
    gw.proc.stop()


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.keys["client"], max_retries=0, timeout=20) as c:
        yield c


WORDS = "one two three four five six"
FULL = f"Mock reply #6: {WORDS}"


def _stream(client: openai.OpenAI, model: str, **extra: Any) -> list[Any]:
    messages = extra.pop("messages", [{"role": "user", "content": WORDS}])
    return list(client.chat.completions.create(model=model, messages=messages, stream=True, **extra))


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("alias", ["nodone", "claude-nodone"])
def test_a_stream_ending_after_its_finish_without_done_completes_with_its_usage(
    client: openai.OpenAI, alias: str
) -> None:
    chunks = _stream(client, alias, stream_options={"include_usage": True})
    assert _text(chunks) == FULL
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9, "the provider's own count, not an estimate"


def test_one_undecodable_event_is_skipped_and_the_stream_completes(client: openai.OpenAI) -> None:
    chunks = _stream(client, "skip")
    text = _text(chunks)
    assert text != FULL and FULL.startswith(text[:5]), "one delta is missing, the rest arrived"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


@pytest.mark.parametrize(("alias", "code"), [("cut", "upstream_stream_cut"), ("stall", "upstream_stream_stalled")])
def test_a_failure_after_the_first_token_names_what_happened(
    client: openai.OpenAI, mock_provider: Proc, alias: str, code: str
) -> None:
    received: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": WORDS}], stream=True
        ):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received), "output had started"
    assert info.value.code == code
    assert not [r for r in mock_requests(mock_provider) if r.get("model") == "phys-cut-never"], "no fallback"


def test_an_undecodable_event_inside_a_tool_call_is_a_malformed_stream(client: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.APIError) as info:
        _stream(client, "toolskip", tools=[tool])
    assert info.value.code == "upstream_stream_malformed"


def test_stream_recovery_continues_without_repeating_text(client: openai.OpenAI, mock_provider: Proc) -> None:
    chunks = _stream(client, "recover")
    assert _text(chunks) == FULL
    assert len({c.id for c in chunks}) == 1 and {c.model for c in chunks} == {"recover"}
    reached = [r for r in mock_requests(mock_provider) if str(r.get("model", "")).startswith("phys-rec-")]
    assert [r["model"] for r in reached][-2:] == ["phys-rec-primary", "phys-rec-prefill"]
    assert reached[-1]["messages"] == 2, "the continuation carried the text so far as an assistant prefill"
    assert "phys-rec-no-prefill" not in [r["model"] for r in reached]


def test_response_model_route_tells_a_fallback_answer_apart(client: openai.OpenAI) -> None:
    chunks = _stream(client, "by-route")
    assert {c.model for c in chunks} == {"by-route-backup"}
    buffered = client.chat.completions.create(model="by-route", messages=[{"role": "user", "content": "hi"}])
    assert buffered.model == "by-route-backup"


def test_a_content_filter_refusal_is_a_400_content_filter(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="filtered", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "content_filter"


def test_a_context_length_refusal_falls_back_to_a_larger_window(client: openai.OpenAI) -> None:
    long = " ".join(["word"] * 200)
    chunks = _stream(client, "window", messages=[{"role": "user", "content": long}])
    assert _text(chunks).startswith("Mock reply #64: word")
