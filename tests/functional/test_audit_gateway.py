"""The gateway's audit contract at the request path, with a real WAL on a fault-injecting file system.

- Under ``local-durable`` no provider sees a request before its ``attempt_started`` record is at
  or below the durable watermark.
- A commit timeout, an fdatasync failure, a read-only or full volume, and a killed writer each
  fail the request before dispatch with 503 ``audit_unavailable``, and release its permits.

The app is the real one (``create_app``) serving through ASGI in this process; the provider is
the real mock on its own thread, whose request log shows whether anything was dispatched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.unit.audit.test_wal_fs import Fault, FaultFs, WriterKilled, os_error
from tollway.audit.events import decode_event
from tollway.audit.pipeline import AuditPipeline
from tollway.audit.recorder import AuditRecorder
from tollway.audit.wal import WalLimits, WalReader, WalWriter
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-audit-functional-key"
LIMITS = WalLimits(
    max_bytes=1024 * 1024,
    segment_bytes=256 * 1024,
    max_record_bytes=16 * 1024,
    max_batch_records=64,
    max_batch_bytes=256 * 1024,
    max_commit_delay_s=0.001,
    commit_timeout_s=2.0,
)
BODY = {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as m:
        yield m


@pytest.fixture
def config_path(mock: MockServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOLLWAY_AUDIT_FN_PROVIDER_KEY", "sk-functional")
    cfg = {
        "providers": {
            "mock": {
                "type": "openai-compatible",
                "baseUrl": mock.base_url + "/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "acct",
                "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_AUDIT_FN_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "chat-fast-v1",
                "routes": [{"id": "r", "provider": "mock", "model": "m", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            {
                "id": "p",
                "tenant": "t",
                "allowedModels": ["chat-fast-v1"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def provider_requests(mock: MockServerThread) -> int:
    data = httpx.get(mock.base_url + "/_mock/requests", timeout=5).json()
    return len(data["requests"] if isinstance(data, dict) else data)


class Harness:
    def __init__(self, app: Any, writer: WalWriter, fs: FaultFs, client: httpx.AsyncClient) -> None:
        self.app, self.writer, self.fs, self.client = app, writer, fs, client

    @property
    def in_flight(self) -> tuple[int, int]:
        adm = self.app.state.runtime.admission
        return adm.requests, adm.streams

    async def chat(self, **extra: Any) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions", json={**BODY, **extra}, headers={"authorization": f"Bearer {KEY}"}
        )


async def _harness(config_path: Path, tmp_path: Path, *, durable: bool, limits: WalLimits) -> AsyncIterator[Harness]:
    app = create_app(config_path, watch_interval_s=None)
    fs = FaultFs()
    writer = WalWriter(tmp_path / "wal", instance_id="functional", limits=limits, durable=durable, fs=fs)
    writer.open()
    recorder = AuditRecorder(
        writer,
        durable=durable,
        terminal_commit=True,
        commit_timeout_s=limits.commit_timeout_s,
        content_mode="metadata-only",
    )
    runtime = app.state.runtime
    runtime.attach_audit(AuditPipeline(recorder=recorder, writer=writer, shipper=None))
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield Harness(app, writer, fs, client)
    finally:
        await asyncio.to_thread(writer.close, 5.0)
        await runtime.aclose()


@pytest.fixture
async def durable(config_path: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    async for h in _harness(config_path, tmp_path, durable=True, limits=LIMITS):
        yield h


async def test_no_provider_sees_a_request_before_its_start_event_is_durable(
    durable: Harness, mock: MockServerThread, tmp_path: Path
) -> None:
    before = provider_requests(mock)
    gate = threading.Event()
    fsync = durable.fs.add(Fault("fdatasync", gate=gate))
    task = asyncio.ensure_future(durable.chat())
    try:
        assert await asyncio.to_thread(fsync.entered.wait, 5), "the writer never reached fdatasync"
        await asyncio.sleep(0.3)  # ample time for a dispatch that did not wait
        assert not task.done()
        assert provider_requests(mock) == before, "the provider saw the request before its start event was durable"
    finally:
        gate.set()
    resp = await task
    assert resp.status_code == 200
    assert provider_requests(mock) == before + 1
    # The durable log holds the request's events in order, attempt_started before anything upstream.
    kinds = [decode_event(r.payload).kind for r in WalReader(tmp_path / "wal").read(0, 100, 1 << 20)]
    assert kinds[:2] == ["request_admitted", "attempt_started"]
    assert kinds[-1] == "request_finished"  # committed before the buffered response (terminalCommitBeforeResponse)


@pytest.mark.parametrize(
    ("name", "fault"),
    [
        ("fdatasync-eio", Fault("fdatasync", error=os_error(errno.EIO))),
        ("volume-full", Fault("write", error=os_error(errno.ENOSPC))),
        ("read-only-volume", Fault("write", error=os_error(errno.EROFS))),
        ("writer-killed", Fault("write", error=WriterKilled(), partial=True)),
    ],
)
async def test_wal_failures_fail_before_dispatch_and_release_permits(
    durable: Harness, mock: MockServerThread, name: str, fault: Fault
) -> None:
    before = provider_requests(mock)
    durable.fs.add(fault)
    resp = await durable.chat()
    assert resp.status_code == 503, (name, resp.text)
    assert resp.json()["error"]["code"] == "audit_unavailable"
    assert provider_requests(mock) == before, f"{name}: a request was dispatched although its start was not durable"
    assert durable.in_flight == (0, 0)
    # The writer stays unavailable until a restart recovers it: the next request fails fast too.
    again = await durable.chat(stream=True)
    assert again.status_code == 503
    assert provider_requests(mock) == before
    assert durable.in_flight == (0, 0)


async def test_commit_timeout_fails_before_dispatch(config_path: Path, tmp_path: Path, mock: MockServerThread) -> None:
    async for h in _harness(
        config_path, tmp_path, durable=True, limits=dataclasses.replace(LIMITS, commit_timeout_s=0.3)
    ):
        gate = threading.Event()
        h.fs.add(Fault("fdatasync", gate=gate))
        before = provider_requests(mock)
        try:
            resp = await h.chat()
        finally:
            gate.set()
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "audit_unavailable"
        assert provider_requests(mock) == before
        assert h.in_flight == (0, 0)


async def test_a_full_wal_sheds_before_dispatch_under_bounded_async(
    config_path: Path, tmp_path: Path, mock: MockServerThread
) -> None:
    tiny = dataclasses.replace(
        LIMITS, max_bytes=8 * 1024, segment_bytes=4 * 1024, max_record_bytes=1024, max_batch_bytes=4 * 1024
    )
    async for h in _harness(config_path, tmp_path, durable=False, limits=tiny):
        gate = threading.Event()
        h.fs.add(Fault("write", gate=gate))  # the disk stalls: nothing is written, the WAL fills
        before = provider_requests(mock)
        statuses: list[int] = []
        try:
            for _ in range(40):
                resp = await h.chat()
                statuses.append(resp.status_code)
                if resp.status_code == 503:
                    break
        finally:
            gate.set()
        assert statuses[-1] == 503, statuses
        dispatched = provider_requests(mock) - before
        assert dispatched == statuses.count(200), "a refused request reached the provider"
        assert h.in_flight == (0, 0)
