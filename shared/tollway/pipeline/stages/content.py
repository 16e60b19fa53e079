"""Content capture as a stage: an alias's ``contentMode`` keeps the exchange, off the request path.

Where the stage sits decides what it sees (``tollway.pipeline.compile``): for ``tokenized-content``
it comes after the PII stage, so its ``before`` sees the request the provider will see and its
``after`` and transform see the answer before the PII stage restores it (placeholders, never
values); for ``encrypted-raw`` it comes before the PII stage, so it sees what the client sent and
what the client gets back. It keeps references only, and builds the record in ``finish``: a chat-
format snapshot of the messages and tools, and the final answer (a stream's text and tool calls,
accumulated up to ``max_record_bytes``, past which the content is dropped as ``too_large``).

``finish`` hands the record to the :class:`~tollway.content.ContentWriter`, which encrypts and
stores it in the background; the writer's callbacks append ``content_stored`` (the object's
reference) or ``content_dropped`` (why not) to the audit WAL. A request not sampled
(``contentSampleRate``) costs one CRC of its id.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    ImagePart,
    Message,
    StreamEvent,
    StreamFinish,
    TextDelta,
    TextPart,
    ToolCallDelta,
)
from tollway.content.base import ContentRecord
from tollway.content.writer import ContentWriter
from tollway.pipeline.stage import BaseStage, Call, StreamTransform

__all__ = ["Capture", "ContentStage", "chat_messages"]


def _part(part: object) -> dict[str, Any] | None:
    if type(part) is TextPart:
        return {"type": "text", "text": part.text}
    if type(part) is ImagePart:
        return {"type": "image_url", "image_url": {"url": part.url}}
    return None  # thinking blocks: the provider's signed reasoning, not the exchange


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    content = m.content
    if isinstance(content, str) or content is None:
        out["content"] = content
    else:
        out["content"] = [p for p in map(_part, content) if p is not None]
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def chat_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Canonical messages in the Chat Completions shape evaluation and fine-tuning sets use."""
    return [_message(m) for m in messages]


class Capture:
    """One sampled request's references, and a stream's answer as it goes by."""

    __slots__ = ("finish", "messages", "size", "text", "too_large", "tools")

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.text: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.size = 0
        self.too_large = False
        self.finish: str | None = None


class _Accumulate:
    """The stream transform: passes every event on unchanged, keeping a bounded copy of the answer."""

    __slots__ = ("_capture", "_limit")

    def __init__(self, capture: Capture, limit: int) -> None:
        self._capture = capture
        self._limit = limit

    def feed(self, ev: StreamEvent) -> Iterable[StreamEvent]:
        capture = self._capture
        kind = type(ev)
        if kind is TextDelta:
            self._add(ev.text)  # type: ignore[union-attr]
            if not capture.too_large:
                capture.text.append(ev.text)  # type: ignore[union-attr]
        elif kind is ToolCallDelta:
            delta: ToolCallDelta = ev  # type: ignore[assignment]
            self._add(delta.arguments)
            if not capture.too_large:
                call = capture.tools.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                if delta.id:
                    call["id"] = delta.id
                if delta.name:
                    call["name"] = delta.name
                call["arguments"] += delta.arguments
        elif kind is StreamFinish:
            capture.finish = ev.reason  # type: ignore[union-attr]
        return (ev,)

    def _add(self, text: str) -> None:
        capture = self._capture
        capture.size += len(text)
        if capture.size > self._limit:
            capture.too_large = True
            capture.text.clear()
            capture.tools.clear()

    def flush(self) -> list[StreamEvent]:
        return []


class ContentStage(BaseStage):
    """One per process per placement (before or after the PII stage); the writer is shared."""

    name = "content"
    __slots__ = ("_writer",)

    def __init__(self, writer: ContentWriter) -> None:
        self._writer = writer

    async def before(self, call: Call) -> None:
        plan, req = call.alias, call.request
        assert plan is not None and plan.content is not None
        if isinstance(req, CanonicalRequest) and plan.content.sampled(call.request_id):
            call.capture = Capture(req.messages)  # the list the PII stage replaces, never mutates

    async def after(self, call: Call, response: CanonicalResponse) -> None:
        capture = call.capture
        if capture is None:
            return
        capture.finish = response.finish_reason
        if response.content:
            capture.text.append(response.content)
        for i, c in enumerate(response.tool_calls or ()):
            capture.tools[i] = {"id": c.id, "name": c.name, "arguments": c.arguments}

    def transform(self, call: Call) -> StreamTransform | None:
        capture = call.capture
        plan = call.alias
        if capture is None or plan is None or plan.content is None:
            return None
        return _Accumulate(capture, plan.content.max_record_bytes)

    async def finish(self, call: Call) -> None:
        capture, plan, req, principal = call.capture, call.alias, call.request, call.principal
        if capture is None or plan is None or plan.content is None or principal is None:
            return
        call.capture = None
        if not call.admitted_at:
            return  # refused before the audit trail took it (a later stage's 4xx/5xx): nothing to reference it
        policy = plan.content
        request: dict[str, Any] = {"messages": chat_messages(capture.messages)}
        if isinstance(req, CanonicalRequest) and req.tools:
            request["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in req.tools
            ]
        response: dict[str, Any] | None = None
        if capture.finish is not None or capture.text or capture.tools:
            response = {
                "content": "".join(capture.text) or None,
                "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for _, c in sorted(capture.tools.items())
                ]
                or None,
                "finish_reason": capture.finish,
                "status": call.status,
            }
        record = ContentRecord(
            request_id=call.request_id,
            tenant=principal.tenant,
            principal_id=principal.id,
            alias=plan.name,
            operation=call.operation,
            mode=policy.mode,  # type: ignore[arg-type]
            captured_at_ms=int(time.time() * 1000),
            request=request,
            response=response,
            purposes=policy.purposes,
        )
        if capture.too_large:
            self._writer.drop(record, "too_large")
            return
        self._writer.submit(record, policy.retention_class)
