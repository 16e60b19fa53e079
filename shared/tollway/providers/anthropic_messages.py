"""Codec for the Anthropic Messages API (``anthropic-version: 2023-06-01``).

The canonical request is shaped after OpenAI's, so encoding reshapes it: system and
developer messages become the top-level ``system`` string, tool results become
``tool_result`` blocks of a user turn, and consecutive turns of the same role merge because
Anthropic requires user and assistant turns to alternate.

What only Anthropic understands is written where the client put it: a ``cache_control``
breakpoint on a system, text, image, ``tool_use`` or ``tool_result`` block or a tool (``system``
is then sent as blocks, one per canonical part, so the breakpoint keeps its place), thinking and
redacted thinking blocks in assistant turns (unchanged, signature included), ``thinking`` with
its budget, and the ``anthropic-beta`` header.

In a stream, Anthropic numbers content blocks across text, thinking and tool use alike; OpenAI's
tool-call ``index`` (and so the canonical one) counts tool calls only, and the canonical thinking
``index`` counts thinking blocks only. The stream decoder maps one to the other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import orjson

from tollway.canonical import (
    SKIPPED,
    CacheControl,
    CanonicalRequest,
    CanonicalResponse,
    ContentPart,
    FinishReason,
    ImagePart,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingBlock,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers.base import ProviderFormat, Target
from tollway.providers.openai_chat import (
    ErrorInfo,
    as_int,
    client_reason,
    describe,
    error_fields,
    error_info,
    load_object,
    malformed,
    refine_category,
    retry_after,
    status_category,
    str_or_none,
    tool_arguments,
    truncated,
)
from tollway.providers.tool_ids import anthropic_tool_id
from tollway.wire import SseEvent, UpstreamRequest

__all__ = ["AnthropicMessagesCodec"]

ANTHROPIC_VERSION = "2023-06-01"
_HEADERS: Mapping[str, str] = MappingProxyType(
    {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
)

_FINISH: Mapping[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

_TOOL_CHOICE = {"auto": "auto", "required": "any", "function": "tool", "none": "none"}

_ERROR_TYPES: Mapping[str, UpstreamCategory] = {
    "invalid_request_error": UpstreamCategory.INVALID_REQUEST,
    "request_too_large": UpstreamCategory.INVALID_REQUEST,
    "authentication_error": UpstreamCategory.AUTHENTICATION,
    "permission_error": UpstreamCategory.PERMISSION,
    "billing_error": UpstreamCategory.PERMISSION,
    "not_found_error": UpstreamCategory.NOT_FOUND,
    "rate_limit_error": UpstreamCategory.RATE_LIMIT,
    "timeout_error": UpstreamCategory.TIMEOUT,
    "api_error": UpstreamCategory.SERVER,
    "overloaded_error": UpstreamCategory.OVERLOADED,
}


class AnthropicMessagesCodec:
    """``POST v1/messages`` relative to a base URL such as ``https://api.anthropic.com``.

    ``req.extensions`` are not forwarded: they are OpenAI-format fields. The only header a request
    adds to the fixed ones is ``anthropic-beta``, from the front end's allowlist; the transport
    adds the base URL and the credential.
    """

    format: ClassVar[ProviderFormat] = ProviderFormat.ANTHROPIC_MESSAGES
    framing: ClassVar[Literal["sse"]] = "sse"

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest:
        if req.response_format is not None and req.response_format.type != "text":
            raise UnsupportedParameter(
                f"response_format {req.response_format.type} is not supported by this model.", param="response_format"
            )
        system, messages = _conversation(req.messages)
        max_tokens = req.max_output_tokens
        body: dict[str, Any] = {
            "model": target.model,
            "max_tokens": max_tokens if max_tokens is not None else target.default_max_output_tokens,
        }
        if system:
            body["system"] = system
        body["messages"] = messages
        optional: dict[str, Any] = {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "stop_sequences": req.stop,
            "metadata": {"user_id": req.user} if req.user is not None else None,
        }
        body.update((k, v) for k, v in optional.items() if v is not None)
        if req.tools:
            body["tools"] = [_tool(t) for t in req.tools]
            choice = _tool_choice(req.tool_choice, req.parallel_tool_calls)
            if choice is not None:
                body["tool_choice"] = choice
        if req.thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": req.thinking_budget}
        if req.stream:
            body["stream"] = True
        headers = _HEADERS
        if req.anthropic_beta:
            headers = {**_HEADERS, "anthropic-beta": ",".join(req.anthropic_beta)}
        return UpstreamRequest(path="v1/messages", body=orjson.dumps(body), headers=headers, stream=req.stream)

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse:
        doc = load_object(body, status=status, what="response")
        blocks = doc.get("content")
        if not isinstance(blocks, list):
            raise malformed("response has no content list", status=status)
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[ThinkingBlock] = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    raise malformed("text block has no text", status=status)
                texts.append(text)
            elif kind == "tool_use":
                calls.append(_decode_tool_use(block, status))
            elif kind == "thinking" or kind == "redacted_thinking":
                thinking.append(_decode_thinking(block, status))
        stop = doc.get("stop_reason")
        raw_usage = doc.get("usage")
        return CanonicalResponse(
            content="".join(texts) if texts or not calls else None,
            tool_calls=calls or None,
            finish_reason=_FINISH.get(stop, "stop") if isinstance(stop, str) else "stop",
            usage=_usage(raw_usage) if isinstance(raw_usage, dict) else None,
            provider_response_id=str_or_none(doc.get("id")),
            thinking=thinking or None,
        )

    async def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]:
        """Complete at ``message_stop``, or when the stream ends after ``message_delta`` gave its
        stop reason (the usage counted so far is reported); ending before that is a truncation.
        One event that does not decode, after one that did, is reported as ``SKIPPED``."""
        state = _StreamState()
        started = False
        async for sse in events:
            try:
                doc = load_object(sse.data, status=None, what="stream event")
            except UpstreamError:
                if not started:
                    raise
                yield SKIPPED
                continue
            kind = doc.get("type")
            kind = kind if isinstance(kind, str) else sse.event
            if kind == "error":
                raise _stream_error(doc)
            if not started:
                started = True
                message = doc.get("message") if kind == "message_start" else None
                yield StreamStart(str_or_none(message.get("id")) if isinstance(message, dict) else None)
            if kind == "message_stop":
                if state.usage:
                    yield StreamUsage(_usage(state.usage))
                return
            for event in state.apply(kind, doc):
                yield event
        if not state.finished:
            raise truncated("stream ended before its stop reason")
        if state.usage:
            yield StreamUsage(_usage(state.usage))

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError:
        info = error_info(body)
        category = status_category(status)
        if info is not None:
            if info.type == "overloaded_error":
                category = UpstreamCategory.OVERLOADED
            category = refine_category(category, info)
        return UpstreamError(
            category,
            status=status,
            retry_after=retry_after(headers),
            detail=describe(info, body),
            reason=client_reason(category, info, body),
            reported=True,
        )


def _conversation(messages: list[Message]) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``system`` prompt and the alternating turns, merging neighbours of the same role.

    ``system`` is one string, its messages joined by blank lines, unless a part carries a cache
    breakpoint: then it is the text blocks, one per part, so the breakpoint stays where it was."""
    system: list[Message] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("system", "developer"):
            system.append(m)
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if any(isinstance(m.content, list) and _any_cached(m.content) for m in system):
        return _system_blocks(system), turns
    return "\n\n".join(text for text in (m.text() for m in system) if text), turns


def _any_cached(parts: list[ContentPart]) -> bool:
    return any(type(p) is TextPart and p.cache_control is not None for p in parts)


def _system_blocks(system: list[Message]) -> list[dict[str, Any]]:
    """Every system message's text as blocks, in order, breakpoints kept (images are left out, as
    from the string form)."""
    blocks: list[dict[str, Any]] = []
    for m in system:
        if isinstance(m.content, str):
            blocks.extend(_content_blocks(m.content))
        elif m.content:
            blocks.extend(_part(p) for p in m.content if type(p) is TextPart and (p.text or p.cache_control))
    return blocks


def _blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        if not m.tool_call_id:
            raise InvalidRequest("A tool message needs a tool_call_id.", param="messages")
        content: str | list[dict[str, Any]] = m.text()
        if isinstance(m.content, list) and any(type(p) is not TextPart or p.cache_control for p in m.content):
            content = _content_blocks(m.content)
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": anthropic_tool_id(m.tool_call_id),
            "content": content,
        }
        if m.cache_control is not None:
            result["cache_control"] = _cache_control(m.cache_control)
        return [result]
    blocks = _content_blocks(m.content)
    for call in m.tool_calls or ():
        block = {"type": "tool_use", "id": anthropic_tool_id(call.id), "name": call.name, "input": tool_arguments(call)}
        if call.cache_control is not None:
            block["cache_control"] = _cache_control(call.cache_control)
        blocks.append(block)
    return blocks


def _content_blocks(content: str | list[ContentPart] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [_part(p) for p in content if type(p) is not TextPart or p.text or p.cache_control]


def _cache_control(cc: CacheControl) -> dict[str, str]:
    return {"type": "ephemeral"} if cc.ttl is None else {"type": "ephemeral", "ttl": cc.ttl}


def _part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        out: dict[str, Any] = {"type": "text", "text": part.text}
    elif isinstance(part, ImagePart):
        out = {"type": "image", "source": _image_source(part.url)}
    elif isinstance(part, ThinkingPart):
        return {"type": "thinking", "thinking": part.thinking, "signature": part.signature}
    else:
        return {"type": "redacted_thinking", "data": part.data}
    if part.cache_control is not None:
        out["cache_control"] = _cache_control(part.cache_control)
    return out


def _image_source(url: str) -> dict[str, str]:
    if url.startswith("data:"):
        header, comma, data = url[len("data:") :].partition(",")
        media_type, *params = header.split(";")
        if not comma or "base64" not in params or not media_type:
            raise InvalidRequest("An image data URL must be data:<media-type>;base64,<data>.", param="messages")
        return {"type": "base64", "media_type": media_type, "data": data}
    if url.startswith(("https://", "http://")):
        return {"type": "url", "url": url}
    raise InvalidRequest("An image URL must be an http(s) URL or a base64 data URL.", param="messages")


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        out["description"] = tool.description
    out["input_schema"] = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
    if tool.cache_control is not None:
        out["cache_control"] = _cache_control(tool.cache_control)
    return out


def _tool_choice(choice: ToolChoice | None, parallel: bool | None) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    mode = choice.mode if choice is not None else "auto"
    out: dict[str, Any] = {"type": _TOOL_CHOICE[mode]}
    if mode == "function":
        if choice is None or not choice.name:
            raise InvalidRequest("tool_choice of type function needs a function name.", param="tool_choice")
        out["name"] = choice.name
    if parallel is False and mode != "none":
        out["disable_parallel_tool_use"] = True
    return out


def _decode_tool_use(block: Mapping[str, Any], status: int) -> ToolCall:
    call_id, name = block.get("id"), block.get("name")
    if not (isinstance(call_id, str) and isinstance(name, str)):
        raise malformed("tool_use block lacks a string id or name", status=status)
    return ToolCall(id=call_id, name=name, arguments=orjson.dumps(block.get("input", {})).decode())


def _decode_thinking(block: Mapping[str, Any], status: int) -> ThinkingBlock:
    """A thinking block kept whole, or a redacted one: the client must be able to send it back unchanged."""
    if block.get("type") == "redacted_thinking":
        data = block.get("data")
        if not isinstance(data, str):
            raise malformed("redacted_thinking block has no data", status=status)
        return RedactedThinkingPart(data)
    thinking, signature = block.get("thinking"), block.get("signature")
    if not isinstance(thinking, str) or not isinstance(signature, str):
        raise malformed("thinking block lacks a string thinking or signature", status=status)
    return ThinkingPart(thinking, signature)


def _usage(raw: Mapping[str, Any]) -> Usage:
    """Anthropic's ``input_tokens`` excludes cached tokens; the canonical prompt count includes them."""
    cache_read = as_int(raw.get("cache_read_input_tokens"))
    cache_creation = as_int(raw.get("cache_creation_input_tokens"))
    return Usage(
        prompt_tokens=as_int(raw.get("input_tokens")) + cache_read + cache_creation,
        completion_tokens=as_int(raw.get("output_tokens")),
        cached_prompt_tokens=cache_read,
        cache_creation_tokens=cache_creation,
    )


def _stream_error(doc: Mapping[str, Any]) -> UpstreamError:
    info = error_fields(doc) or ErrorInfo(None, None, "")
    category = refine_category(_ERROR_TYPES.get(info.type or "", UpstreamCategory.SERVER), info)
    return UpstreamError(
        category, detail="stream error " + describe(info, b""), reason=client_reason(category, info, b""), reported=True
    )


class _StreamState:
    """What a stream has told so far: usage counters and which content blocks are tool calls or thinking."""

    __slots__ = ("args_seen", "finished", "thinking", "tools", "usage")

    _USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")

    def __init__(self) -> None:
        self.usage: dict[str, int] = {}
        """Provider-reported counters; cumulative, so a later report replaces an earlier one."""
        self.tools: dict[int, int] = {}
        """Content block index → tool-call ordinal."""
        self.args_seen: set[int] = set()
        self.thinking: dict[int, int] = {}
        """Content block index → thinking block ordinal (redacted ones included)."""
        self.finished = False
        """``message_delta`` gave the stop reason: the answer is complete even without ``message_stop``."""

    def apply(self, kind: str | None, doc: Mapping[str, Any]) -> list[StreamEvent]:
        """The canonical events of one upstream event. Unknown event types (``ping``, and any
        Anthropic adds later) carry nothing, as Anthropic asks clients to assume."""
        if kind == "message_start":
            message = doc.get("message")
            self._count(message.get("usage") if isinstance(message, dict) else None)
            return []
        if kind == "message_delta":
            self._count(doc.get("usage"))
            delta = doc.get("delta")
            stop = delta.get("stop_reason") if isinstance(delta, dict) else None
            if not isinstance(stop, str):
                return []
            self.finished = True
            return [StreamFinish(_FINISH.get(stop, "stop"))]
        index = doc.get("index")
        if not isinstance(index, int):
            return []
        if kind == "content_block_start":
            return self._block_start(index, doc.get("content_block"))
        if kind == "content_block_delta":
            return self._block_delta(index, doc.get("delta"))
        if kind == "content_block_stop" and index in self.tools and self.tools[index] not in self.args_seen:
            return [ToolCallDelta(index=self.tools[index], arguments="{}")]
        return []

    def _count(self, raw: object) -> None:
        if not isinstance(raw, dict):
            return
        for key in self._USAGE_KEYS:
            value = raw.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = value

    def _block_start(self, index: int, block: object) -> list[StreamEvent]:
        if not isinstance(block, dict):
            return []
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if kind == "thinking" or kind == "redacted_thinking":
            return [self._thinking_start(index, block)]
        if kind != "tool_use":
            return []
        call_id, name = block.get("id"), block.get("name")
        if not (isinstance(call_id, str) and isinstance(name, str)):
            raise malformed("tool_use block lacks a string id or name")
        ordinal = self.tools[index] = len(self.tools)
        return [ToolCallDelta(index=ordinal, id=call_id, name=name)]

    def _block_delta(self, index: int, delta: object) -> list[StreamEvent]:
        if not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if kind == "input_json_delta" and index in self.tools:
            fragment = delta.get("partial_json")
            if isinstance(fragment, str) and fragment:
                self.args_seen.add(self.tools[index])
                return [ToolCallDelta(index=self.tools[index], arguments=fragment)]
        elif kind == "thinking_delta" and index in self.thinking:
            text = delta.get("thinking")
            if isinstance(text, str) and text:
                return [ThinkingDelta(self.thinking[index], thinking=text)]
        elif kind == "signature_delta" and index in self.thinking:
            signature = delta.get("signature")
            if isinstance(signature, str) and signature:
                return [ThinkingDelta(self.thinking[index], signature=signature)]
        return []

    def _thinking_start(self, index: int, block: Mapping[str, Any]) -> StreamEvent:
        """The block's first event, even when empty: it opens the block at its place among the others."""
        ordinal = self.thinking[index] = len(self.thinking)
        if block.get("type") == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str):
                raise malformed("redacted_thinking block has no data")
            return RedactedThinking(ordinal, data)
        thinking, signature = block.get("thinking"), block.get("signature")
        return ThinkingDelta(
            ordinal, thinking if isinstance(thinking, str) else "", signature if isinstance(signature, str) else ""
        )
