"""Codec for the OpenAI Chat Completions wire format, spoken by OpenAI and by every
OpenAI-compatible server (vLLM, Azure OpenAI, gateways of other vendors).

The module also holds the helpers for HTTP error envelopes that other codecs reuse
(``error_info``, ``status_category``, ``retry_after``...): OpenAI's ``{"error": {...}}``
envelope is the one most providers copy, and keeping a single classifier keeps the retry
decisions of all formats consistent.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal, NamedTuple

import orjson

from tollway.canonical import (
    SKIPPED,
    CanonicalRequest,
    CanonicalResponse,
    ContentPart,
    FinishReason,
    ImagePart,
    Message,
    ResponseFormat,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers.base import ProviderFormat, Target
from tollway.providers.tool_ids import openai_tool_id
from tollway.wire import SseEvent, UpstreamRequest

__all__ = ["OpenAIChatCodec"]

_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})
_OWNED_KEYS = frozenset({"model", "messages", "stream", "stream_options"})
"""Body keys only the codec sets: an extension may never change what is called or how."""

_FINISH: Mapping[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}

_ERROR_TYPES: Mapping[str, UpstreamCategory] = {
    "invalid_request_error": UpstreamCategory.INVALID_REQUEST,
    "authentication_error": UpstreamCategory.AUTHENTICATION,
    "permission_error": UpstreamCategory.PERMISSION,
    "not_found_error": UpstreamCategory.NOT_FOUND,
    "rate_limit_error": UpstreamCategory.RATE_LIMIT,
    "rate_limit_exceeded": UpstreamCategory.RATE_LIMIT,
    "tokens": UpstreamCategory.RATE_LIMIT,
    "requests": UpstreamCategory.RATE_LIMIT,
    "server_error": UpstreamCategory.SERVER,
    "overloaded_error": UpstreamCategory.OVERLOADED,
}

_SAFETY_CODES = frozenset({"content_filter", "content_policy_violation"})
_CONTEXT_MESSAGE = re.compile(r"prompt is too long|maximum context length|context (?:length|window|limit)", re.I)
_SAFETY_MESSAGE = re.compile(r"content[ _-]?(?:filter|management|moderation)|safety system|usage polic(?:y|ies)", re.I)
_CONTEXT_LIMIT = re.compile(r"(?:maximum context length is|context (?:length|window|limit) (?:is|of)) (\d{1,9})", re.I)
_CONTEXT_USED = re.compile(r"(?:resulted in|requested|you requested) (\d{1,9}) tokens", re.I)
_CONTEXT_PAIR = re.compile(r"(\d{1,9}) tokens > (\d{1,9}) maximum", re.I)
_POLICY_CATEGORIES = frozenset(
    {
        "hate",
        "sexual",
        "violence",
        "self_harm",
        "jailbreak",
        "profanity",
        "indirect_attack",
        "protected_material_text",
        "protected_material_code",
    }
)
"""Content-filter category names a normalized reason may repeat (Azure OpenAI's); nothing else
of the provider's body reaches the client."""
_SECRET = re.compile(r"sk-[A-Za-z0-9_*\-]{6,}|Bearer\s+\S+|AKIA[0-9A-Z]{16}", re.I)
_DETAIL_LIMIT = 200


class OpenAIChatCodec:
    """``POST chat/completions`` relative to a base URL ending in ``/v1``."""

    format: ClassVar[ProviderFormat] = ProviderFormat.OPENAI_CHAT
    framing: ClassVar[Literal["sse"]] = "sse"

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest:
        """Front ends refuse what this format cannot carry for an alias with such a route, so
        ``top_k`` and ``thinking`` here are refused, never dropped. Cache breakpoints are not
        written: a front end lets them reach this codec only under the alias's ``ignore`` policy
        (they are hints; OpenAI caches prompt prefixes by itself), and ``anthropic_beta`` only
        holds betas that need nothing from the provider."""
        if req.top_k is not None:
            raise UnsupportedParameter("'top_k' is not supported by this model.", param="top_k")
        if req.thinking_budget is not None:
            raise UnsupportedParameter("'thinking' is not supported by this model.", param="thinking")
        body: dict[str, Any] = {"model": target.model, "messages": [_message(m) for m in req.messages]}
        optional: dict[str, Any] = {
            "max_tokens": req.max_output_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stop": req.stop,
            "tools": [_tool(t) for t in req.tools] if req.tools is not None else None,
            "tool_choice": _tool_choice(req.tool_choice) if req.tool_choice is not None else None,
            "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": _response_format(req.response_format) if req.response_format is not None else None,
            "user": req.user,
            "metadata": req.metadata,
        }
        body.update((k, v) for k, v in optional.items() if v is not None)
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        for key, value in req.extensions.items():
            if key not in _OWNED_KEYS:
                body.setdefault(key, value)
        return UpstreamRequest(path="chat/completions", body=orjson.dumps(body), headers=_HEADERS, stream=req.stream)

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse:
        doc = load_object(body, status=status, what="response")
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed("response has no choices", status=status)
        choice: dict[str, Any] = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise malformed("choice has no message object", status=status)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise malformed("message content is not a string", status=status)
        tool_calls = _decode_tool_calls(message.get("tool_calls"), status)
        finish = choice.get("finish_reason")
        return CanonicalResponse(
            content=content,
            tool_calls=tool_calls,
            finish_reason=_FINISH.get(finish, "stop") if isinstance(finish, str) else _implied_finish(tool_calls),
            usage=_usage(doc["usage"]) if isinstance(doc.get("usage"), dict) else None,
            provider_response_id=str_or_none(doc.get("id")),
            refusal=str_or_none(message.get("refusal")),
        )

    async def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]:
        """A stream is complete at ``[DONE]``, or when it ends after its ``finish_reason`` (some
        servers never send ``[DONE]``); ending before that is a truncation. One event that does
        not decode, after one that did, is reported as ``SKIPPED`` for the gateway to judge."""
        started = finished = False
        async for sse in events:
            if sse.data == "[DONE]":
                if not started:
                    yield StreamStart()
                return
            try:
                chunk = load_object(sse.data, status=None, what="stream chunk")
            except UpstreamError:
                if not started:
                    raise
                yield SKIPPED
                continue
            if sse.event == "error" or chunk.get("error"):
                raise _stream_error(chunk)
            if not started:
                started = True
                yield StreamStart(str_or_none(chunk.get("id")))
            for event in _chunk_events(chunk):
                if type(event) is StreamFinish:
                    finished = True
                yield event
        if not finished:
            raise truncated("stream ended before its finish_reason")

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError:
        info = error_info(body)
        category = status_category(status)
        if info is not None:
            category = refine_category(category, info)
        return UpstreamError(
            category,
            status=status,
            retry_after=retry_after(headers),
            detail=describe(info, body),
            reason=client_reason(category, info, body),
            reported=True,
        )


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    if m.content is not None:
        out["content"] = m.content if isinstance(m.content, str) else [_part(p) for p in m.content]
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": openai_tool_id(c.id), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = openai_tool_id(m.tool_call_id)
    return out


def _part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if not isinstance(part, ImagePart):
        raise UnsupportedParameter("Thinking blocks are not supported by this model.", param="messages")
    image: dict[str, Any] = {"url": part.url}
    if part.detail is not None:
        image["detail"] = part.detail
    return {"type": "image_url", "image_url": image}


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.mode != "function":
        return choice.mode
    if not choice.name:
        raise InvalidRequest("tool_choice of type function needs a function name.", param="tool_choice")
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    if fmt.json_schema is None:
        raise InvalidRequest("response_format of type json_schema needs a json_schema.", param="response_format")
    return {"type": "json_schema", "json_schema": fmt.json_schema}


def _decode_tool_calls(raw: object, status: int) -> list[ToolCall] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise malformed("tool_calls is not a list", status=status)
    calls: list[ToolCall] = []
    for item in raw:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict):
            raise malformed("tool call has no function object", status=status)
        call_id, name, arguments = item.get("id"), function.get("name"), function.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise malformed("tool call lacks a string id, name or arguments", status=status)
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return calls or None


def _implied_finish(tool_calls: list[ToolCall] | None) -> FinishReason:
    return "tool_calls" if tool_calls else "stop"


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt_details = raw.get("prompt_tokens_details")
    completion_details = raw.get("completion_tokens_details")
    return Usage(
        prompt_tokens=as_int(raw.get("prompt_tokens")),
        completion_tokens=as_int(raw.get("completion_tokens")),
        cached_prompt_tokens=as_int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0,
        reasoning_tokens=(
            as_int(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else 0
        ),
    )


def _chunk_events(chunk: Mapping[str, Any]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    choices = chunk.get("choices")
    choice = _first_choice(choices) if isinstance(choices, list) else None
    if choice is not None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(TextDelta(text))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                out.extend(d for d in map(_tool_call_delta, calls) if d is not None)
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            out.append(StreamFinish(_FINISH.get(finish, "stop")))
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        out.append(StreamUsage(_usage(usage)))
    return out


def _first_choice(choices: list[Any]) -> dict[str, Any] | None:
    """Choice 0: with ``n`` > 1 a chunk may carry any choice, and only the first is canonical."""
    return next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)


def _tool_call_delta(raw: object) -> ToolCallDelta | None:
    index = raw.get("index") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(index, int) or isinstance(index, bool):
        raise malformed("tool call delta has no integer index")
    function = raw.get("function")
    if not isinstance(function, dict):
        function = {}
    call_id, name = str_or_none(raw.get("id")), str_or_none(function.get("name"))
    arguments = function.get("arguments")
    arguments = arguments if isinstance(arguments, str) else ""
    if call_id is None and name is None and not arguments:
        return None
    return ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)


def _stream_error(chunk: Mapping[str, Any]) -> UpstreamError:
    info = error_fields(chunk) or ErrorInfo(None, None, "")
    category = _ERROR_TYPES.get(info.type or "")
    if category is None:
        code = int(info.code) if info.code is not None and info.code.isdigit() else 0
        category = status_category(code) if 400 <= code <= 599 else UpstreamCategory.SERVER
    category = refine_category(category, info)
    return UpstreamError(
        category, detail="stream error " + describe(info, b""), reason=client_reason(category, info, b""), reported=True
    )


# Helpers for HTTP error envelopes and JSON bodies, shared with the other codecs.


class ErrorInfo(NamedTuple):
    """The classifying fields of a provider error body; every one may be missing."""

    type: str | None
    code: str | None
    message: str


def error_info(body: bytes) -> ErrorInfo | None:
    """The fields of ``{"error": {"type", "code", "message"}}`` (OpenAI and Anthropic), also
    accepting the flatter ``{"error": "..."}`` and ``{"message"|"detail": "..."}`` shapes
    of compatible servers. None when the body holds none of these."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return error_fields(doc) if isinstance(doc, dict) else None


def error_fields(doc: Mapping[str, Any]) -> ErrorInfo | None:
    err = doc.get("error")
    if isinstance(err, str):
        return ErrorInfo(None, None, err)
    fields = err if isinstance(err, dict) else doc
    message = fields.get("message") or fields.get("detail")
    if fields is doc and not isinstance(message, str):
        return None
    code = fields.get("code")
    return ErrorInfo(
        type=str_or_none(fields.get("type")),
        code=None if code is None or isinstance(code, bool) else str(code),
        message=message if isinstance(message, str) else "",
    )


def status_category(status: int) -> UpstreamCategory:
    """The category an HTTP status implies before the body refines it."""
    if status in _STATUS_CATEGORY:
        return _STATUS_CATEGORY[status]
    if status >= 500:
        return UpstreamCategory.SERVER
    if status >= 400:
        return UpstreamCategory.INVALID_REQUEST
    return UpstreamCategory.MALFORMED


_STATUS_CATEGORY: Mapping[int, UpstreamCategory] = {
    401: UpstreamCategory.AUTHENTICATION,
    403: UpstreamCategory.PERMISSION,
    404: UpstreamCategory.NOT_FOUND,
    408: UpstreamCategory.TIMEOUT,
    429: UpstreamCategory.RATE_LIMIT,
    503: UpstreamCategory.OVERLOADED,
    529: UpstreamCategory.OVERLOADED,
}


def refine_category(
    category: UpstreamCategory, info: ErrorInfo, *, safety_codes: frozenset[str] = _SAFETY_CODES
) -> UpstreamCategory:
    """An invalid request is really a context-length or safety failure when the body says so:
    by its code or type (``context_length_exceeded``; ``content_filter``,
    ``content_policy_violation``), or by a message such as "prompt is too long" or "content
    filtering policy" (Anthropic's bodies carry no code)."""
    if category is not UpstreamCategory.INVALID_REQUEST:
        return category
    if info.code == "context_length_exceeded" or _CONTEXT_MESSAGE.search(info.message):
        return UpstreamCategory.CONTEXT_LENGTH
    if info.code in safety_codes or info.type in safety_codes or _SAFETY_MESSAGE.search(info.message):
        return UpstreamCategory.SAFETY
    return category


def client_reason(category: UpstreamCategory, info: ErrorInfo | None, body: bytes) -> str | None:
    """A normalized sentence for a context-length or safety refusal, from a fixed template and
    only the numbers or known category names the provider gave; ``None`` leaves the default."""
    if category is UpstreamCategory.CONTEXT_LENGTH and info is not None:
        return context_reason(info.message)
    if category is UpstreamCategory.SAFETY:
        names = policy_categories(body)
        if names:
            return f"The request was rejected by the model provider's content policy ({', '.join(names)})."
    return None


def context_reason(message: str) -> str | None:
    """``"... (130021 tokens requested, 128000 allowed)."`` from OpenAI's "maximum context length
    is N tokens ... resulted in M tokens" or Anthropic's "M tokens > N maximum"."""
    used = limit = None
    pair = _CONTEXT_PAIR.search(message)
    if pair is not None:
        used, limit = pair.group(1), pair.group(2)
    match = _CONTEXT_LIMIT.search(message)
    if match is not None:
        limit = match.group(1)
    match = _CONTEXT_USED.search(message)
    if match is not None:
        used = match.group(1)
    if limit is None:
        return None
    asked = f"{int(used)} tokens requested, " if used is not None else ""
    return f"The request exceeds the model's context length ({asked}{int(limit)} allowed)."


def policy_categories(body: bytes) -> list[str]:
    """The filtered categories of an Azure-style ``innererror.content_filter_result``, sorted,
    limited to the names in ``_POLICY_CATEGORIES``."""
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return []
    err = doc.get("error") if isinstance(doc, dict) else None
    inner = err.get("innererror") if isinstance(err, dict) else None
    result = inner.get("content_filter_result") if isinstance(inner, dict) else None
    if not isinstance(result, dict):
        return []
    return sorted(
        name
        for name, verdict in result.items()
        if name in _POLICY_CATEGORIES and isinstance(verdict, dict) and verdict.get("filtered") is True
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` (OpenAI) or a delta-seconds ``Retry-After``. An
    HTTP-date is ignored: turning it into a delay needs a clock, and codecs have none."""
    millis = _seconds(header(headers, "retry-after-ms"))
    if millis is not None:
        return millis / 1000
    return _seconds(header(headers, "retry-after"))


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by lower-case name, from case-insensitive (httpx) or plain mappings alike."""
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)


def describe(info: ErrorInfo | None, body: bytes) -> str:
    """A short diagnostic: error type and code, and at most 200 characters of message, with
    anything that looks like a credential masked."""
    if info is None:
        return (
            "unrecognized error body: " + clip(body[:1024].decode("utf-8", "replace")) if body else "empty error body"
        )
    kind = "/".join(p for p in (info.type, info.code) if p) or "error"
    return f"{kind}: {clip(info.message)}"


def clip(text: str) -> str:
    text = _SECRET.sub("[redacted]", " ".join(text.split()))
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"


def nonblank_parts(
    content: str | list[ContentPart] | None, part: Callable[[ContentPart], dict[str, Any]]
) -> list[dict[str, Any]]:
    """A message's content as the text and part objects of the formats that refuse a blank text
    (Gemini's ``parts``, Bedrock's content blocks): empty text is left out, and every other part
    is ``part(p)``."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [part(p) for p in content if type(p) is not TextPart or p.text]


def tool_arguments(call: ToolCall) -> dict[str, Any]:
    """A tool call's arguments as the object the formats that nest them want (Anthropic's
    ``input``, Gemini's ``args``, Bedrock's ``input``). Empty arguments mean no arguments: some
    OpenAI-compatible servers emit ``""`` for a tool without parameters."""
    if not call.arguments.strip():
        return {}
    try:
        value = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequest(f"The arguments of tool call {call.id!r} must be a JSON object.", param="messages")
    return value


def load_object(data: bytes | str, *, status: int | None, what: str) -> dict[str, Any]:
    """Parse a JSON object, or report the body as malformed (without quoting it)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise malformed(f"{what} is not valid JSON ({exc.msg} at {exc.pos})", status=status) from None
    if not isinstance(doc, dict):
        raise malformed(f"{what} is not a JSON object", status=status)
    return doc


def malformed(detail: str, *, status: int | None = None) -> UpstreamError:
    return UpstreamError(UpstreamCategory.MALFORMED, status=status, detail=clip(detail))


def truncated(detail: str) -> UpstreamError:
    return UpstreamError(UpstreamCategory.TRUNCATED, detail=detail)


def as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
