"""A captured exchange as one dataset row, with the request's transformations applied.

A row is one JSON object per line of a shard (sorted keys)::

    {"requestId": "...", "alias": "...", "tenant": "...", "operation": "...", "mode": "...",
     "capturedAt": <epoch ms>,
     "messages": [{"role": ..., "content": ..., "tool_calls": [...]?, "tool_call_id": ...?}, ...],
     "tools": [...],                       # only when the request had tools and they are kept
     "answer": {"role": "assistant", "content": ..., "tool_calls": [...]?, "finish_reason": ...} | null,
     "contentDigest": "<sha256 of the stored content, ContentRef.digest>",
     "digest": "<sha256 of this row without its digest field>"}

``messages`` is the prompt as the captured request had it; ``answer`` the final answer (``null``
for a request that failed before one). For fine-tuning, append ``answer`` to ``messages``.

- ``toolCalls: drop`` removes the request's ``tools`` (and ``tool_choice``), every ``tool``
  message, and ``tool_calls`` from assistant messages and the answer; an assistant message left
  with no content is removed too.
- ``pii: redact`` replaces every PII placeholder (``[TWPII1_<KIND>_…]``,
  :data:`tollway.pii.placeholders.PLACEHOLDER_RE`) in every string value by ``[REDACTED_<KIND>]``,
  tool arguments included: no token that could be resolved survives. ``keep-tokenized`` leaves
  the placeholders as the provider saw them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from tollway.content.base import ContentRecord
from tollway.export.request import Transformations
from tollway.pii.placeholders import PLACEHOLDER_RE

__all__ = ["drop_tool_calls", "dumps", "redact", "row"]

_TOOL_REQUEST_KEYS = ("tools", "tool_choice", "parallel_tool_calls")


def dumps(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def redact(value: Any) -> Any:
    """``value`` with every PII placeholder in every string (not in keys) replaced by ``[REDACTED_<KIND>]``."""
    if isinstance(value, str):
        return PLACEHOLDER_RE.sub(lambda m: f"[REDACTED_{m.group(1)}]", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _empty(content: Any) -> bool:
    return content is None or content == "" or content == []


def drop_tool_calls(messages: list[Any]) -> list[Any]:
    """``messages`` without tool messages, and without tool calls in the others (emptied ones dropped)."""
    out: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        if message.get("role") == "tool":
            continue
        if "tool_calls" in message:
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            if _empty(message.get("content")):
                continue
        out.append(message)
    return out


def _answer(response: dict[str, Any] | None, keep_tools: bool) -> dict[str, Any] | None:
    if response is None:
        return None
    answer: dict[str, Any] = {
        "role": "assistant",
        "content": response.get("content"),
        "finish_reason": response.get("finish_reason"),
    }
    if keep_tools and response.get("tool_calls"):
        answer["tool_calls"] = response["tool_calls"]
    return answer


def row(record: ContentRecord, content_digest: str, transformations: Transformations) -> dict[str, Any]:
    """The dataset row of ``record`` (the fetched content, checked against ``content_digest``)."""
    keep_tools = transformations.tool_calls == "keep"
    messages = list(record.request.get("messages") or [])
    if not keep_tools:
        messages = drop_tool_calls(messages)
    out: dict[str, Any] = {
        "requestId": record.request_id,
        "alias": record.alias,
        "tenant": record.tenant,
        "operation": record.operation,
        "mode": record.mode,
        "capturedAt": record.captured_at_ms,
        "messages": messages,
        "answer": _answer(record.response, keep_tools),
        "contentDigest": content_digest,
    }
    if keep_tools:
        out |= {k: record.request[k] for k in _TOOL_REQUEST_KEYS if record.request.get(k) is not None}
    if transformations.pii == "redact":
        out = redact(out)
    out["digest"] = hashlib.sha256(dumps(out)).hexdigest()
    return out
