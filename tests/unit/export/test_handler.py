"""The function's handler with memory backends: one export per message, failures reported per message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from functions.dataset_export.handler import ExportDeps, build_handler
from functions.dataset_export.settings import ExportSettings, SettingsError, parse_retention
from tests.unit.export.corpus import BASE_MS, capture
from tollway.audit.store import MemoryAuditStore
from tollway.content import MemoryContentStore
from tollway.export import ExportRequest, MemoryExportAudit, MemoryExportSink, encode_message, manifest_key

DAY_MS = 86_400_000


def sqs_event(*bodies: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": f"m{n}",
                "receiptHandle": f"h{n}",
                "body": body,
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:tollway-exports",
                "awsRegion": "us-east-1",
            }
            for n, body in enumerate(bodies)
        ]
    }


async def test_each_message_is_one_export_and_a_bad_one_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    audit, content = MemoryAuditStore(), MemoryContentStore()
    found, _ = await capture(content, "r1", BASE_MS, purposes=("audit", "training"))
    audit.apply(found)
    sink, notices = MemoryExportSink(), MemoryExportAudit()
    built: list[MemoryContentStore] = []

    def store() -> MemoryContentStore:
        built.append(content)
        return content

    deps = ExportDeps(reader=audit, content=store, sink=sink, audit=notices)
    request = ExportRequest.parse(
        {
            "purpose": "training",
            "sinceMs": BASE_MS,
            "untilMs": BASE_MS + DAY_MS,
            "requestedBy": "alice",
            "approvedBy": "dpo",
        }
    )
    handler = build_handler(lambda: deps)
    response = await _in_thread(handler, sqs_event(encode_message(request), '{"v": 1, "export": {"purpose": "x"}}'))

    assert response == {"batchItemFailures": [{"itemIdentifier": "m1"}]}
    assert manifest_key(request.export_id) in sink.objects
    assert [e.kind for e in notices.events] == ["export_finished"]
    assert built == [content] and content.objects == 0  # one store for the run, closed with it


async def _in_thread(handler: Any, event: dict[str, Any]) -> Any:
    """The handler runs its own event loop (asyncio.run), as on Lambda: not inside the test's."""
    return await asyncio.to_thread(handler, event, None)


def test_settings_come_from_the_stage_environment() -> None:
    env = {
        "TOLLWAY_BUCKET_EXPORTS": "tollway-exports-123-us-east-1",
        "TOLLWAY_BUCKET_CONTENT": "tollway-content-123-us-east-1",
        "TOLLWAY_CONTENT_KMS_KEY_ID": "alias/tollway-content",
        "TOLLWAY_TABLE_AUDIT": "tollway-audit",
        "TOLLWAY_QUEUE_AUDIT": "tollway-audit-events",
        "TOLLWAY_CONTENT_RETENTION_DAYS": "standard=30, short=7",
    }
    settings = ExportSettings.from_env(env)
    assert settings.sink.bucket == "tollway-exports-123-us-east-1"
    assert settings.content.bucket == "tollway-content-123-us-east-1"
    assert settings.audit_store.table == "tollway-audit"
    assert settings.retention_days == (("short", 7), ("standard", 30))
    with pytest.raises(SettingsError, match="TOLLWAY_QUEUE_AUDIT"):
        ExportSettings.from_env({k: v for k, v in env.items() if k != "TOLLWAY_QUEUE_AUDIT"})
    with pytest.raises(SettingsError, match="exports bucket"):
        ExportSettings.from_env({k: v for k, v in env.items() if k != "TOLLWAY_BUCKET_EXPORTS"})


@pytest.mark.parametrize("text", ["standard", "standard=0", "=3", "short=x"])
def test_a_bad_retention_setting_is_refused(text: str) -> None:
    with pytest.raises(SettingsError, match="TOLLWAY_CONTENT_RETENTION_DAYS"):
        parse_retention(text)
