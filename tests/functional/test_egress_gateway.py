"""A provider behind an enterprise proxy, through the real app: ``proxyUrl``, its credentials from
an ``env:`` secret, and a ``caBundle`` the provider's certificate is verified against."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.connect_proxy import ConnectProxy
from tests.support.tls_upstream import ThrowawayCa, TlsFront
from tollway.mock import MockServer
from tollway.server.app import create_app

KEY = "tw-egress-key-0001"
PROXY_CREDENTIALS = "egress-user:egress-pa55"
BASIC = "Basic " + base64.b64encode(PROXY_CREDENTIALS.encode()).decode()


@pytest.mark.parametrize("client", ["h1", "aiohttp", "httpx"])
async def test_a_request_reaches_the_provider_through_the_authenticated_proxy(
    client: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOLLWAY_EGRESS_PROVIDER_KEY", "sk-egress-provider")
    monkeypatch.setenv("TOLLWAY_EGRESS_PROXY", PROXY_CREDENTIALS)
    ca = ThrowawayCa.create(tmp_path)
    async with (
        MockServer() as mock,
        TlsFront(ca, mock.base_url) as front,
        ConnectProxy(require=BASIC) as proxy,
    ):
        cfg = {
            "httpClient": client,
            "providers": {
                "corp": {
                    "type": "openai-compatible",
                    "baseUrl": f"{front.base_url}/v1",
                    "providerAccountId": "acct",
                    "quotaGroupId": "acct",
                    "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_EGRESS_PROVIDER_KEY"}],
                    "proxyUrl": proxy.url,
                    "proxyCredentialsSecretRef": "env:TOLLWAY_EGRESS_PROXY",
                    "caBundle": ca.bundle.name,
                    "connectTimeoutMs": 2000,
                    "requestTimeoutMs": 5000,
                }
            },
            "models": [
                {
                    "name": "chat",
                    "routes": [
                        {
                            "id": "r",
                            "provider": "corp",
                            "model": "m-egress",
                            "providerFormat": "openai-chat-completions",
                        }
                    ],
                }
            ],
            "principals": [
                {
                    "id": "user",
                    "tenant": "acme",
                    "allowedModels": ["chat"],
                    "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
                }
            ],
        }
        path = tmp_path / "llm-router.yml"
        path.write_text(yaml.safe_dump(cfg))
        app = create_app(path, watch_interval_s=None)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as gateway:
            try:
                resp = await gateway.post(
                    "/v1/chat/completions",
                    json={"model": "chat", "messages": [{"role": "user", "content": "through the proxy"}]},
                    headers={"authorization": f"Bearer {KEY}"},
                    timeout=10,
                )
            finally:
                await app.state.runtime.aclose()
    assert resp.status_code == 200, resp.text
    assert "through the proxy" in resp.json()["choices"][0]["message"]["content"]
    assert proxy.targets == [f"127.0.0.1:{front.port}"]
    assert proxy.authorizations == [BASIC]
    assert [r["model"] for r in mock.app.requests] == ["m-egress"]
