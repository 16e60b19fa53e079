"""Decoding ``streamGenerateContent?alt=sse``: every ``data:`` is a whole ``GenerateContentResponse``
holding the parts generated since the previous one.

Text arrives in pieces; a function call arrives whole, in one part, so it becomes the call's opening
delta (id and name) and one delta with all its arguments. ``usageMetadata`` is cumulative and may
come with any chunk: the last one is reported once the stream ends. There is no ``[DONE]``: a stream
is complete when it ends after a candidate's ``finishReason``, and truncated when it ends before.
An error is a chunk of the error envelope.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from tollway.canonical import (
    SKIPPED,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    ToolCallDelta,
)
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.providers.gemini.response import (
    blocked,
    candidate,
    classify,
    decode_call,
    error_fields,
    finish_reason,
    usage,
)
from tollway.providers.openai_chat import describe, load_object, malformed, status_category, str_or_none, truncated
from tollway.wire import SseEvent

__all__ = ["decode_stream"]


async def decode_stream(events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]:
    """One chunk that does not decode, after one that did, is reported as ``SKIPPED``; before
    any did, the stream fails as malformed. A prompt blocked by the first chunk fails the attempt."""
    state = _StreamState()
    started = False
    async for sse in events:
        try:
            doc = load_object(sse.data, status=None, what="stream chunk")
        except UpstreamError:
            if not started:
                raise
            yield SKIPPED
            continue
        if doc.get("error") is not None:
            raise _stream_error(doc)
        refusal = blocked(doc, None)
        if refusal is not None:
            raise refusal
        if not started:
            started = True
            state.response_id = str_or_none(doc.get("responseId"))
            yield StreamStart(state.response_id)
        for event in state.apply(doc):
            yield event
    if not state.finished:
        raise truncated("stream ended before its finishReason")
    if state.usage is not None:
        yield StreamUsage(usage(state.usage))


class _StreamState:
    """What a stream has told so far: its id, the calls made, whether it finished, the last usage."""

    __slots__ = ("calls", "finished", "response_id", "usage")

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.calls = 0
        self.finished = False
        self.usage: Mapping[str, Any] | None = None

    def apply(self, doc: Mapping[str, Any]) -> list[StreamEvent]:
        raw_usage = doc.get("usageMetadata")
        if isinstance(raw_usage, dict):
            self.usage = raw_usage
        cand = candidate(doc)
        if cand is None:
            return []
        out: list[StreamEvent] = []
        content = cand.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                raise malformed("a content part is not an object")
            if "functionCall" in part:
                call = decode_call(
                    part["functionCall"], self.calls, self.response_id, None, part.get("thoughtSignature")
                )
                out.append(ToolCallDelta(self.calls, id=call.id, name=call.name))
                out.append(ToolCallDelta(self.calls, arguments=call.arguments))
                self.calls += 1
                continue
            text = part.get("text")
            if isinstance(text, str) and text and part.get("thought") is not True:
                out.append(TextDelta(text))
        reason = finish_reason(cand.get("finishReason"), self.calls > 0)
        if reason is not None and not self.finished:
            self.finished = True
            out.append(StreamFinish(reason))
        return out


def _stream_error(doc: Mapping[str, Any]) -> UpstreamError:
    fields = error_fields(doc)
    info = fields[0] if fields is not None else None
    err = doc.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 0
    category = status_category(status) if status else UpstreamCategory.SERVER
    category, reason = classify(category, info, b"")
    return UpstreamError(category, detail="stream error " + describe(info, b""), reason=reason, reported=True)
