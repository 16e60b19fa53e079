"""The preservation runner end to end: corpus → gateway (tokenizes) → mock model (echoes, alters, drops or
invents placeholders) → gateway (restores exactly) → the runner's rates; and what each unresolved-token
policy makes of the same bad answers."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
import yaml

from tollway.mock.server import MockServerThread
from tollway.pii.conformance import load_corpus, measure
from tollway.server.app import create_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "tw-pii-conformance-key-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MODES = ("echo", "alter", "drop", "invent")
CORPUS = load_corpus()
EMAIL = "jane.doe@example.com"
PROMPT = f"Repeat exactly: write to {EMAIL} today."


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def _config(mock_url: str) -> dict[str, Any]:
    providers: dict[str, Any] = {}
    models: list[dict[str, Any]] = []

    def provider(name: str, kind: str, base: str) -> None:
        providers[name] = {
            "type": kind,
            "baseUrl": base,
            "providerAccountId": f"acct-{name}",
            "quotaGroupId": f"q-{name}",
            "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_PII_CONF_PROVIDER_KEY"}],
        }

    def alias(name: str, prov: str, profile: str, fmt: str) -> None:
        route = {"id": f"r-{name}", "provider": prov, "model": "m", "providerFormat": fmt}
        caps = ["streaming", "tools"] if profile == "masked" else ["tools"]
        models.append({"name": name, "capabilities": caps, "piiProfileId": profile, "routes": [route]})

    for mode in MODES:
        provider(f"openai-{mode}", "openai-compatible", f"{mock_url}/_fault/placeholders={mode}/v1")
        alias(f"masked-{mode}", f"openai-{mode}", "masked", "openai-chat-completions")
        alias(f"strict-{mode}", f"openai-{mode}", "strict", "openai-chat-completions")
    provider("anthropic-echo", "anthropic", f"{mock_url}/_fault/placeholders=echo")
    alias("masked-anthropic-echo", "anthropic-echo", "masked", "anthropic-messages")
    names = [m["name"] for m in models]
    return {
        "providers": providers,
        "models": models,
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": names,
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "pii": {
            "keySecretRef": "env:TOLLWAY_PII_CONF_KEY",
            "profiles": [
                {"id": "masked", "promptEnrichment": True},
                {"id": "strict", "unresolvedTokenPolicy": "reject-buffered", "streaming": False},
            ],
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory, mock: MockServerThread) -> AsyncIterator[httpx.AsyncClient]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOLLWAY_PII_CONF_PROVIDER_KEY", "sk-pii-conformance")
        env.setenv("TOLLWAY_PII_CONF_KEY", "c" * 40)
        path: Path = tmp_path_factory.mktemp("conformance") / "llm-router.yml"
        path.write_text(yaml.safe_dump(_config(mock.base_url)))
        app = create_app(path, watch_interval_s=None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway/v1", headers=AUTH, timeout=30) as c:
            yield c
        await app.state.runtime.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rates(gateway: httpx.AsyncClient, mock: MockServerThread) -> dict[str, dict[str, Any]]:
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    aliases = [f"masked-{mode}" for mode in MODES] + ["masked-anthropic-echo", "strict-alter"]
    results = await measure(gateway, [(a, a) for a in aliases], CORPUS, concurrency=8)
    assert results.corpus == "preservation-v1"
    return {key: orjson.loads(results.to_json())["deployments"][key] for key in results.deployments}


def _counted(result: dict[str, Any]) -> None:
    assert result["cases"] == len(CORPUS.cases)
    assert result["values"] == sum(len(c.values) for c in CORPUS.cases)


@pytest.mark.parametrize("alias", ["masked-echo", "masked-anthropic-echo"])
async def test_a_model_that_copies_placeholders_preserves_every_value(
    rates: dict[str, dict[str, Any]], alias: str
) -> None:
    result = rates[alias]
    _counted(result)
    assert (result["preserved"], result["altered"], result["omitted"], result["hallucinated"]) == (1, 0, 0, 0)
    assert result["failed"] == 0


async def test_a_model_that_drops_them_omits_every_value(rates: dict[str, dict[str, Any]]) -> None:
    result = rates["masked-drop"]
    _counted(result)
    assert (result["preserved"], result["altered"], result["omitted"], result["hallucinated"]) == (0, 0, 1, 0)


async def test_a_model_that_alters_them_alters_every_value(rates: dict[str, dict[str, Any]]) -> None:
    result = rates["masked-alter"]
    assert (result["preserved"], result["altered"], result["omitted"], result["hallucinated"]) == (0, 1, 0, 0)


async def test_a_model_that_invents_one_hallucinates_in_every_answer(rates: dict[str, dict[str, Any]]) -> None:
    result = rates["masked-invent"]
    assert result["preserved"] == 1 and result["hallucinated"] > 0
    assert result["hallucinated"] == 1


async def test_reject_buffered_answers_withheld_count_as_failed_with_nothing_back(
    rates: dict[str, dict[str, Any]],
) -> None:
    result = rates["strict-alter"]
    assert result["omitted"] == 1 and result["preserved"] == 0
    assert result["errors"] == {"502 pii_unresolved": len(CORPUS.cases)}


async def test_the_provider_never_saw_a_corpus_value(rates: dict[str, dict[str, Any]], mock: MockServerThread) -> None:
    echoes = [r.get("echo", "") for r in httpx.get(mock.base_url + "/_mock/requests", timeout=5).json()]
    assert len(echoes) >= len(CORPUS.cases)
    values = {v for case in CORPUS.cases for v in case.values}
    assert not [v for v in values if any(v in e for e in echoes)]


def _ask(stream: bool = False, model: str = "masked-alter") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}


def _without_ids(text: str) -> str:
    return re.sub(r"_[A-Z2-7]{16}_[A-Z2-7]{13}", "_<id>_<mac>", text)


def _streamed_text(body: str) -> str:
    return "".join(
        (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in body.splitlines()
        if line.startswith("data: {")
    )


@pytest.mark.parametrize(("mode", "left"), [("alter", "[TWPII1_email_"), ("invent", "MOCKMOCKMOCKMOCK")])
async def test_leave_masked_leaves_what_it_cannot_restore_buffered_and_streamed(
    gateway: httpx.AsyncClient, mode: str, left: str
) -> None:
    buffered = await gateway.post("chat/completions", json=_ask(model=f"masked-{mode}"))
    assert buffered.status_code == 200, buffered.text
    text = buffered.json()["choices"][0]["message"]["content"]
    assert left in text
    assert (EMAIL in text) == (mode == "invent")
    streamed = await gateway.post("chat/completions", json=_ask(True, f"masked-{mode}"))
    assert streamed.status_code == 200
    assert _without_ids(_streamed_text(streamed.text)) == _without_ids(text)  # each request mints its own


@pytest.mark.parametrize("mode", ["alter", "invent"])
async def test_reject_buffered_refuses_an_answer_it_cannot_restore(gateway: httpx.AsyncClient, mode: str) -> None:
    refused = await gateway.post("chat/completions", json=_ask(model=f"strict-{mode}"))
    assert refused.status_code == 502
    assert refused.json()["error"]["code"] == "pii_unresolved"
    assert "TWPII" not in refused.text and EMAIL not in refused.text
    ok = await gateway.post("chat/completions", json=_ask(model="strict-echo"))
    assert ok.status_code == 200 and EMAIL in ok.json()["choices"][0]["message"]["content"]
