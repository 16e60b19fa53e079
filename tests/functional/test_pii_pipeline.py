"""Reversible PII tokenization through the whole request path, on the real mock provider.

The mock answers by echoing the last user message (or tool result), so whatever placeholders the
gateway sent come back in the answer, and its request log (``echo``) shows what it was sent. Every
client format shares the stage; each is exercised, buffered and streamed, with tool arguments.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.functional.test_audit_gateway import LIMITS
from tollway.audit.events import decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalReader, WalWriter
from tollway.config.schema import TracingConfig
from tollway.mock.server import MockServerThread
from tollway.pii.vault.memory import MemoryPiiVault
from tollway.server.app import create_app
from tollway.telemetry.tracing import Tracer

KEY = "tw-pii-functional-key-0001"
EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
IBAN = "DE89 3704 0044 0532 0130 00"
# The card and IBAN canaries are matched whole, spaced or compact: a short prefix such as "4111" also
# occurs by chance in the hex digests and ids that audit records, spans and logs carry.
CANARIES = (EMAIL, CARD, CARD.replace(" ", ""), IBAN, IBAN.replace(" ", ""))
PROMPT = f"Write to {EMAIL}, charge {CARD}, refund to {IBAN}; cc {EMAIL}."


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def _config(mock_url: str, profile: dict[str, Any]) -> dict[str, Any]:
    provider = {
        "providerAccountId": "acct",
        "quotaGroupId": "acct",
        "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_PII_FN_PROVIDER_KEY"}],
    }
    return {
        "providers": {
            "openai": {"type": "openai-compatible", "baseUrl": mock_url + "/v1", **provider},
            "anthropic": {
                "type": "anthropic",
                "baseUrl": mock_url,
                **provider,
                "providerAccountId": "acct-a",
                "quotaGroupId": "qa",
            },
        },
        "models": [
            {
                "name": "pii-openai",
                "capabilities": ["streaming", "tools"],
                "piiProfileId": "default",
                "routes": [
                    {"id": "o", "provider": "openai", "model": "m", "providerFormat": "openai-chat-completions"}
                ],
            },
            {
                "name": "pii-anthropic",
                "capabilities": ["streaming", "tools"],
                "piiProfileId": "default",
                "routes": [{"id": "a", "provider": "anthropic", "model": "c", "providerFormat": "anthropic-messages"}],
            },
            {
                "name": "plain",
                "routes": [
                    {"id": "p", "provider": "openai", "model": "m", "providerFormat": "openai-chat-completions"}
                ],
            },
        ],
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": ["pii-openai", "pii-anthropic", "plain"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "pii": {"keySecretRef": "env:TOLLWAY_PII_FN_KEY", "profiles": [{"id": "default", **profile}]},
        "telemetry": {"metrics": {"enabled": True, "access": "public"}},
    }


@pytest.fixture
async def make(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_PII_FN_PROVIDER_KEY", "sk-pii-functional")
    monkeypatch.setenv("TOLLWAY_PII_FN_KEY", "k" * 40)
    made: list[Any] = []

    async def build(**profile: Any) -> httpx.AsyncClient:
        path = tmp_path / f"llm-router-{len(made)}.yml"
        path.write_text(yaml.safe_dump(_config(mock.base_url, profile)))
        app = create_app(path, watch_interval_s=None)
        spans = InMemorySpanExporter()
        app.state.runtime.tracer = Tracer.from_config(
            TracingConfig(enabled=True, sampleRatio=1.0), environment="test", exporter=spans, synchronous=True
        )
        writer = WalWriter(tmp_path / f"wal-{len(made)}", instance_id="pii", limits=LIMITS, durable=True)
        writer.open()
        recorder = AuditRecorder(
            writer,
            durable=True,
            terminal_commit=True,
            commit_timeout_s=LIMITS.commit_timeout_s,
            content_mode="metadata-only",
        )
        app.state.runtime.attach_audit(AuditPipeline(recorder=recorder, writer=writer, shipper=None))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=20)
        client.wal = tmp_path / f"wal-{len(made)}"  # type: ignore[attr-defined]
        client.spans = spans  # type: ignore[attr-defined]
        made.append((app, client, writer))
        return client

    yield build
    for app, client, writer in made:
        await client.aclose()
        await asyncio.to_thread(writer.close, 5.0)
        await app.state.runtime.aclose()  # shuts the tracer down too


def sent(mock: MockServerThread) -> list[str]:
    data = httpx.get(mock.base_url + "/_mock/requests", timeout=5).json()
    return [r.get("echo", "") for r in data]


AUTH = {"authorization": f"Bearer {KEY}"}
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def assert_never_sent(mock: MockServerThread) -> None:
    echoes = sent(mock)
    assert echoes and all(not any(c in e for c in CANARIES) for e in echoes), echoes
    assert any("[TWPII1_EMAIL_" in e and "[TWPII1_CARD_" in e and "[TWPII1_IBAN_" in e for e in echoes)


@pytest.mark.parametrize("alias", ["pii-openai", "pii-anthropic"])
async def test_chat_completions_buffered_and_streamed_get_their_values_back(
    make: Any, mock: MockServerThread, alias: str
) -> None:
    client = await make()
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    body = {"model": alias, "messages": [{"role": "user", "content": PROMPT}]}
    buffered = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert buffered.status_code == 200, buffered.text
    assert PROMPT in buffered.json()["choices"][0]["message"]["content"]
    streamed = await client.post("/v1/chat/completions", json={**body, "stream": True}, headers=AUTH)
    text = "".join(
        (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in streamed.text.splitlines()
        if line.startswith("data: {")
    )
    assert PROMPT in text and "TWPII" not in text
    assert_never_sent(mock)


async def test_messages_and_responses_are_tokenized_and_restored_too(make: Any, mock: MockServerThread) -> None:
    client = await make()
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    msg = await client.post(
        "/v1/messages",
        json={"model": "pii-anthropic", "max_tokens": 200, "messages": [{"role": "user", "content": PROMPT}]},
        headers=ANTHROPIC,
    )
    assert msg.status_code == 200, msg.text
    assert PROMPT in msg.json()["content"][0]["text"]
    resp = await client.post(
        "/v1/responses", json={"model": "pii-openai", "input": PROMPT, "stream": True}, headers=AUTH
    )
    done = [orjson.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    completed = next(e for e in done if e["type"] == "response.completed")["response"]
    assert PROMPT in completed["output"][0]["content"][0]["text"]
    deltas = "".join(e["delta"] for e in done if e["type"] == "response.output_text.delta")
    assert PROMPT in deltas and "TWPII" not in deltas
    assert_never_sent(mock)


async def test_tool_arguments_are_tokenized_as_json_values_and_restored(make: Any, mock: MockServerThread) -> None:
    client = await make()
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    args = orjson.dumps({"to": EMAIL, "note": 'say "hi"'}).decode()
    body = {
        "model": "pii-openai",
        "messages": [
            {"role": "user", "content": "mail her"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "send", "arguments": args}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": f"sent to {EMAIL}"},
        ],
    }
    resp = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert f"sent to {EMAIL}" in resp.json()["choices"][0]["message"]["content"]
    assert all(EMAIL not in e for e in sent(mock))


async def test_the_audit_trail_has_the_manifest_and_no_value(make: Any) -> None:
    client = await make()
    body = {"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    events = [decode_event(r.payload) for r in WalReader(client.wal).read(0, 1000, 1 << 22)]  # type: ignore[attr-defined]
    (finished,) = [e.body for e in events if e.kind == "request_finished"]
    pii = finished["pii"]
    assert pii["profile"] == "default" and pii["scope"] == "request"
    assert pii["counts"] == {"email": 2, "card": 1, "iban": 1}
    assert pii["recovery"] == {"exact": 4, "leftMasked": 0, "nearMiss": 0, "omitted": 0}
    assert len(pii["digest"]) == 32
    raw = orjson.dumps([e.body for e in events])
    assert not any(c.encode() in raw for c in CANARIES) and b"TWPII" not in raw


async def test_a_forged_or_foreign_placeholder_is_left_masked(make: Any, mock: MockServerThread) -> None:
    client = await make()
    forged = "[TWPII1_EMAIL_AAAAAAAAAAAAAAAA_AAAAAAAAAAAAA]"
    body = {"model": "pii-openai", "messages": [{"role": "user", "content": f"who is {forged}?"}]}
    resp = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert resp.status_code == 200
    assert forged in resp.json()["choices"][0]["message"]["content"]


async def test_reject_buffered_withholds_an_answer_it_cannot_restore(make: Any) -> None:
    client = await make(unresolvedTokenPolicy="reject-buffered", streaming=False)
    forged = "[TWPII1_EMAIL_AAAAAAAAAAAAAAAA_AAAAAAAAAAAAA]"
    ok = await client.post(
        "/v1/chat/completions",
        json={"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]},
        headers=AUTH,
    )
    assert ok.status_code == 200 and PROMPT in ok.json()["choices"][0]["message"]["content"]
    refused = await client.post(
        "/v1/chat/completions",
        json={"model": "pii-openai", "messages": [{"role": "user", "content": f"who is {forged}?"}]},
        headers=AUTH,
    )
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "pii_unresolved"
    assert forged not in refused.text
    stream = await client.post(
        "/v1/chat/completions",
        json={"model": "pii-openai", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers=AUTH,
    )
    assert stream.status_code == 400 and stream.json()["error"]["param"] == "stream"


async def test_an_alias_without_a_profile_is_untouched(make: Any, mock: MockServerThread) -> None:
    client = await make()
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    body = {"model": "plain", "messages": [{"role": "user", "content": PROMPT}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    assert any(EMAIL in e for e in sent(mock))


async def test_metrics_count_kinds_and_outcomes_without_values(make: Any) -> None:
    client = await make()
    body = {"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    scrape = (await client.get("/metrics")).text
    assert 'tollway_pii_values_total{alias="pii-openai",environment="local",kind="email"} 2.0' in scrape, scrape[-3000:]
    assert 'tollway_pii_recoveries_total{alias="pii-openai",environment="local",outcome="exact"} 4.0' in scrape
    assert not any(c in scrape for c in CANARIES) and "TWPII" not in scrape


class _FailingVault:
    """A vault whose store is down: every insert fails as the DynamoDB vault's would."""

    async def insert(self, entry: Any, value: str) -> None:
        from tollway.pii.vault.base import VaultUnavailable

        raise VaultUnavailable("dynamodb PutItem failed: ServiceUnavailable")

    async def resolve(self, token_id: str, binding: bytes, now: float) -> str | None:
        return None

    async def revoke(self, token_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_a_vault_that_cannot_take_a_mapping_fails_the_request_before_the_provider(
    tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOLLWAY_PII_FN_PROVIDER_KEY", "sk-pii-functional")
    monkeypatch.setenv("TOLLWAY_PII_FN_KEY", "k" * 40)
    cfg = _config(mock.base_url, {"scope": "session"})
    cfg["pii"]["vault"] = {"type": "dynamodb", "table": "unused", "kmsKeyId": "unused"}
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    app = create_app(path, watch_interval_s=None)
    app.state.runtime.pii._vault_factory = _FailingVault
    httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            body = {"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]}
            resp = await client.post("/v1/chat/completions", json=body, headers={**AUTH, "x-tollway-session-id": "s-1"})
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "pii_unavailable"
            assert EMAIL not in resp.text
            plain = {"model": "pii-openai", "messages": [{"role": "user", "content": "no personal data here"}]}
            ok = await client.post("/v1/chat/completions", json=plain, headers={**AUTH, "x-tollway-session-id": "s-1"})
            assert ok.status_code == 200  # nothing to store: nothing to fail
    finally:
        await app.state.runtime.aclose()
    assert sent(mock) == ["no personal data here"]  # the failed request never reached the provider


async def test_traces_hold_no_value_and_no_placeholder(make: Any) -> None:
    client = await make()
    body = {"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    assert (await client.post("/v1/chat/completions", json={**body, "stream": True}, headers=AUTH)).status_code == 200
    spans = client.spans.get_finished_spans()  # type: ignore[attr-defined]
    assert len({s.context.trace_id for s in spans}) == 2, [s.name for s in spans]
    dumped = "".join(
        f"{s.name}{dict(s.attributes or {})}{[(e.name, dict(e.attributes or {})) for e in s.events]}" for s in spans
    )
    assert "pii-openai" in dumped  # the alias is there: the scan reads real span data
    assert not any(c in dumped for c in CANARIES) and "TWPII" not in dumped


class _CountingVault(MemoryPiiVault):
    """The memory vault, counting the inserts that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.inserts = 0

    async def insert(self, entry: Any, value: str) -> None:
        self.inserts += 1
        await super().insert(entry, value)


async def test_a_session_stores_each_value_once_however_many_turns_repeat_it(
    tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOLLWAY_PII_FN_PROVIDER_KEY", "sk-pii-functional")
    monkeypatch.setenv("TOLLWAY_PII_FN_KEY", "k" * 40)
    cfg = _config(mock.base_url, {"scope": "session"})
    cfg["pii"]["vault"] = {"type": "dynamodb", "table": "unused", "kmsKeyId": "unused"}
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    app = create_app(path, watch_interval_s=None)
    vault = _CountingVault()
    app.state.runtime.pii._vault_factory = lambda: vault
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            turns = [{"role": "user", "content": PROMPT}]
            for turn in range(3):  # each turn resends the conversation so far: the same values
                body = {"model": "pii-openai", "messages": turns}
                resp = await client.post(
                    "/v1/chat/completions", json=body, headers={**AUTH, "x-tollway-session-id": "s"}
                )
                assert resp.status_code == 200, resp.text
                turns += [resp.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn}"}]
            stored = len(vault)
            assert stored >= 3 and vault.inserts == stored  # one write per value, none per repeat
            other = await client.post(
                "/v1/chat/completions",
                json={"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]},
                headers={**AUTH, "x-tollway-session-id": "another"},
            )
            assert other.status_code == 200
            assert vault.inserts == 2 * stored  # another session: other ids, stored again
    finally:
        await app.state.runtime.aclose()
