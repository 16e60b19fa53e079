"""An e2e gateway on a test config whose routes point at the real mock provider process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import Gateway, Proc, new_key, start_gateway

PROVIDER_KEY_ENV = "TOLLWAY_E2E_PROVIDER_KEY"
PII_KEY_ENV = "TOLLWAY_E2E_PII_KEY"


def _provider(ptype: str, base: str, account: str) -> dict[str, object]:
    return {
        "type": ptype,
        "baseUrl": base,
        "providerAccountId": account,
        "quotaGroupId": account + "-default",
        "credentials": [{"id": account + "-key", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
        "connectTimeoutMs": 1000,
        "requestTimeoutMs": 10000,
    }


def build_config(mock_url: str, keys: dict[str, str], *, pii: bool = False) -> dict[str, object]:
    """Aliases for every e2e scenario; ``keys`` maps principal id to key digest. ``pii`` adds the PII
    aliases, whose placeholder key the gateway reads from ``$TOLLWAY_E2E_PII_KEY``."""
    all_caps = ["streaming", "tools", "vision", "json_object", "json_schema"]
    anthropic_caps = ["streaming", "tools", "vision"]
    fault = mock_url + "/_fault/{spec}"
    providers = {
        "openai-ok": _provider("openai-compatible", mock_url + "/v1", "acct-openai"),
        "anthropic-ok": _provider("anthropic", mock_url, "acct-anthropic"),
        "openai-503": _provider("openai-compatible", fault.format(spec="status=503") + "/v1", "acct-openai-503"),
        "openai-midstream": _provider(
            "openai-compatible", fault.format(spec="abort_after=2,chunks=6") + "/v1", "acct-openai-mid"
        ),
        "openai-secondary": _provider("openai-compatible", mock_url + "/_fault/words=3/v1", "acct-openai-second"),
        "openai-slow": _provider(
            "openai-compatible", fault.format(spec="chunk_gap_ms=1000,chunks=10") + "/v1", "acct-openai-slow"
        ),
        "openai-delay": _provider("openai-compatible", fault.format(spec="delay_ms=3000") + "/v1", "acct-openai-delay"),
        "openai-ttft": _provider("openai-compatible", fault.format(spec="ttft_ms=3000") + "/v1", "acct-openai-ttft"),
        "openai-400": _provider("openai-compatible", fault.format(spec="status=400") + "/v1", "acct-openai-400"),
    }

    def route(rid: str, provider: str, fmt: str = "openai-chat-completions", priority: int = 0) -> dict[str, object]:
        return {"id": rid, "provider": provider, "model": f"phys-{rid}", "providerFormat": fmt, "priority": priority}

    models: list[dict[str, Any]] = [
        {"name": "chat-fast-v1", "capabilities": all_caps, "routes": [route("fast", "openai-ok")]},
        {
            "name": "chat-claude-v1",
            "capabilities": anthropic_caps,
            "routes": [route("claude", "anthropic-ok", "anthropic-messages")],
        },
        {
            "name": "chat-fallback-v1",
            "capabilities": anthropic_caps,
            "routes": [
                route("fb-primary", "openai-503"),
                route("fb-secondary", "anthropic-ok", "anthropic-messages", priority=1),
            ],
        },
        {
            "name": "chat-midstream-v1",
            "capabilities": anthropic_caps,
            "routes": [
                route("mid-primary", "openai-midstream"),
                route("mid-secondary", "openai-secondary", priority=1),
            ],
        },
        {
            "name": "chat-badrequest-v1",
            "capabilities": anthropic_caps,
            "routes": [route("bad-primary", "openai-400"), route("bad-secondary", "openai-secondary", priority=1)],
        },
        {"name": "chat-delay-v1", "capabilities": all_caps, "routes": [route("delay", "openai-delay")]},
        {"name": "chat-ttft-v1", "capabilities": all_caps, "routes": [route("ttft", "openai-ttft")]},
        {"name": "chat-slow-v1", "capabilities": all_caps, "routes": [route("slow", "openai-slow")]},
        {"name": "chat-hidden-v1", "capabilities": all_caps, "routes": [route("hidden", "openai-ok")]},
        {
            "name": "embed-v1",
            "operations": ["embeddings"],
            "maxEmbeddingInputs": 8,
            "maxInputTokens": 512,
            "routes": [route("embed", "openai-ok")],
        },
        {
            "name": "embed-fallback-v1",
            "operations": ["embeddings"],
            "routes": [route("embed-fb-primary", "openai-503"), route("embed-fb-secondary", "openai-ok", priority=1)],
        },
    ]
    if pii:
        models += [
            {
                "name": "pii-openai-v1",
                "capabilities": ["streaming", "tools"],
                "piiProfileId": "e2e-request",
                "routes": [route("pii-openai", "openai-ok")],
            },
            {
                "name": "pii-claude-v1",
                "capabilities": ["streaming", "tools"],
                "piiProfileId": "e2e-request",
                "routes": [route("pii-claude", "anthropic-ok", "anthropic-messages")],
            },
        ]
    visible = [m["name"] for m in models if m["name"] != "chat-hidden-v1"]
    return {
        "maxRequestBodyBytes": 65536,
        "requestTimeoutMs": 20000,
        "providers": providers,
        "models": models,
        "routing": {
            "maxAttempts": 3,
            "baseBackoffMs": 10,
            "maxBackoffMs": 50,
            "circuitBreaker": {"failureThreshold": 1000, "resetTimeoutMs": 1000, "halfOpenRequests": 1},
        },
        **(
            {
                "pii": {
                    "keySecretRef": f"env:{PII_KEY_ENV}",
                    "profiles": [{"id": "e2e-request", "detectors": ["email", "card", "iban", "phone"]}],
                }
            }
            if pii
            else {}
        ),
        "principals": [
            {
                "id": "team-a",
                "tenant": "acme",
                "allowedModels": visible,
                "keys": [{"id": "team-a-key", "sha256": keys["team-a"]}],
            },
            {
                "id": "team-b",
                "tenant": "acme",
                "allowedModels": ["chat-hidden-v1"],
                "keys": [{"id": "team-b-key", "sha256": keys["team-b"]}],
            },
        ],
    }


@pytest.fixture(scope="session")
def gateway(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    key_a, digest_a = new_key()
    key_b, digest_b = new_key()
    config_path: Path = tmp_path_factory.mktemp("gw") / "llm-router.yml"
    config_path.write_text(
        yaml.safe_dump(build_config(mock_provider.url, {"team-a": digest_a, "team-b": digest_b}, pii=True))
    )
    gw = start_gateway(
        config_path,
        {PROVIDER_KEY_ENV: "sk-e2e-provider-credential-do-not-leak", PII_KEY_ENV: "e2e-pii-key-" + "k" * 32},
    )
    gw.keys = {"team-a": key_a, "team-b": key_b}
    yield gw
    gw.proc.stop()


def mock_requests(mock: Proc) -> list[dict[str, object]]:
    resp = httpx.get(mock.url + "/_mock/requests", timeout=5)
    resp.raise_for_status()
    data = resp.json()
    return list(data["requests"] if isinstance(data, dict) else data)
