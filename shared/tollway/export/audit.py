"""The export job's own audit record: an ``export_finished`` event, on the audit queue.

The job sends it after its manifest is stored, in the message format the gateway's WAL shipper
uses (``{"v": 1, "events": [<event>]}``, :mod:`tollway.audit.messages`), so the audit writer
stores it as the request item ``REQ#<exportId>`` with ``operation: dataset.export``: who asked,
who approved, for which purpose, and the manifest's key, digest and counts (never content).

The event id is derived from the export id and the manifest digest: a repeated run (a redelivered
queue message) sends the same event, which the audit store applies once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Any, Final, Protocol

from tollway.audit.events import AuditEvent, export_finished
from tollway.audit.ship.sinks import MESSAGE_HEAD, SqsSink
from tollway.export.errors import ExportUnavailable

__all__ = [
    "AUDIT_QUEUE_ENV",
    "ExportAudit",
    "MemoryExportAudit",
    "SqsExportAudit",
    "audit_message",
    "finished_event",
    "name_based_event_id",
]

AUDIT_QUEUE_ENV: Final = "TOLLWAY_QUEUE_AUDIT"


class ExportAudit(Protocol):
    def send(self, event: AuditEvent) -> None:
        """Put ``event`` on the audit queue, or raise :class:`ExportUnavailable`."""
        ...


def name_based_event_id(*parts: str) -> str:
    """A UUID (RFC 9562 version 8) derived from ``parts``: an event sent again for the same thing
    (a redelivered export, a retried deletion) has the same id, which the audit store applies once."""
    h = bytearray(hashlib.sha256("\n".join(parts).encode()).digest()[:16])
    h[6] = 0x80 | (h[6] & 0x0F)  # RFC 9562 version 8: custom, name-based
    h[8] = 0x80 | (h[8] & 0x3F)
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def finished_event(manifest: Mapping[str, Any], key: str) -> AuditEvent:
    """The ``export_finished`` event of a stored manifest (its summary, not its shard list).

    An export job runs under no published configuration, so the event's root digest is the
    manifest's own digest.
    """
    digest = str(manifest["digest"])
    source = manifest["source"]
    summary = {
        "key": key,
        "digest": digest,
        "format": manifest["format"],
        "records": manifest["records"],
        "shards": len(manifest["shards"]),
        "exclusions": dict(manifest["exclusions"]),
        "sinceMs": source["sinceMs"],
        "untilMs": source["untilMs"],
    }
    event = export_finished(
        export_id=str(manifest["exportId"]),
        root_digest=digest,
        requested_by=str(manifest["requestedBy"]),
        approved_by=str(manifest["approvals"][0]["approvedBy"]),
        purpose=str(manifest["purpose"]),
        manifest=summary,
    )
    return dataclasses.replace(event, event_id=name_based_event_id("export_finished", event.request_id, digest))


def audit_message(event: AuditEvent) -> bytes:
    """One audit queue message holding ``event``, byte for byte as the shipper frames it."""
    return MESSAGE_HEAD + event.encode() + b"]}"


class MemoryExportAudit:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def send(self, event: AuditEvent) -> None:
        self.events.append(event)


class SqsExportAudit:
    """The audit queue (by name, ``TOLLWAY_QUEUE_AUDIT``), through the shipper's own SQS sink."""

    def __init__(self, sink: SqsSink) -> None:
        self.sink = sink

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SqsExportAudit:
        env = os.environ if environ is None else environ
        name = env.get(AUDIT_QUEUE_ENV, "").strip()
        if not name:
            raise ExportUnavailable(f"{AUDIT_QUEUE_ENV} is not set: it names the audit queue")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        region = env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip()
        return cls(SqsSink(name, endpoint, region, env))

    def send(self, event: AuditEvent) -> None:
        from tollway.audit.ship.sinks import SinkUnavailable

        try:
            self.sink.send([audit_message(event)])
        except SinkUnavailable as exc:
            raise ExportUnavailable(str(exc)) from None
