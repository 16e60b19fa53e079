"""``POST /v1/messages/count_tokens`` in the audit trail: recorded, labelled a local estimate, never charged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_audit_gateway import KEY, LIMITS, Harness, _harness, config_path, mock
from tollway.audit.events import decode_event
from tollway.audit.wal import WalReader
from tollway.metering.record import usage_record

__all__ = ["config_path", "mock"]  # fixtures, used by name


@pytest.fixture
async def durable(config_path: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    async for h in _harness(config_path, tmp_path, durable=True, limits=LIMITS):
        yield h


async def _events(tmp_path: Path, kind: str, count: int) -> list[Any]:
    async with asyncio.timeout(10):
        while True:
            found = [decode_event(r.payload) for r in WalReader(tmp_path / "wal").read(0, 1000, 1 << 22)]
            if len([e for e in found if e.kind == kind]) >= count:
                return found
            await asyncio.sleep(0.01)


async def test_count_tokens_is_recorded_as_a_local_estimate_with_no_usage(durable: Harness, tmp_path: Path) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    body = {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "count these words please"}]}
    counted = await durable.client.post("/v1/messages/count_tokens", json=body, headers=headers)
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    refused = await durable.client.post(
        "/v1/messages/count_tokens", json={**body, "model": "no-such-model"}, headers=headers
    )
    assert refused.status_code == 404

    events = await _events(tmp_path, "request_rejected", 1)
    by_kind = {e.kind: e for e in events if e.request_id == counted.headers["x-request-id"]}
    assert by_kind["request_admitted"].body["operation"] == "messages.count_tokens"
    finished = by_kind["request_finished"]
    assert finished.body["usageEvidence"] == "local-estimate"
    assert finished.body["usage"] is None and finished.body["cost"] is None
    assert finished.body["attempts"] == 0 and finished.body["status"] == 200
    record = usage_record(finished)
    assert record is not None and not record.has_usage  # the reconciler accounts no tokens for it
    (rejected,) = [e for e in events if e.kind == "request_rejected"]
    assert rejected.request_id == refused.headers["x-request-id"]
    assert rejected.body["operation"] == "messages.count_tokens" and rejected.body["status"] == 404
    assert not [e for e in events if e.kind == "attempt_started"]
