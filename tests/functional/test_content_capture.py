"""Content capture by ``contentMode``, through the whole request path, on the real mock provider.

The mock echoes the last user message, so a PII alias's answer carries the placeholders it was sent
back, for the gateway to restore. The content store is the in-memory one (the S3 store has its own
contract tests on the local cloud); the audit trail is a real WAL, read back here.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.functional.test_audit_gateway import LIMITS
from tollway.audit.events import AuditEvent, decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalReader, WalWriter
from tollway.content import ContentRecord, ContentRef, ContentUnavailable, MemoryContentStore
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-content-functional-key-01"
EMAIL = "jane.doe@example.com"
PROMPT = f"Please write to {EMAIL} about the invoice."
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def _alias(name: str, **extra: Any) -> dict[str, Any]:
    route = {"id": name, "provider": "openai", "model": "m", "providerFormat": "openai-chat-completions"}
    return {"name": name, "capabilities": ["streaming", "tools"], "routes": [route], **extra}


def _config(mock_url: str, tmp: Path) -> dict[str, Any]:
    aliases = [
        _alias("tokenized", piiProfileId="default", contentMode="tokenized-content", contentPurposes=["evaluation"]),
        _alias("raw", piiProfileId="default", contentMode="encrypted-raw"),
        _alias("metadata", contentMode="metadata-only"),
        _alias("off", contentMode="disabled"),
        _alias("unsampled", contentMode="tokenized-content", contentSampleRate=0.0),
        _alias("raw-buffered", piiProfileId="buffered", contentMode="encrypted-raw"),
    ]
    return {
        "providers": {
            "openai": {
                "type": "openai-compatible",
                "baseUrl": mock_url + "/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "acct",
                "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_CONTENT_FN_PROVIDER_KEY"}],
            }
        },
        "models": aliases,
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": [a["name"] for a in aliases],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
        "pii": {
            "keySecretRef": "env:TOLLWAY_CONTENT_FN_PII_KEY",
            "profiles": [{"id": "default"}, {"id": "buffered", "streaming": False}],
        },
        "content": {"store": {"type": "memory"}},
        "audit": {"sink": {"type": "sqs", "queueName": "unused"}, "spool": {"path": str(tmp / "spool")}},
    }


class Gateway:
    def __init__(self, app: Any, client: httpx.AsyncClient, wal: Path) -> None:
        self.app, self.client, self.wal = app, client, wal

    @property
    def store(self) -> MemoryContentStore:
        writer = self.app.state.runtime.content_writer
        assert writer is not None and isinstance(writer.store, MemoryContentStore)
        return writer.store

    async def drain(self) -> None:
        assert await self.app.state.runtime.content_writer.drain(10.0)

    def events(self) -> list[AuditEvent]:
        return [decode_event(r.payload) for r in WalReader(self.wal).read(0, 1000, 1 << 22)]

    async def settled(
        self, request_id: str, kinds: tuple[str, ...] = ("content_stored", "content_dropped")
    ) -> AuditEvent:
        """The first event of ``kinds`` for the request: a stream's stages finish after its last
        byte is sent, so the record may come a moment after the client has the whole answer."""
        deadline = time.monotonic() + 10
        while True:
            await self.drain()
            found = [e for e in self.events() if e.kind in kinds and e.request_id == request_id]
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"no {kinds} for {request_id}"
            await asyncio.sleep(0.01)

    async def stored(self, request_id: str) -> ContentRecord:
        ev = await self.settled(request_id)
        assert ev.kind == "content_stored", ev.body
        ref = ContentRef.from_body(ev.body["content"])
        record = await self.store.get(ref)
        assert record is not None and record.digest() == ref.digest
        return record


@pytest.fixture
async def gateway(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("TOLLWAY_CONTENT_FN_PROVIDER_KEY", "sk-content-functional")
    monkeypatch.setenv("TOLLWAY_CONTENT_FN_PII_KEY", "k" * 40)
    monkeypatch.setenv("TOLLWAY_AUDIT_SHIPPER", "external")
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock.base_url, tmp_path)))
    app = create_app(path, watch_interval_s=None)
    writer = WalWriter(tmp_path / "wal", instance_id="content", limits=LIMITS, durable=True)
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
    try:
        yield Gateway(app, client, tmp_path / "wal")
    finally:
        await client.aclose()
        await app.state.runtime.aclose()
        await asyncio.to_thread(writer.close, 5.0)


async def _chat(gw: Gateway, alias: str, **extra: Any) -> httpx.Response:
    body = {"model": alias, "messages": [{"role": "user", "content": PROMPT}], **extra}
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp


def _request_id(resp: httpx.Response) -> str:
    return resp.headers["x-request-id"]


async def test_tokenized_content_keeps_what_the_provider_saw_and_never_a_value(gateway: Gateway) -> None:
    resp = await _chat(gateway, "tokenized")
    assert EMAIL in resp.json()["choices"][0]["message"]["content"]  # the client got its value back
    record = await gateway.stored(_request_id(resp))
    raw = record.to_json()
    assert EMAIL.encode() not in raw and b"[TWPII1_EMAIL_" in raw
    assert record.mode == "tokenized-content" and record.purposes == ("audit", "evaluation")
    assert record.request["messages"][-1]["role"] == "user"
    assert record.response is not None and "[TWPII1_EMAIL_" in record.response["content"]
    assert record.response["finish_reason"] == "stop"
    wal = orjson.dumps([e.body for e in gateway.events()])
    assert EMAIL.encode() not in wal and b"TWPII" not in wal  # the trail holds the reference only
    (admitted,) = [e for e in gateway.events() if e.kind == "request_admitted"]
    assert admitted.body["contentMode"] == "tokenized-content"


async def test_a_stream_is_captured_as_the_provider_sent_it(gateway: Gateway) -> None:
    resp = await _chat(gateway, "tokenized", stream=True)
    assert EMAIL in resp.text
    record = await gateway.stored(_request_id(resp))
    assert record.response is not None and "[TWPII1_EMAIL_" in record.response["content"]
    assert EMAIL not in record.response["content"]


async def test_encrypted_raw_keeps_what_the_client_sent_and_got_back(gateway: Gateway) -> None:
    resp = await _chat(gateway, "raw")
    record = await gateway.stored(_request_id(resp))
    assert record.request["messages"][-1]["content"] == PROMPT
    assert record.response is not None and EMAIL in record.response["content"]
    assert b"TWPII" not in record.to_json()
    (ev,) = [e for e in gateway.events() if e.kind == "content_stored"]
    assert ev.body["content"]["retentionClass"] == "restricted" and ev.body["content"]["purposes"] == ["audit"]


async def test_metadata_only_and_unsampled_requests_store_no_content(gateway: Gateway) -> None:
    for alias in ("metadata", "unsampled"):
        await gateway.settled(_request_id(await _chat(gateway, alias)), ("request_finished",))
    await gateway.drain()
    assert gateway.store.objects == 0
    kinds = [e.kind for e in gateway.events()]
    assert kinds.count("request_finished") == 2 and "content_stored" not in kinds


async def test_disabled_writes_no_audit_record_at_all(gateway: Gateway) -> None:
    off = await _chat(gateway, "off")
    assert off.json()["choices"][0]["message"]["content"]
    # A request after it, whose record shows the trail is otherwise written (and has caught up).
    after = _request_id(await _chat(gateway, "metadata"))
    await gateway.settled(after, ("request_finished",))
    seen = {e.request_id for e in gateway.events()}
    assert after in seen and _request_id(off) not in seen


class _DownStore(MemoryContentStore):
    async def put(self, record: ContentRecord, retention_class: str) -> ContentRef:
        raise ContentUnavailable("content store memory: PutObject failed: ServiceUnavailable")


async def test_a_store_that_is_down_drops_the_content_and_keeps_the_metadata(gateway: Gateway) -> None:
    writer = gateway.app.state.runtime.content_writer
    writer._store = _DownStore()
    writer._retry_delay_s = 0.0
    resp = await _chat(gateway, "tokenized")
    dropped = await gateway.settled(_request_id(resp))
    assert dropped.kind == "content_dropped"
    assert dropped.body == {"mode": "tokenized-content", "reason": "store_unavailable"}
    assert any(e.kind == "request_finished" and e.request_id == _request_id(resp) for e in gateway.events())


async def test_a_request_refused_before_the_audit_trail_took_it_stores_no_content(gateway: Gateway) -> None:
    # encrypted-raw captures before the PII stage, which refuses a stream for a buffered-only profile:
    # the request never reached the audit trail, so there is no record its content could belong to.
    body = {"model": "raw-buffered", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    refused = await gateway.client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert refused.status_code == 400, refused.text
    after = _request_id(await _chat(gateway, "raw-buffered"))
    stored = await gateway.stored(after)
    assert stored.request["messages"][-1]["content"] == PROMPT
    assert gateway.store.objects == 1  # the buffered request's, and nothing of the refused one
    assert not [e for e in gateway.events() if e.kind.startswith("content_") and e.request_id == _request_id(refused)]
