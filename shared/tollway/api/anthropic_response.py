"""Render canonical results in the Anthropic Messages format: the ``message`` object, the named
SSE events of a stream, and the error envelope ``{"type": "error", "error": {"type", "message"}}``.

Stop reasons: ``stop`` → ``end_turn``, ``length`` → ``max_tokens``, ``tool_calls`` →
``tool_use``, ``content_filter`` → ``refusal``. The canonical ``stop`` does not say whether a stop
sequence matched (providers' ``stop_sequence`` decodes to it too), so ``stop_sequence`` is never
reported and ``stop_sequence`` is always ``null``.

Usage: Anthropic's ``input_tokens`` excludes cached tokens while the canonical prompt count
includes them, so ``input_tokens`` is the prompt count less cache reads and cache writes, which
are ``cache_read_input_tokens`` and ``cache_creation_input_tokens``.

Thinking: a buffered message lists its thinking and redacted thinking blocks first, in order,
then its text and tool use, each thinking block with its signature as the provider gave it, so
the client can send it back unchanged. A stream opens a ``thinking`` block at each new thinking
index and sends ``thinking_delta`` and ``signature_delta`` events in it, and a
``redacted_thinking`` block whole in its ``content_block_start``.

Tool input: Anthropic's ``input`` is an object, the canonical arguments a JSON string as the
model produced it. Empty arguments are ``{}``; arguments that are not a JSON object (a model cut
off by ``max_tokens`` mid-call) are kept whole as ``{"_raw": "<arguments>"}`` rather than dropped.
A stream passes argument fragments on verbatim as ``input_json_delta``.

Error types, by the error's code first, then its status:

=======================================  ===========================
``overloaded``, ``model_unavailable``,   ``overloaded_error``
any 529
401                                      ``authentication_error``
403                                      ``permission_error``
404                                      ``not_found_error``
413                                      ``request_too_large``
429                                      ``rate_limit_error``
504                                      ``timeout_error``
other 4xx                                ``invalid_request_error``
other 5xx                                ``api_error``
=======================================  ===========================

The HTTP status is the gateway's own (``overloaded`` stays 503, or 429 under
``admission.overloadStatus``), so SDK retry rules keep working; ``retry-after`` is kept.
"""

from __future__ import annotations

from typing import Any

import orjson

from tollway.canonical import (
    CanonicalResponse,
    FinishReason,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    StreamFinish,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
)
from tollway.exceptions import GatewayError

__all__ = [
    "STOP_REASONS",
    "MessageStream",
    "encode_event",
    "error_body",
    "error_type",
    "message_id",
    "render_message",
    "tool_input",
    "usage_json",
]

STOP_REASONS: dict[FinishReason, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_STATUS_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
}
_OVERLOADED_CODES = frozenset({"overloaded", "model_unavailable"})


def encode_event(name: bytes, payload: bytes) -> bytes:
    """One named SSE event. ``payload`` is serialized JSON, which never holds a line break."""
    return b"event: " + name + b"\ndata: " + payload + b"\n\n"


def message_id(request_id: str) -> str:
    """``msg_`` and the request id's hex, so a message names the request that made it."""
    return "msg_" + request_id.removeprefix("req_")


def usage_json(usage: Usage) -> dict[str, int]:
    read, written = usage.cached_prompt_tokens, usage.cache_creation_tokens
    return {
        "input_tokens": max(0, usage.prompt_tokens - read - written),
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"_raw": arguments}


def _thinking_block(part: ThinkingBlock) -> dict[str, str]:
    if isinstance(part, RedactedThinkingPart):
        return {"type": "redacted_thinking", "data": part.data}
    return {"type": "thinking", "thinking": part.thinking, "signature": part.signature}


def render_message(msg_id: str, model: str, resp: CanonicalResponse) -> bytes:
    content: list[dict[str, Any]] = [_thinking_block(p) for p in resp.thinking] if resp.thinking else []
    content.extend({"type": "text", "text": t} for t in (resp.content, resp.refusal) if t)
    content.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c.arguments)}
        for c in resp.tool_calls or ()
    )
    return orjson.dumps(
        {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": STOP_REASONS.get(resp.finish_reason, "end_turn"),
            "stop_sequence": None,
            "usage": usage_json(resp.usage if resp.usage is not None else Usage()),
        }
    )


def error_type(err: GatewayError) -> str:
    if err.code in _OVERLOADED_CODES or err.status == 529:
        return "overloaded_error"
    known = _STATUS_TYPES.get(err.status)
    if known is not None:
        return known
    return "invalid_request_error" if 400 <= err.status < 500 else "api_error"


def error_body(err: GatewayError) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(err), "message": err.message}})


_PING = encode_event(b"ping", b'{"type":"ping"}')
_MESSAGE_STOP = encode_event(b"message_stop", b'{"type":"message_stop"}')
_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_DELTA = b',"delta":{"type":"text_delta","text":'
_JSON_DELTA = b',"delta":{"type":"input_json_delta","partial_json":'
_TEXT_START = b',"content_block":{"type":"text","text":""}}\n\n'
_THINKING_START = b',"content_block":{"type":"thinking","thinking":"","signature":""}}\n\n'
_THINKING_DELTA = b',"delta":{"type":"thinking_delta","thinking":'
_SIGNATURE_DELTA = b',"delta":{"type":"signature_delta","signature":'
_START_HEAD = b'event: content_block_start\ndata: {"type":"content_block_start","index":'
_STOP_HEAD = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":'


class MessageStream:
    """One stream's events, opened by ``message_start`` and a ``ping`` with its first output.

    Content blocks are numbered across thinking, text and tool use, as Anthropic numbers them: a
    text delta after a tool call opens a new text block, a tool call's first delta opens a
    ``tool_use`` block, a new thinking index a ``thinking`` (or ``redacted_thinking``) block, and
    opening a block closes the one before. The finish is held until
    :meth:`end`, which closes the open block and sends ``message_delta`` with the final usage
    (which corrects ``message_start``'s estimated ``input_tokens``) and ``message_stop``. An
    argument fragment for a tool call whose block was already closed (providers that interleave
    parallel calls) is still sent, under that call's own index, where the SDKs accumulate it.
    """

    __slots__ = ("_calls", "_next", "_open", "_open_text", "_reason", "_start", "_thinking")

    def __init__(self, msg_id: str, model: str, input_tokens: int) -> None:
        message: dict[str, Any] = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        self._start = (
            encode_event(b"message_start", orjson.dumps({"type": "message_start", "message": message})) + _PING
        )
        self._open = -1
        """The index of the open content block; -1 when none is open."""
        self._open_text = False
        self._next = 0
        self._calls: dict[int, int] = {}
        """Canonical tool-call index → content block index."""
        self._thinking: dict[int, int] = {}
        """Canonical thinking index → content block index."""
        self._reason = "end_turn"

    def _prelude(self) -> bytes:
        out, self._start = self._start, b""
        return out

    def _close(self) -> bytes:
        if self._open < 0:
            return b""
        out = _STOP_HEAD + str(self._open).encode() + b"}\n\n"
        self._open, self._open_text = -1, False
        return out

    def _open_block(self) -> tuple[bytes, int]:
        out = self._close()
        index = self._open = self._next
        self._next += 1
        return out, index

    def _text(self, text: str) -> bytes:
        out = self._prelude()
        if not self._open_text:
            closed, index = self._open_block()
            self._open_text = True
            out += closed + _START_HEAD + str(index).encode() + _TEXT_START
        return out + _DELTA_HEAD + str(self._open).encode() + _TEXT_DELTA + orjson.dumps(text) + b"}}\n\n"

    def _tool(self, ev: ToolCallDelta) -> bytes:
        out = self._prelude()
        index = self._calls.get(ev.index)
        if index is None:
            closed, index = self._open_block()
            self._calls[ev.index] = index
            block = {"type": "tool_use", "id": ev.id or "", "name": ev.name or "", "input": {}}
            payload = orjson.dumps({"type": "content_block_start", "index": index, "content_block": block})
            out += closed + encode_event(b"content_block_start", payload)
        if ev.arguments:
            out += _DELTA_HEAD + str(index).encode() + _JSON_DELTA + orjson.dumps(ev.arguments) + b"}}\n\n"
        return out

    def _think(self, ev: ThinkingDelta) -> bytes:
        out = self._prelude()
        index = self._thinking.get(ev.index)
        if index is None:
            closed, index = self._open_block()
            self._thinking[ev.index] = index
            out += closed + _START_HEAD + str(index).encode() + _THINKING_START
        if ev.thinking:
            out += _DELTA_HEAD + str(index).encode() + _THINKING_DELTA + orjson.dumps(ev.thinking) + b"}}\n\n"
        if ev.signature:
            out += _DELTA_HEAD + str(index).encode() + _SIGNATURE_DELTA + orjson.dumps(ev.signature) + b"}}\n\n"
        return out

    def _redacted(self, ev: RedactedThinking) -> bytes:
        out = self._prelude()
        if ev.index in self._thinking:
            return out
        closed, index = self._open_block()
        self._thinking[ev.index] = index
        block = {"type": "redacted_thinking", "data": ev.data}
        payload = orjson.dumps({"type": "content_block_start", "index": index, "content_block": block})
        return out + closed + encode_event(b"content_block_start", payload)

    def event(self, ev: StreamEvent) -> bytes:
        kind = type(ev)
        if kind is TextDelta:
            text = ev.text  # type: ignore[union-attr]
            return self._text(text) if text else b""
        if kind is ToolCallDelta:
            return self._tool(ev)  # type: ignore[arg-type]
        if kind is ThinkingDelta:
            return self._think(ev)  # type: ignore[arg-type]
        if kind is RedactedThinking:
            return self._redacted(ev)  # type: ignore[arg-type]
        if kind is StreamFinish:
            self._reason = STOP_REASONS.get(ev.reason, "end_turn")  # type: ignore[union-attr]
        return b""

    def end(self, usage: Usage) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._reason, "stop_sequence": None},
            "usage": usage_json(usage),
        }
        out = self._prelude() + self._close()
        return out + encode_event(b"message_delta", orjson.dumps(delta)) + _MESSAGE_STOP

    def error(self, err: GatewayError) -> bytes:
        """The ``error`` event alone. Stateless: the pipeline renders its lifetime frame up front."""
        return encode_event(b"error", error_body(err))
