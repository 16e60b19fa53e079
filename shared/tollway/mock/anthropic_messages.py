"""The Anthropic Messages wire format, as the mock speaks it.

Two Anthropic features are played deterministically, from the request alone:

- **Extended thinking.** With ``thinking: {"type": "enabled", "budget_tokens": N}`` (N ≥ 1024)
  the answer opens with a thinking block (:func:`tollway.mock.content.thinking`), streamed as
  ``thinking_delta`` and ``signature_delta`` events. A ``thinking`` block sent back in an assistant
  turn must carry the signature of its text, as Anthropic checks it, or the request is a 400.
- **Prompt caching.** The mock keeps no cache: it reports what a warm cache would for a
  conversation whose earlier request set the second-to-last breakpoint. The prompt up to the
  second-to-last ``cache_control`` block is read (``cache_read_input_tokens``), from there to the
  last one written (``cache_creation_input_tokens``); with one breakpoint, everything up to it is
  written. Sizes are characters of text (system, text and tool-result text; tools count none) ÷ 4,
  rounded up, and ``input_tokens`` is the rest of the prompt tokens.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

import orjson

from tollway.mock.content import (
    MockRequest,
    ToolReply,
    ToolSpec,
    content_text,
    pick_tool,
    thinking,
    thinking_signature,
)
from tollway.mock.wire import Reply, RequestError, StreamPlan

__all__ = ["AnthropicMessages"]

_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'
_MESSAGE_STOP: Final = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_MIN_THINKING_BUDGET: Final = 1024
_TOOL_ID: Final = re.compile(r"[a-zA-Z0-9_-]+")


def _block_frames(index: int) -> tuple[bytes, bytes, bytes, bytes]:
    """The static frames of content block ``index``: text start, text delta and tool-input delta
    prefixes, and its stop."""
    head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":' % index
    return (
        b"event: content_block_start\n"
        b'data: {"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}\n\n' % index,
        head + b'{"type":"text_delta","text":',
        head + b'{"type":"input_json_delta","partial_json":',
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n' % index,
    )


_FRAMES: Final = (_block_frames(0), _block_frames(1))
"""By the index of the answer's block: 0, or 1 after a thinking block."""


def _error_type(status: int) -> str:
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(block, dict) and block.get("type") == "tool_result" for block in content)
    )


def _frame(event: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + event + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _thinking_enabled(raw: Any) -> bool:
    if not isinstance(raw, dict) or raw.get("type") != "enabled":
        return False
    budget = raw.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < _MIN_THINKING_BUDGET:
        raise RequestError(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {_MIN_THINKING_BUDGET}",
            "thinking",
        )
    return True


def _check_signatures(messages: list[dict[str, Any]]) -> None:
    """Refuse a thinking block whose signature is not the one the mock gave its text."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "thinking":
                continue
            text, signature = block.get("thinking"), block.get("signature")
            if not isinstance(text, str) or signature != thinking_signature(text):
                raise RequestError(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block", "messages")


def _check_tool_ids(messages: list[dict[str, Any]]) -> None:
    """Refuse, as Anthropic does, a ``tool_use`` id or ``tool_use_id`` outside ``[a-zA-Z0-9_-]``, a
    ``tool_use`` the next message does not answer, and a ``tool_result`` for no call of the turn before."""
    asked: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        answered: list[str] = []
        for j, block in enumerate(blocks):
            kind = block.get("type")
            field = "id" if kind == "tool_use" else "tool_use_id" if kind == "tool_result" else None
            if field is None:
                continue
            value = str(block.get(field))
            if not _TOOL_ID.fullmatch(value):
                raise RequestError(
                    f"messages.{i}.content.{j}.{kind}.{field}: String should match pattern '^[a-zA-Z0-9_-]+$'",
                    "messages",
                )
            if kind == "tool_result":
                if value not in asked:
                    raise RequestError(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {value}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                        "messages",
                    )
                answered.append(value)
        unanswered = [u for u in asked if u not in answered]
        if unanswered:
            raise RequestError(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(unanswered)}. Each `tool_use` block must have a corresponding `tool_result` block "
                "in the next message.",
                "messages",
            )
        asked = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]


def _block_chars(block: Any) -> int:
    if not isinstance(block, dict):
        return 0
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return len(text) if isinstance(text, str) else 0
    if kind == "tool_result":
        return len(content_text(block.get("content")))
    return 0


def _breakpoints(body: dict[str, Any], messages: list[dict[str, Any]]) -> list[int]:
    """The prompt's length in characters at each ``cache_control`` block, in prompt order."""
    marks: list[int] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        marks.extend(0 for t in tools if isinstance(t, dict) and t.get("cache_control") is not None)
    chars = 0
    system = body.get("system")
    for content in (system, *(m.get("content") for m in messages)):
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for block in content:
                chars += _block_chars(block)
                if isinstance(block, dict) and block.get("cache_control") is not None:
                    marks.append(chars)
    return marks


def _cache_tokens(body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(read, written) prompt tokens, as the module docstring tells."""
    marks = _breakpoints(body, messages)
    if not marks:
        return 0, 0
    read = math.ceil(marks[-2] / 4) if len(marks) > 1 else 0
    return read, math.ceil(marks[-1] / 4) - read


class AnthropicMessages:
    name = "anthropic"
    request_id_header = b"request-id"
    malformed_frame = b"event: content_block_delta\ndata: {not json\n\n"
    terminal_frame = _MESSAGE_STOP

    def parse(self, body: dict[str, Any]) -> MockRequest:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("model: Field required", "model")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise RequestError("max_tokens: Field required", "max_tokens")
        if max_tokens < 1:
            raise RequestError("max_tokens: Input should be greater than or equal to 1", "max_tokens")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages: at least one message is required", "messages")
        texts = [content_text(m.get("content")) for m in messages]
        echo = next((texts[i] for i in reversed(range(len(messages))) if messages[i].get("role") == "user"), "")
        req = MockRequest(
            model=model,
            stream=body.get("stream") is True,
            message_count=len(messages),
            echo=echo,
            prompt_chars=sum(map(len, texts)) + len(content_text(body.get("system"))),
            max_tokens=max_tokens,
            tool=self._tool(body, messages[-1]),
            thinking=_thinking_enabled(body.get("thinking")),
        )
        if len(messages) > 1:
            _check_signatures(messages)
            _check_tool_ids(messages)
        read, written = _cache_tokens(body, messages)
        if read or written:
            req.cache_read_tokens, req.cache_creation_tokens = read, min(written, req.prompt_tokens - read)
        return req

    @staticmethod
    def _tool(body: dict[str, Any], last: dict[str, Any]) -> ToolSpec | None:
        tools = body.get("tools")
        choice = body.get("tool_choice")
        kind = choice.get("type") if isinstance(choice, dict) else None
        if not isinstance(tools, list) or not tools or kind == "none" or _has_tool_result(last):
            return None
        forced = choice.get("name") if isinstance(choice, dict) and kind == "tool" else None
        tool = pick_tool(tools, forced if isinstance(forced, str) else None, "input_schema")
        if tool is None:
            raise RequestError(f"tool_choice names a tool that is not in tools: {forced!r}", "tool_choice")
        return tool

    def authorized(self, bearer: bool, api_key: bool) -> bool:
        return api_key

    def error(self, status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": error_type or _error_type(status), "message": message}})

    def midstream_error(self, error_type: str | None) -> bytes:
        error = {"type": error_type or "overloaded_error", "message": "Overloaded"}
        return _frame(b"error", {"type": "error", "error": error})

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes:
        content: list[dict[str, Any]] = []
        output_tokens = reply.completion_tokens
        if req.thinking:
            thought = thinking(req.echo)
            content.append({"type": "thinking", "thinking": thought.text, "signature": thought.signature})
            output_tokens += thought.tokens
        if isinstance(reply, ToolReply):
            arguments = orjson.Fragment(reply.arguments)
            content.append({"type": "tool_use", "id": f"toolu_mock{seq:016d}", "name": reply.name, "input": arguments})
            stop = "tool_use"
        else:
            content.append({"type": "text", "text": reply.text})
            stop = "max_tokens" if reply.truncated else "end_turn"
        return orjson.dumps(
            {
                "id": f"msg_mock{seq:016d}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": _usage(req, output_tokens),
            }
        )

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan:
        message: dict[str, Any] = {
            "id": f"msg_mock{seq:016d}",
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(req, 1),
        }
        start = _frame(b"message_start", {"type": "message_start", "message": message})
        output_tokens = reply.completion_tokens
        index = 0
        if req.thinking:
            thought = thinking(req.echo)
            start += _thinking_frames(thought.deltas, thought.signature)
            output_tokens += thought.tokens
            index = 1
        text_start, text_delta, json_delta, block_stop = _FRAMES[index]
        if isinstance(reply, ToolReply):
            block = {"type": "tool_use", "id": f"toolu_mock{seq:016d}", "name": reply.name, "input": {}}
            block_start = _frame(
                b"content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
            )
            deltas = [json_delta + orjson.dumps(fragment) + b"}}\n\n" for fragment in reply.fragments]
            stop = "tool_use"
        else:
            block_start = text_start
            deltas = [text_delta + orjson.dumps(piece) + b"}}\n\n" for piece in reply.deltas]
            stop = "max_tokens" if reply.truncated else "end_turn"
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
        tail = block_stop + _frame(b"message_delta", message_delta) + _MESSAGE_STOP
        return StreamPlan(start + block_start + _PING, deltas, tail)


def _thinking_frames(deltas: tuple[str, ...], signature: str) -> bytes:
    """Content block 0: a thinking block's start, its ``thinking_delta``s, its ``signature_delta`` and stop."""
    block = {"type": "thinking", "thinking": "", "signature": ""}
    out = _frame(b"content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
    for piece in deltas:
        delta = {"type": "thinking_delta", "thinking": piece}
        out += _frame(b"content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    delta = {"type": "signature_delta", "signature": signature}
    out += _frame(b"content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    return out + _FRAMES[0][3]


def _usage(req: MockRequest, output_tokens: int) -> dict[str, int]:
    read, written = req.cache_read_tokens, req.cache_creation_tokens
    return {
        "input_tokens": req.prompt_tokens - read - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }
