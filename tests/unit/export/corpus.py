"""A source for export tests: requests in the audit store, their content in a content store.

:func:`capture` appends one request's events (admitted, finished, then what became of its content)
through the gateway's own event builders, and puts its content in the store first, so the
reference in ``content_stored`` is exactly the store's. The unit tests use the memory stores;
the local-cloud test the DynamoDB audit store and the S3 content store, with the same helper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final, cast

from tollway.audit import events
from tollway.audit.events import AuditEvent
from tollway.content import ContentMode, ContentRecord, ContentRef, ContentStore

__all__ = ["BASE_MS", "DIGEST", "EMAIL", "capture", "chat_record", "request_events"]

BASE_MS: Final = 1_798_761_600_000
"""2027-01-01T00:00:00Z."""
DIGEST: Final = "sha256:" + "cd" * 32
EMAIL: Final = "[TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]"
"""A placeholder as the provider saw it (its MAC is not checked here)."""


def _at(event: AuditEvent, ts: int) -> AuditEvent:
    return dataclasses.replace(event, ts_ms=ts)


def chat_record(request_id: str, at_ms: int, *, mode: ContentMode = "tokenized-content", **who: str) -> ContentRecord:
    """A chat exchange with a tool round trip and a PII placeholder in the prompt and in a tool argument."""
    return ContentRecord(
        request_id=request_id,
        tenant=who.get("tenant", "acme"),
        principal_id=who.get("principal", "alice"),
        alias=who.get("alias", "chat"),
        operation="chat.completions",
        mode=mode,
        captured_at_ms=at_ms + 10,
        request={
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"Mail {EMAIL} the weather in Paris."},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [{"name": "weather", "parameters": {"type": "object"}}],
        },
        response={
            "content": f"Sent to {EMAIL}: sunny.",
            "tool_calls": [{"id": "c2", "name": "send", "arguments": f'{{"to": "{EMAIL}"}}'}],
            "finish_reason": "stop",
        },
    )


def request_events(
    request_id: str,
    at_ms: int,
    *,
    tenant: str = "acme",
    alias: str = "chat",
    principal: str = "alice",
    outcome: str = "ok",
    mode: str = "tokenized-content",
) -> list[AuditEvent]:
    caller: dict[str, Any] = {"principal_id": principal, "tenant": tenant, "team": None, "key_id": "k-1"}
    admitted = events.request_admitted(
        request_id=request_id,
        root_digest=DIGEST,
        **caller,
        alias=alias,
        stream=False,
        content_mode=cast(Any, mode),
        max_attempts=1,
    )
    finished = events.request_finished(
        request_id=request_id,
        root_digest=DIGEST,
        status=200 if outcome == "ok" else 503,
        outcome=outcome,
        error_code=None,
        attempts=1,
        admission_ms=0.5,
        total_ms=20.0,
        usage=None,
        usage_evidence="unknown",
        cancellation=None,
        **caller,
        alias=alias,
    )
    return [_at(admitted, at_ms), _at(finished, at_ms + 5)]


async def capture(
    store: ContentStore,
    request_id: str,
    at_ms: int,
    *,
    mode: ContentMode = "tokenized-content",
    purposes: Sequence[str] = ("audit",),
    retention_class: str = "standard",
    dropped: bool = False,
    deleted: bool = False,
    store_content: bool = True,
    **who: str,
) -> tuple[list[AuditEvent], ContentRef | None]:
    """One request's events (and its content put in ``store``): ``mode`` ``metadata-only`` stores none,
    ``dropped`` records a drop instead, ``deleted`` deletes the object and records the evidence."""
    found = request_events(request_id, at_ms, mode=mode, **who)
    if mode not in ("tokenized-content", "encrypted-raw"):
        return found, None
    if dropped:
        drop = events.content_dropped(request_id=request_id, root_digest=DIGEST, mode=mode, reason="queue_full")
        return [*found, _at(drop, at_ms + 20)], None
    content_who = {k: v for k, v in who.items() if k in ("tenant", "principal", "alias")}
    record = chat_record(request_id, at_ms, mode=mode, **content_who)
    ref = await store.put(record, retention_class)
    ref = dataclasses.replace(ref, purposes=tuple(purposes))
    found.append(_at(events.content_stored(request_id=request_id, root_digest=DIGEST, ref=ref.to_body()), at_ms + 20))
    if deleted or not store_content:
        existed = await store.delete(ref)
        if deleted:
            evidence = events.content_deleted(
                request_id=request_id, root_digest=DIGEST, deleted_by="dpo", reason="erasure", existed=existed
            )
            found.append(_at(evidence, at_ms + 30))
    return found, ref
