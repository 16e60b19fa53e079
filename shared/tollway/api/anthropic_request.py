"""Parse an Anthropic Messages request body (``POST /v1/messages``) into a ``CanonicalRequest``.

One ``orjson.loads`` per request, then plain type checks, as ``chat_request`` does. A field or
key whose value is ``null`` is treated as absent. Nothing is dropped silently: what the canonical
types cannot carry yet is refused with ``unsupported_parameter`` naming its path, and error
messages name fields, never echo request values.

How the Anthropic shape lands in the canonical one (which is shaped after OpenAI's):

- ``system`` becomes one leading ``system`` message. One text block (or a string) is kept as a
  string; several blocks stay separate ``TextPart``s, so the canonical request still shows where
  they were split and each provider codec joins them its own way.
- A user turn's blocks are walked in order: each ``tool_result`` becomes a ``tool`` message and
  each run of text and image blocks between them a ``user`` message, so order is preserved.
- An assistant turn becomes one ``assistant`` message: its thinking and text blocks as content,
  in order, its ``tool_use`` blocks as tool calls (arguments re-serialized from ``input``).
  Canonical messages keep content before tool calls, so a block written after a ``tool_use``
  block moves before it.
- A single text part collapses to a plain string everywhere (system, user, assistant, tool
  result) unless it carries a cache breakpoint; several stay a list of parts.
- ``cache_control`` on a system, text, image, ``tool_use`` or ``tool_result`` block or a tool is
  kept on the canonical part, call, tool message or tool definition it becomes (at most four, as
  Anthropic allows). It is a hint that changes nothing in the answer, and OpenAI-format routes
  cannot write it: on an alias with such a route it is refused (400 naming its path) under
  ``unsupportedParameterPolicy: reject``, the default, and kept under ``ignore``, where the
  Anthropic routes write it and the others leave it out (OpenAI caches prefixes by itself).
- ``thinking`` (``enabled`` with ``budget_tokens`` of at least 1024 and below ``max_tokens``, which
  the ``interleaved-thinking`` beta lifts; or ``disabled``) and assistant ``thinking`` and
  ``redacted_thinking`` blocks, kept whole with their signatures, need every route of the alias
  to be Anthropic-format: they change the answer, and another format cannot send them back.
- ``tool_result`` with ``is_error: true`` is refused: the canonical tool message has no error
  flag, and writing one into the text would change what the model reads. The client can send
  the failure as the result's text instead.
- ``citations``, ``document``/``search_result`` blocks, server tools, ``service_tier``,
  ``container``, ``mcp_servers``, ``context_management`` and a top-level ``cache_control`` are
  refused.
- Unknown top-level fields are refused, even ones the alias allowlists: ``allowedParameters``
  name OpenAI fields, which only OpenAI-format routes forward, and an Anthropic body's field of
  the same name is not the same thing. The alias's ``rejectUnknownParameters: false`` does not
  apply to them either: fields the gateway would drop are Anthropic features the client expects
  to work.
- An alias with an OpenAI-format route cannot take ``top_k``, more than four stop sequences, an
  image inside a tool result, or a beta that needs the provider: a fallback may land on that
  route, so they are refused up front.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from tollway.api.anthropic_beta import INTERLEAVED_THINKING, provider_betas
from tollway.api.envelope import MAX_NAME as _MAX_NAME
from tollway.api.envelope import ParsedEnvelope, parse_body
from tollway.api.envelope import bad as _bad
from tollway.api.envelope import number as _number
from tollway.api.envelope import object_type as _block_type
from tollway.api.envelope import require as _require
from tollway.api.envelope import shown as _shown
from tollway.api.image_urls import image_url_error
from tollway.canonical import (
    EPHEMERAL,
    CacheControl,
    CanonicalRequest,
    ContentPart,
    ImagePart,
    Message,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from tollway.exceptions import UnsupportedParameter
from tollway.routing.plan import AliasPlan

__all__ = ["ParsedEnvelope", "parse_body", "to_canonical"]

_PROFILE = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "metadata",
        "thinking",
        "service_tier",
    }
)
_NOT_YET = frozenset({"cache_control", "container", "mcp_servers", "context_management"})
"""Anthropic fields the canonical request cannot carry yet: refused with a message that says so."""
_NOT_YET_KEYS = frozenset({"citations"})
_ANTHROPIC_FORMAT = "anthropic-messages"
_TOP_K_FORMATS = frozenset({_ANTHROPIC_FORMAT, "gemini"})
"""The provider formats that carry a top-k cut-off (Gemini's ``generationConfig.topK``)."""
_THINKING_FORMATS = frozenset({_ANTHROPIC_FORMAT, "bedrock-converse"})
"""The provider formats that carry extended thinking and send its blocks back with their signatures
(Bedrock Converse as ``reasoningContent``)."""
_IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_MAX_MESSAGES = 4096
_MAX_TOOLS = 128
_MAX_STOP = 16
_MAX_OPENAI_STOP = 4
_MAX_BREAKPOINTS = 4
"""Anthropic's limit of ``cache_control`` blocks per request."""
_CACHE_TTLS = frozenset({"5m", "1h"})
_MIN_THINKING_BUDGET = 1024

_TEXT_KEYS = frozenset({"type", "text", "cache_control"})
_IMAGE_KEYS = frozenset({"type", "source", "cache_control"})
_TOOL_USE_KEYS = frozenset({"type", "id", "name", "input", "cache_control"})
_TOOL_RESULT_KEYS = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"})
_THINKING_KEYS = frozenset({"type", "thinking", "signature"})
_REDACTED_KEYS = frozenset({"type", "data"})
_MESSAGE_KEYS = frozenset({"role", "content"})
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "cache_control"})
_CACHE_KEYS = frozenset({"type", "ttl"})


class _Checks:
    """One request's view of its alias while it is checked: whether a route is not Anthropic-format
    (worked out at most once, and only if a field asks), and the cache breakpoints counted so far."""

    __slots__ = ("_mixed", "breakpoints", "plan")

    def __init__(self, plan: AliasPlan) -> None:
        self.plan = plan
        self._mixed: bool | None = None
        self.breakpoints = 0

    @property
    def mixed(self) -> bool:
        """A route of the alias has another format than Anthropic's (OpenAI, Gemini, Bedrock), so a
        field only Anthropic carries would be lost on it."""
        if self._mixed is None:
            self._mixed = bool(self.plan.formats - {_ANTHROPIC_FORMAT})
        return self._mixed

    @property
    def thinks(self) -> bool:
        """Every route of the alias carries extended thinking and its signed blocks."""
        return self.plan.formats <= _THINKING_FORMATS

    def unsupported(self, param: str, what: str | None = None, why: str = "") -> UnsupportedParameter:
        subject = what or f"'{param}'"
        return UnsupportedParameter(f"{subject} is not supported by model '{self.plan.name}'{why}.", param=param)


def _not_yet(param: str) -> UnsupportedParameter:
    return UnsupportedParameter(f"'{param}' is not supported yet by this gateway.", param=param)


def _cache(obj: dict[str, Any], where: str, checks: _Checks) -> CacheControl | None:
    """The block's or tool's cache breakpoint, if it has one (see the module docstring for policy)."""
    raw = obj.get("cache_control")
    if raw is None:
        return None
    at = f"{where}.cache_control"
    if not isinstance(raw, dict) or raw.get("type") != "ephemeral":
        raise _bad(f"{at} must be an object of type 'ephemeral'.", at)
    _check_keys(raw, _CACHE_KEYS, at)
    ttl = raw.get("ttl")
    if ttl is not None and ttl not in _CACHE_TTLS:
        raise _bad(f"{at}.ttl must be '5m' or '1h'.", f"{at}.ttl")
    if checks.plan.reject_unknown_parameters and checks.mixed:
        raise checks.unsupported(at, why=", which may be served by a route that cannot write cache breakpoints")
    checks.breakpoints += 1
    if checks.breakpoints > _MAX_BREAKPOINTS:
        raise _bad(f"A request may carry at most {_MAX_BREAKPOINTS} cache_control breakpoints.", at)
    return EPHEMERAL if ttl is None else CacheControl(ttl)


def _joined(parts: list[ContentPart]) -> str | list[ContentPart]:
    """A single text part without a breakpoint as a plain string; anything else stays a list."""
    if len(parts) == 1 and type(parts[0]) is TextPart and parts[0].cache_control is None:
        return parts[0].text
    return parts


def _check_keys(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse every key of ``obj`` outside ``allowed``; ``null`` values and empty ``citations``
    carry nothing and pass."""
    for key, value in obj.items():
        if key in allowed or value is None:
            continue
        path = f"{where}.{key[:_MAX_NAME]}"
        if key in _NOT_YET_KEYS:
            if key == "citations" and value == []:
                continue
            raise _not_yet(path)
        raise UnsupportedParameter(f"'{path}' is not supported.", param=path)


def _unsupported_block(kind: str, where: str) -> UnsupportedParameter:
    return UnsupportedParameter(
        f"Content block type {_shown(kind)} is not supported yet by this gateway.", param=f"{where}.type"
    )


def _text(block: dict[str, Any], where: str, checks: _Checks) -> TextPart:
    _check_keys(block, _TEXT_KEYS, where)
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text must be a string.", f"{where}.text")
    return TextPart(text, _cache(block, where, checks)) if "cache_control" in block else TextPart(text)


def _image(block: dict[str, Any], where: str, checks: _Checks) -> ImagePart:
    plan = checks.plan
    _require(plan, "vision", where)
    _check_keys(block, _IMAGE_KEYS, where)
    source = block.get("source")
    at = f"{where}.source"
    if not isinstance(source, dict):
        raise _bad(f"{at} must be an object.", at)
    kind = source.get("type")
    if kind == "base64":
        _check_keys(source, frozenset({"type", "media_type", "data"}), at)
        media, data = source.get("media_type"), source.get("data")
        if media not in _IMAGE_MEDIA_TYPES:
            raise _bad(f"{at}.media_type must be one of {', '.join(_IMAGE_MEDIA_TYPES)}.", f"{at}.media_type")
        if not isinstance(data, str) or not data:
            raise _bad(f"{at}.data must be a non-empty base64 string.", f"{at}.data")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        _check_keys(source, frozenset({"type", "url"}), at)
        link = source.get("url")
        if not isinstance(link, str):
            raise _bad(f"{at}.url must be a string.", f"{at}.url")
        url = link
    else:
        raise UnsupportedParameter(
            f"Image source type {_shown(kind)} is not supported yet by this gateway.", param=f"{at}.type"
        )
    reason = image_url_error(url, plan.image_url_policy)
    if reason is not None:
        raise _bad(f"{at}.url {reason}.", f"{at}.url")
    return ImagePart(url, cache_control=_cache(block, where, checks))


def _thinking_block(block: dict[str, Any], kind: str, where: str, checks: _Checks) -> ContentPart:
    """A thinking or redacted thinking block of an assistant turn, kept whole to go back unchanged."""
    if not checks.thinks:
        raise checks.unsupported(where, f"A {kind} block ('{where}')")
    if kind == "redacted_thinking":
        _check_keys(block, _REDACTED_KEYS, where)
        data = block.get("data")
        if not isinstance(data, str) or not data:
            raise _bad(f"{where}.data must be a non-empty string.", f"{where}.data")
        return RedactedThinkingPart(data)
    _check_keys(block, _THINKING_KEYS, where)
    thinking, signature = block.get("thinking"), block.get("signature")
    if not isinstance(thinking, str):
        raise _bad(f"{where}.thinking must be a string.", f"{where}.thinking")
    if not isinstance(signature, str) or not signature:
        raise _bad(f"{where}.signature must be a non-empty string.", f"{where}.signature")
    return ThinkingPart(thinking, signature)


def _tool_result(block: dict[str, Any], where: str, checks: _Checks) -> Message:
    _check_keys(block, _TOOL_RESULT_KEYS, where)
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise _bad(f"{where}.tool_use_id must be a non-empty string.", f"{where}.tool_use_id")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error must be a boolean.", f"{where}.is_error")
    if is_error:
        raise UnsupportedParameter(
            f"'{where}.is_error' is not supported yet by this gateway; send the failure as the result's text.",
            param=f"{where}.is_error",
        )
    cache = _cache(block, where, checks)
    content = block.get("content")
    if content is None or isinstance(content, str):
        return Message("tool", content or "", tool_call_id=tool_use_id, cache_control=cache)
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or an array of blocks.", f"{where}.content")
    parts: list[ContentPart] = []
    for k, inner in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = _block_type(inner, at)
        if kind == "text":
            parts.append(_text(inner, at, checks))
        elif kind == "image":
            if checks.mixed:
                raise checks.unsupported(at, f"An image inside a tool result ('{at}')")
            parts.append(_image(inner, at, checks))
        else:
            raise _unsupported_block(kind, at)
    return Message("tool", _joined(parts) if parts else "", tool_call_id=tool_use_id, cache_control=cache)


def _tool_use(block: dict[str, Any], where: str, checks: _Checks) -> ToolCall:
    _check_keys(block, _TOOL_USE_KEYS, where)
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.id must be a non-empty string.", f"{where}.id")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name must be a non-empty string.", f"{where}.name")
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.input must be an object.", f"{where}.input")
    return ToolCall(call_id, name, orjson.dumps(arguments).decode(), _cache(block, where, checks))


def _user_turn(content: list[Any], i: int, checks: _Checks) -> list[Message]:
    out: list[Message] = []
    pending: list[ContentPart] = []
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            pending.append(_text(block, where, checks))
        elif kind == "image":
            pending.append(_image(block, where, checks))
        elif kind == "tool_result":
            if pending:
                out.append(Message("user", _joined(pending)))
                pending = []
            out.append(_tool_result(block, where, checks))
        elif kind in ("tool_use", "thinking", "redacted_thinking"):
            raise _bad(f"{where}: {kind} blocks are only allowed in assistant messages.", f"{where}.type")
        else:
            raise _unsupported_block(kind, where)
    if pending:
        out.append(Message("user", _joined(pending)))
    return out


def _assistant_turn(content: list[Any], i: int, checks: _Checks) -> Message:
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append(_text(block, where, checks))
        elif kind == "tool_use":
            calls.append(_tool_use(block, where, checks))
        elif kind in ("thinking", "redacted_thinking"):
            parts.append(_thinking_block(block, kind, where, checks))
        elif kind in ("image", "tool_result"):
            raise _bad(f"{where}: {kind} blocks are only allowed in user messages.", f"{where}.type")
        else:
            raise _unsupported_block(kind, where)
    return Message("assistant", _joined(parts) if parts else None, tool_calls=calls or None)


def _messages(raw: Any, checks: _Checks) -> list[Message]:
    if not isinstance(raw, list) or not raw or len(raw) > _MAX_MESSAGES:
        raise _bad(f"'messages' must be a non-empty array of at most {_MAX_MESSAGES} messages.", "messages")
    out: list[Message] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where} must be an object.", where)
        _check_keys(message, _MESSAGE_KEYS, where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise _bad(f"{where}.role must be 'user' or 'assistant'.", f"{where}.role")
        if isinstance(content, str):
            out.append(Message(role, content))
        elif not isinstance(content, list) or not content:
            raise _bad(f"{where}.content must be a string or a non-empty array of blocks.", f"{where}.content")
        elif role == "user":
            out.extend(_user_turn(content, i, checks))
        else:
            out.append(_assistant_turn(content, i, checks))
    return out


def _system(raw: Any, checks: _Checks) -> Message | None:
    if isinstance(raw, str):
        return Message("system", raw) if raw else None
    if not isinstance(raw, list):
        raise _bad("'system' must be a string or an array of text blocks.", "system")
    parts: list[ContentPart] = []
    for j, block in enumerate(raw):
        where = f"system[{j}]"
        kind = _block_type(block, where)
        if kind != "text":
            raise _bad(f"{where} must be a text block.", f"{where}.type")
        parts.append(_text(block, where, checks))
    return Message("system", _joined(parts)) if parts else None


def _tools(raw: Any, checks: _Checks) -> list[ToolDefinition]:
    _require(checks.plan, "tools", "tools")
    if not isinstance(raw, list) or len(raw) > _MAX_TOOLS:
        raise _bad(f"'tools' must be an array of at most {_MAX_TOOLS} tools.", "tools")
    tools = []
    for j, tool in enumerate(raw):
        where = f"tools[{j}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where} must be an object.", where)
        kind = tool.get("type")
        if kind is not None and kind != "custom":
            raise UnsupportedParameter(
                f"Server tool type {_shown(kind)} is not supported by this gateway.", param=f"{where}.type"
            )
        _check_keys(tool, _TOOL_KEYS, where)
        name, desc, schema = tool.get("name"), tool.get("description"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name must be a non-empty string.", f"{where}.name")
        if desc is not None and not isinstance(desc, str):
            raise _bad(f"{where}.description must be a string.", f"{where}.description")
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema must be an object.", f"{where}.input_schema")
        tools.append(ToolDefinition(name, desc, schema, cache_control=_cache(tool, where, checks)))
    return tools


_CHOICE_MODES: dict[str, Literal["auto", "none", "required", "function"]] = {
    "auto": "auto",
    "any": "required",
    "tool": "function",
    "none": "none",
}


def _tool_choice(raw: Any, names: set[str]) -> tuple[ToolChoice, bool | None]:
    """The canonical choice, and ``False`` when the client disabled parallel tool use."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(kind, str) or kind not in _CHOICE_MODES:
        raise _bad("'tool_choice.type' must be auto, any, tool or none.", "tool_choice")
    allowed = {"type"} if kind == "none" else {"type", "disable_parallel_tool_use"}
    if kind == "tool":
        allowed.add("name")
    _check_keys(raw, frozenset(allowed), "tool_choice")
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _bad(
            "'tool_choice.disable_parallel_tool_use' must be a boolean.", "tool_choice.disable_parallel_tool_use"
        )
    parallel = False if disable else None
    if kind != "tool":
        return ToolChoice(_CHOICE_MODES[kind]), parallel
    name = raw.get("name")
    if not isinstance(name, str) or name not in names:
        raise _bad("'tool_choice.name' must name one of the defined tools.", "tool_choice.name")
    return ToolChoice("function", name), parallel


def _positive(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"'{key}' must be a positive integer.", key)
    return value


def _max_tokens(body: dict[str, Any], plan: AliasPlan, required: bool) -> int | None:
    limit = _positive(body, "max_tokens")
    if limit is None and required:
        raise _bad("'max_tokens' is required.", "max_tokens")
    if limit is not None and limit > plan.max_output_tokens:
        raise _bad(f"'max_tokens' exceeds this model's limit of {plan.max_output_tokens}.", "max_tokens")
    return limit


def _top_k(body: dict[str, Any], checks: _Checks) -> int | None:
    top_k = _positive(body, "top_k")
    if top_k is not None and checks.plan.formats - _TOP_K_FORMATS:
        raise checks.unsupported("top_k")
    return top_k


def _stop(raw: Any, checks: _Checks) -> list[str] | None:
    if not isinstance(raw, list) or len(raw) > _MAX_STOP or not all(isinstance(s, str) and s for s in raw):
        raise _bad(f"'stop_sequences' must be an array of up to {_MAX_STOP} non-empty strings.", "stop_sequences")
    if len(raw) > _MAX_OPENAI_STOP and checks.mixed:
        raise UnsupportedParameter(
            f"Model '{checks.plan.name}' takes at most {_MAX_OPENAI_STOP} 'stop_sequences'.", param="stop_sequences"
        )
    return raw or None


def _user(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        raise _bad("'metadata' must be an object.", "metadata")
    _check_keys(raw, frozenset({"user_id"}), "metadata")
    user = raw.get("user_id")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise _bad("'metadata.user_id' must be a string of at most 256 characters.", "metadata.user_id")
    return user


def _refuse_unknown_fields(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key in _PROFILE or value is None:
            continue
        if key in _NOT_YET:
            raise _not_yet(key)
        raise UnsupportedParameter(f"Unsupported parameter: '{key[:_MAX_NAME]}'.", param=key[:_MAX_NAME])


def _thinking(raw: Any, checks: _Checks, max_tokens: int | None, betas: tuple[str, ...]) -> int | None:
    """Extended thinking's budget, or ``None`` when it is disabled."""
    if not isinstance(raw, dict):
        raise _bad("'thinking' must be an object.", "thinking")
    kind = raw.get("type")
    if kind == "disabled":
        _check_keys(raw, frozenset({"type"}), "thinking")
        return None
    if kind != "enabled":
        raise UnsupportedParameter(
            f"'thinking.type' {_shown(kind)} is not supported by this gateway; use 'enabled' or 'disabled'.",
            param="thinking.type",
        )
    _check_keys(raw, frozenset({"type", "budget_tokens"}), "thinking")
    if not checks.thinks:
        raise checks.unsupported("thinking")
    budget = raw.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < _MIN_THINKING_BUDGET:
        raise _bad(
            f"'thinking.budget_tokens' must be an integer of at least {_MIN_THINKING_BUDGET}.", "thinking.budget_tokens"
        )
    if max_tokens is not None and budget >= max_tokens and INTERLEAVED_THINKING not in betas:
        raise _bad("'thinking.budget_tokens' must be less than 'max_tokens'.", "thinking.budget_tokens")
    return budget


def _betas(betas: tuple[str, ...], checks: _Checks) -> tuple[str, ...]:
    if betas and checks.mixed:
        needs = provider_betas(betas)
        if needs is not None:
            raise checks.unsupported("anthropic-beta", f"The anthropic-beta '{needs}'")
    return betas


def _refused_options(body: dict[str, Any]) -> None:
    if body.get("service_tier") is not None:
        raise UnsupportedParameter("'service_tier' is not supported by this gateway.", param="service_tier")


def _apply_tools(req: CanonicalRequest, body: dict[str, Any], checks: _Checks) -> None:
    if body.get("tools") is not None:
        req.tools = _tools(body["tools"], checks)
    if body.get("tool_choice") is not None:
        if not req.tools:
            raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
        req.tool_choice, req.parallel_tool_calls = _tool_choice(body["tool_choice"], {t.name for t in req.tools})


def to_canonical(
    env: ParsedEnvelope, plan: AliasPlan, *, counting: bool = False, betas: tuple[str, ...] = ()
) -> CanonicalRequest:
    """Check ``env`` against the alias's policy and build the canonical request.

    ``counting`` is ``count_tokens``: ``max_tokens`` may be absent and the request never streams,
    so ``stream`` has no effect and needs no streaming capability. An Anthropic stream always ends
    with its usage, so ``include_usage`` follows ``stream``. ``betas`` are the request's accepted
    ``anthropic-beta`` values (``anthropic_beta.parse_betas``), checked here against the routes.
    """
    body = env.body
    _refuse_unknown_fields(body)
    _refused_options(body)
    checks = _Checks(plan)
    stream = env.stream and not counting
    if stream:
        _require(plan, "streaming", "stream")
    max_tokens = _max_tokens(body, plan, required=not counting)
    system = _system(body["system"], checks) if body.get("system") is not None else None
    messages = _messages(body.get("messages"), checks)
    req = CanonicalRequest(
        messages=[system, *messages] if system is not None else messages,
        max_output_tokens=max_tokens,
        temperature=_number(body, "temperature", 0, 1),
        top_p=_number(body, "top_p", 0, 1),
        top_k=_top_k(body, checks),
        stream=stream,
        include_usage=stream,
    )
    if body.get("stop_sequences") is not None:
        req.stop = _stop(body["stop_sequences"], checks)
    _apply_tools(req, body, checks)
    if body.get("metadata") is not None:
        req.user = _user(body["metadata"])
    if betas:
        req.anthropic_beta = _betas(betas, checks)
    if body.get("thinking") is not None:
        req.thinking_budget = _thinking(body["thinking"], checks, max_tokens, betas)
    return req
