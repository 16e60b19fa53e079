"""Parse an OpenAI Chat Completions request body into a ``CanonicalRequest``.

One ``orjson.loads`` per request; then plain type checks, no second generic pass. Fields
outside the compatibility profile are rejected with ``unsupported_parameter`` unless the
alias allowlists them. A field whose value is ``null`` is treated as absent, as OpenAI does.
SDK-default values of unsupported fields are ignored (documented in docs/compatibility.md):
``n: 1``, ``frequency_penalty: 0``, ``presence_penalty: 0``, ``logprobs: false``,
``store: false``, ``service_tier: "auto"`` / ``"default"``, ``stream: false``.
"""

from __future__ import annotations

from typing import Any, cast

from tollway.api.envelope import ParsedEnvelope, parse_body
from tollway.api.envelope import bad as _bad
from tollway.api.envelope import extensions as _extensions
from tollway.api.envelope import metadata as _metadata
from tollway.api.envelope import number as _number
from tollway.api.envelope import require as _require
from tollway.api.envelope import user as _user
from tollway.api.image_urls import image_url_error
from tollway.canonical import (
    CanonicalRequest,
    ContentPart,
    ImagePart,
    Message,
    ResponseFormat,
    Role,
    TextPart,
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
        "messages",
        "temperature",
        "top_p",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "user",
        "metadata",
    }
)
_SDK_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
    "store": (False,),
    "service_tier": ("auto", "default"),
}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_ECHO_KEYS = frozenset({"refusal", "annotations", "audio", "function_call", "reasoning_content"})
_MAX_MESSAGES = 4096
_MAX_TOOLS = 128
_MAX_STOP = 4


def _int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"'{key}' must be a positive integer.", key)
    return value


def _content_parts(raw: list[Any], i: int, plan: AliasPlan) -> list[ContentPart]:
    parts: list[ContentPart] = []
    for j, part in enumerate(raw):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict):
            raise _bad(f"{where} must be an object.", where)
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}.text must be a string.", f"{where}.text")
            parts.append(TextPart(text))
        elif kind == "image_url":
            _require(plan, "vision", where)
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str):
                raise _bad(f"{where}.image_url.url must be a string.", f"{where}.image_url.url")
            reason = image_url_error(url, plan.image_url_policy)
            if reason is not None:
                raise _bad(f"{where}.image_url.url {reason}.", f"{where}.image_url.url")
            detail = image.get("detail") if isinstance(image, dict) else None
            parts.append(ImagePart(url, detail if isinstance(detail, str) else None))
        else:
            shown = repr(kind[:64]) if isinstance(kind, str) else "of a non-string type"
            raise UnsupportedParameter(f"Content part type {shown} is not supported.", param=f"{where}.type")
    return parts


def _tool_calls(raw: Any, i: int) -> list[ToolCall]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(raw, list) or not raw:
        raise _bad(f"{where} must be a non-empty array.", where)
    calls = []
    for call in raw:
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise _bad(f"{where} entries need id, function.name and function.arguments strings.", where)
        calls.append(ToolCall(call["id"], fn["name"], fn["arguments"]))
    return calls


def _message(raw: Any, i: int, plan: AliasPlan) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be an object.", where)
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{where}.role must be one of system, developer, user, assistant, tool.", f"{where}.role")
    for key, value in raw.items():
        if key not in _MESSAGE_KEYS and not (key in _ECHO_KEYS and not value):
            raise UnsupportedParameter(f"{where}.{key} is not supported.", param=f"{where}.{key}")
    content = raw.get("content")
    parsed: str | list[ContentPart] | None
    if content is None or isinstance(content, str):
        parsed = content
    elif isinstance(content, list):
        parsed = _content_parts(content, i, plan)
    else:
        raise _bad(f"{where}.content must be a string or an array of parts.", f"{where}.content")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad(f"{where}.name must be a string.", f"{where}.name")
    msg = Message(role=cast(Role, role), content=parsed, name=name)
    if raw.get("tool_calls") is not None:
        if role != "assistant":
            raise _bad(f"{where}.tool_calls is only allowed on assistant messages.", f"{where}.tool_calls")
        msg.tool_calls = _tool_calls(raw["tool_calls"], i)
    if role == "tool":
        tool_call_id = raw.get("tool_call_id")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise _bad(f"{where}.tool_call_id is required for tool messages.", f"{where}.tool_call_id")
        msg.tool_call_id = tool_call_id
    elif parsed is None and not msg.tool_calls:
        raise _bad(f"{where}.content is required.", f"{where}.content")
    return msg


def _tools(raw: Any, plan: AliasPlan) -> list[ToolDefinition]:
    _require(plan, "tools", "tools")
    if not isinstance(raw, list) or len(raw) > _MAX_TOOLS:
        raise _bad(f"'tools' must be an array of at most {_MAX_TOOLS} tools.", "tools")
    tools = []
    for j, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{j}] must be a function tool.", f"tools[{j}]")
        name, params = fn.get("name"), fn.get("parameters")
        if not isinstance(name, str) or not name or (params is not None and not isinstance(params, dict)):
            raise _bad(f"tools[{j}].function needs a name and object parameters.", f"tools[{j}]")
        desc, strict = fn.get("description"), fn.get("strict")
        tools.append(
            ToolDefinition(
                name,
                desc if isinstance(desc, str) else None,
                params,
                strict if isinstance(strict, bool) else None,
            )
        )
    return tools


def _tool_choice(raw: Any, names: set[str]) -> ToolChoice:
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    fn = raw.get("function") if isinstance(raw, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        if fn["name"] not in names:
            raise _bad(f"tool_choice names an undefined tool {fn['name']!r}.", "tool_choice")
        return ToolChoice("function", fn["name"])
    raise _bad("'tool_choice' must be auto, none, required or a function choice.", "tool_choice")


def _response_format(raw: Any, plan: AliasPlan) -> ResponseFormat | None:
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        _require(plan, "json_object", "response_format")
        return ResponseFormat("json_object")
    if kind == "json_schema":
        _require(plan, "json_schema", "response_format")
        schema = raw.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise _bad("response_format.json_schema needs a name and a schema.", "response_format")
        return ResponseFormat("json_schema", schema)
    raise _bad("'response_format.type' must be text, json_object or json_schema.", "response_format")


def _stop(raw: Any) -> list[str]:
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or len(stops) > _MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise _bad(f"'stop' must be a string or up to {_MAX_STOP} non-empty strings.", "stop")
    return cast(list[str], stops)


def _output_limit(body: dict[str, Any], plan: AliasPlan) -> int | None:
    max_tokens, max_completion = _int(body, "max_tokens"), _int(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise _bad("'max_tokens' and 'max_completion_tokens' disagree; send one of them.", "max_tokens")
    limit = max_completion if max_completion is not None else max_tokens
    if limit is not None and limit > plan.max_output_tokens:
        param = "max_completion_tokens" if max_completion is not None else "max_tokens"
        raise _bad(f"'{param}' exceeds this model's limit of {plan.max_output_tokens}.", param)
    return limit


def _apply_options(req: CanonicalRequest, body: dict[str, Any], plan: AliasPlan) -> None:
    if body.get("stop") is not None:
        req.stop = _stop(body["stop"])
    if body.get("tools") is not None:
        req.tools = _tools(body["tools"], plan)
    if body.get("tool_choice") is not None:
        if not req.tools:
            raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
        req.tool_choice = _tool_choice(body["tool_choice"], {t.name for t in req.tools})
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise _bad("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
        req.parallel_tool_calls = body["parallel_tool_calls"]
    if body.get("response_format") is not None:
        req.response_format = _response_format(body["response_format"], plan)
    req.user = _user(body)
    if body.get("metadata") is not None:
        req.metadata = _metadata(body["metadata"])


def to_canonical(env: ParsedEnvelope, plan: AliasPlan) -> CanonicalRequest:
    """Check ``env`` against the alias's policy and build the canonical request."""
    body = env.body
    extensions = _extensions(body, _PROFILE, plan, _SDK_DEFAULTS)
    if env.stream:
        _require(plan, "streaming", "stream")
    messages_raw = body.get("messages")
    if not isinstance(messages_raw, list) or not messages_raw or len(messages_raw) > _MAX_MESSAGES:
        raise _bad("'messages' must be a non-empty array.", "messages")
    messages = [_message(m, i, plan) for i, m in enumerate(messages_raw)]
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or not env.stream:
            raise _bad("'stream_options' is only allowed with stream: true.", "stream_options")
        value = opts.get("include_usage")
        if value is not None and not isinstance(value, bool):
            raise _bad("'stream_options.include_usage' must be a boolean.", "stream_options")
        include_usage = bool(value)
    req = CanonicalRequest(
        messages=messages,
        max_output_tokens=_output_limit(body, plan),
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        stream=env.stream,
        include_usage=include_usage,
        extensions=extensions,
    )
    _apply_options(req, body, plan)
    return req
