"""What the HTTP handler writes to the audit trail for refusals, and when a durable stream says ``[DONE]``.

- An authenticated request refused before admission (400, 403, 404, 413, 415, 429) leaves one
  ``request_rejected`` event with its status, code, principal and the alias when known, and no
  content; an unauthenticated 401 is only counted.
- Under ``local-durable`` with ``terminalCommitBeforeDone``, ``data: [DONE]`` leaves only once the
  request's ``request_finished`` is durable; without it, ``[DONE]`` goes first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.inprocess import chat_scope
from tests.functional.test_audit_gateway import KEY, LIMITS, Harness, _harness, config_path, mock
from tollway.audit.events import decode_event
from tollway.audit.wal import WalReader

__all__ = ["config_path", "mock"]  # fixtures, used by name


@pytest.fixture
async def durable(config_path: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    async for h in _harness(config_path, tmp_path, durable=True, limits=LIMITS):
        yield h


def events(tmp_path: Path) -> list[Any]:
    return [decode_event(r.payload) for r in WalReader(tmp_path / "wal").read(0, 1000, 1 << 22)]


async def wait_for_kind(tmp_path: Path, kind: str, count: int) -> list[Any]:
    async with asyncio.timeout(10):
        while True:
            found = [e for e in events(tmp_path) if e.kind == kind]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.01)


async def test_refusals_after_authentication_leave_a_request_rejected_event(durable: Harness, tmp_path: Path) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    c = durable.client
    answers = [
        await c.post("/v1/chat/completions", json={"model": "chat-secret-v9", "messages": []}, headers=auth),
        await durable.chat(temperature=7),
        await c.post("/v1/chat/completions", content=b"{nope", headers={**auth, "content-type": "application/json"}),
        await c.post("/v1/chat/completions", content=b"{}", headers={**auth, "content-type": "text/plain"}),
        await c.post("/v1/chat/completions", json={"model": "chat-fast-v1"}, headers={"authorization": "Bearer x"}),
    ]
    assert [a.status_code for a in answers] == [404, 400, 400, 415, 401]
    rejected = await wait_for_kind(tmp_path, "request_rejected", 4)
    assert len(rejected) == 4
    assert [e.request_id for e in rejected] == [a.headers["x-request-id"] for a in answers[:4]]
    bodies = [orjson.loads(orjson.dumps(e.body)) for e in rejected]
    assert [(b["status"], b["errorCode"]) for b in bodies] == [
        (404, "model_not_found"),
        (400, "invalid_request"),
        (400, "invalid_request"),
        (415, "unsupported_media_type"),
    ]
    assert bodies[1]["alias"] == "chat-fast-v1"
    assert bodies[0].get("alias") is None  # the name the caller typed is not a known alias
    text = orjson.dumps(bodies)
    assert b"chat-secret-v9" not in text and b"nope" not in text
    assert all(b["principalId"] == "p" for b in bodies)
    assert not [e for e in events(tmp_path) if e.kind == "request_admitted"]
    health = (await c.get("/healthz")).json()
    assert health["unauthenticated"] == 1


async def _stream_with_done_probe(durable: Harness, tmp_path: Path) -> list[str]:
    """Run one stream through the ASGI app; at the ``[DONE]`` write, note what the durable WAL holds."""
    app = durable.app
    body = orjson.dumps({"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    scope = chat_scope([(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")])
    sent_body = False
    done_seen: list[str] = []
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and b"[DONE]" in message.get("body", b""):
            durable_seq = durable.writer.durable_watermark
            records = WalReader(tmp_path / "wal").read(0, 1000, 1 << 22)
            done_seen.extend(decode_event(r.payload).kind for r in records if r.sequence <= durable_seq)

    await app(scope, receive, send)
    return done_seen


async def test_done_waits_for_the_durable_terminal_event_when_asked(durable: Harness, tmp_path: Path) -> None:
    durable.app.state.runtime.pipeline.hold_done = True  # audit.terminalCommitBeforeDone under local-durable
    at_done = await _stream_with_done_probe(durable, tmp_path)
    assert at_done[0] == "request_admitted" and at_done[-1] == "request_finished"


async def test_done_goes_first_by_default(durable: Harness, tmp_path: Path) -> None:
    durable.app.state.runtime.pipeline.hold_done = False  # the default
    at_done = await _stream_with_done_probe(durable, tmp_path)
    assert "request_admitted" in at_done and "request_finished" not in at_done
    await wait_for_kind(tmp_path, "request_finished", 1)
