"""Parse an OpenAI Responses request body (``POST /v1/responses``) into a ``CanonicalRequest``.

One ``orjson.loads`` per request, then plain type checks, as ``chat_request`` does. A field or
key whose value is ``null`` is treated as absent. Nothing is dropped silently: what the canonical
types cannot carry yet is refused with ``unsupported_parameter`` naming its path, and error
messages name fields, never echo request values.

The gateway is stateless, so the Responses API's server-side state is refused, never ignored:
``store: true`` (``false`` or absent is served, and nothing is stored either way),
``previous_response_id``, ``conversation``, ``prompt``, ``background: true``, ``item_reference``
input items. So are the features the canonical request cannot carry: a non-empty ``include``,
``reasoning``, ``truncation`` other than ``disabled``, ``max_tool_calls``, ``top_logprobs``, a
``service_tier`` other than ``auto``/``default``, ``text.verbosity``, the prompt-cache fields,
``stream_options.include_obfuscation: true`` (the gateway writes no obfuscation padding), and
every built-in tool (``web_search``, ``file_search``, ``mcp``…): only function tools are served.

How the Responses shape lands in the canonical one (which is shaped after Chat Completions):

- ``input`` as a string is one user message; ``instructions`` becomes a leading ``system``
  message (an empty one is left out).
- A message item's content is a string or parts: ``input_text`` (and ``input_image``, user
  messages only) for user, system and developer; ``output_text`` and ``refusal`` for assistant
  history. A single text part collapses to a string; several stay separate ``TextPart`` parts. An
  assistant ``refusal`` part is the assistant's own words, so it becomes text: the canonical
  assistant message has no refusal field.
- ``function_call`` items become tool calls on an assistant message: consecutive calls join one
  message, and calls right after an assistant message item join that message, since a model turn
  of text then calls is how Responses writes one assistant turn. ``function_call_output`` items
  become ``tool`` messages; an output given as ``input_text`` parts keeps their text.
- ``id`` and ``status`` on input items are accepted and not used: a client resending a previous
  response's output items carries them, and they say nothing to the model.
- A function tool's ``strict`` is passed on as given. When it is absent, OpenAI's own Responses
  rewrites the schema into strict mode; the gateway does not rewrite a client's schema, so absent
  means the provider's default (non-strict on Chat-format routes). Send ``strict: true`` for strict.
- ``text.format`` ``json_schema`` becomes the same canonical ``ResponseFormat`` that Chat
  Completions' ``response_format.json_schema`` does (``name``, ``description``, ``schema``,
  ``strict``), so every codec sends both formats' requests the same way.
- Unknown top-level fields are refused, even ones the alias allowlists: ``allowedParameters``
  name Chat Completions fields, which only Chat-format routes forward, and a Responses field of
  the same name is not the same thing (the Anthropic front end refuses them for the same reason).
"""

from __future__ import annotations

from typing import Any, cast

from tollway.api.envelope import MAX_NAME as _MAX_NAME
from tollway.api.envelope import ParsedEnvelope, parse_body
from tollway.api.envelope import bad as _bad
from tollway.api.envelope import collapse as _collapse
from tollway.api.envelope import metadata as _metadata
from tollway.api.envelope import number as _number
from tollway.api.envelope import object_type as _kind
from tollway.api.envelope import require as _require
from tollway.api.envelope import shown as _shown
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

__all__ = ["BUILT_IN_TOOLS", "ParsedEnvelope", "parse_body", "to_canonical"]

_PROFILE = frozenset(
    {
        "model",
        "input",
        "instructions",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "metadata",
        "user",
    }
)
_DEFAULT_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "store": ((False,), "responses are not stored; send false or leave it out"),
    "background": ((False,), "background responses need stored state; send false or leave it out"),
    "include": (([],), "send an empty list or leave it out"),
    "truncation": (("disabled",), "only 'disabled' is served"),
    "service_tier": (("auto", "default"), "only 'auto' and 'default' are served"),
}
"""Fields served only at the value that asks for nothing: any other value is refused, naming why."""
_NOT_YET = frozenset(
    {
        "previous_response_id",
        "conversation",
        "prompt",
        "reasoning",
        "max_tool_calls",
        "top_logprobs",
        "context_management",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "safety_identifier",
        "moderation",
        "access_programs",
        "image",
    }
)
"""Responses fields the gateway cannot serve yet: refused with a message that says so."""
_NOT_YET_KEYS = frozenset({"prompt_cache_breakpoint", "phase", "annotations", "logprobs", "verbosity"})
_EMPTY_OK = frozenset({"annotations", "logprobs"})
"""Keys of resent output parts that carry nothing when empty, as this gateway writes them."""
BUILT_IN_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)
_MAX_ITEMS = 4096
_MAX_TOOLS = 128
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_IMAGE_DETAILS = frozenset({"auto", "low", "high"})

_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
_INPUT_TEXT_KEYS = frozenset({"type", "text"})
_OUTPUT_TEXT_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
_REFUSAL_KEYS = frozenset({"type", "refusal"})
_IMAGE_KEYS = frozenset({"type", "image_url", "detail", "file_id"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments", "id", "status"})
_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id", "status"})
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_SCHEMA_KEYS = frozenset({"type", "name", "description", "schema", "strict"})


def _not_yet(param: str, why: str = "") -> UnsupportedParameter:
    return UnsupportedParameter(f"'{param}' is not supported yet by this gateway{why}.", param=param)


def _check_keys(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse every key of ``obj`` outside ``allowed``; ``null`` values, and the empty lists a
    resent output part carries, pass."""
    for key, value in obj.items():
        if value is None or (key in allowed and (key not in _EMPTY_OK or value == [])):
            continue
        path = f"{where}.{key[:_MAX_NAME]}"
        if key in _NOT_YET_KEYS:
            raise _not_yet(path)
        raise UnsupportedParameter(f"'{path}' is not supported.", param=path)


def _string(obj: dict[str, Any], key: str, where: str, *, non_empty: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (non_empty and not value):
        raise _bad(f"{where}.{key} must be a {'non-empty ' if non_empty else ''}string.", f"{where}.{key}")
    return value


def _image(part: dict[str, Any], where: str, plan: AliasPlan) -> ImagePart:
    _require(plan, "vision", where)
    _check_keys(part, _IMAGE_KEYS, where)
    if part.get("file_id") is not None:
        raise _not_yet(f"{where}.file_id", "; send the image as image_url")
    url = _string(part, "image_url", where)
    reason = image_url_error(url, plan.image_url_policy)
    if reason is not None:
        raise _bad(f"{where}.image_url {reason}.", f"{where}.image_url")
    detail = part.get("detail")
    if detail is not None and detail not in _IMAGE_DETAILS:
        if detail == "original":
            raise _not_yet(f"{where}.detail", "; use auto, low or high")
        raise _bad(f"{where}.detail must be auto, low or high.", f"{where}.detail")
    return ImagePart(url, detail)


def _parts(content: list[Any], role: str, where: str, plan: AliasPlan) -> list[ContentPart]:
    assistant = role == "assistant"
    parts: list[ContentPart] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = _kind(part, at)
        if kind == "input_text" and not assistant:
            _check_keys(part, _INPUT_TEXT_KEYS, at)
            parts.append(TextPart(_string(part, "text", at)))
        elif kind == "input_image" and role == "user":
            parts.append(_image(part, at, plan))
        elif kind == "output_text" and assistant:
            _check_keys(part, _OUTPUT_TEXT_KEYS, at)
            parts.append(TextPart(_string(part, "text", at)))
        elif kind == "refusal" and assistant:
            _check_keys(part, _REFUSAL_KEYS, at)
            parts.append(TextPart(_string(part, "refusal", at)))
        elif kind in ("input_text", "input_image", "output_text", "refusal"):
            raise _bad(f"{at}: {kind} parts are not allowed in {role} messages.", f"{at}.type")
        else:
            raise UnsupportedParameter(
                f"Content part type {_shown(kind)} is not supported yet by this gateway.", param=f"{at}.type"
            )
    return parts


def _message(item: dict[str, Any], where: str, plan: AliasPlan) -> Message:
    _check_keys(item, _MESSAGE_KEYS, where)
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{where}.role must be one of user, assistant, system, developer.", f"{where}.role")
    if isinstance(content, str):
        return Message(cast(Role, role), content)
    if not isinstance(content, list) or not content:
        raise _bad(f"{where}.content must be a string or a non-empty array of parts.", f"{where}.content")
    return Message(cast(Role, role), _collapse(_parts(content, role, where, plan)))


def _function_call(item: dict[str, Any], where: str) -> ToolCall:
    _check_keys(item, _CALL_KEYS, where)
    call_id = _string(item, "call_id", where, non_empty=True)
    name = _string(item, "name", where, non_empty=True)
    return ToolCall(call_id, name, _string(item, "arguments", where))


def _function_output(item: dict[str, Any], where: str) -> Message:
    _check_keys(item, _OUTPUT_KEYS, where)
    call_id = _string(item, "call_id", where, non_empty=True)
    output = item.get("output")
    if isinstance(output, str):
        return Message("tool", output, tool_call_id=call_id)
    if not isinstance(output, list):
        raise _bad(f"{where}.output must be a string or an array of parts.", f"{where}.output")
    parts: list[ContentPart] = []
    for j, part in enumerate(output):
        at = f"{where}.output[{j}]"
        kind = _kind(part, at)
        if kind != "input_text":
            raise UnsupportedParameter(
                f"Function output part type {_shown(kind)} is not supported yet by this gateway.", param=f"{at}.type"
            )
        _check_keys(part, _INPUT_TEXT_KEYS, at)
        parts.append(TextPart(_string(part, "text", at)))
    return Message("tool", _collapse(parts) if parts else "", tool_call_id=call_id)


def _input(raw: Any, plan: AliasPlan) -> list[Message]:
    if isinstance(raw, str):
        return [Message("user", raw)]
    if not isinstance(raw, list) or not raw or len(raw) > _MAX_ITEMS:
        raise _bad(f"'input' must be a string or a non-empty array of at most {_MAX_ITEMS} items.", "input")
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object.", where)
        kind = item.get("type")
        if kind is None or kind == "message":
            out.append(_message(item, where, plan))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or ()), call]
            else:
                out.append(Message("assistant", None, tool_calls=[call]))
        elif kind == "function_call_output":
            out.append(_function_output(item, where))
        elif isinstance(kind, str):
            raise UnsupportedParameter(
                f"Input item type {_shown(kind)} is not supported yet by this gateway.", param=f"{where}.type"
            )
        else:
            raise _bad(f"{where}.type must be a string.", f"{where}.type")
    return out


def _instructions(raw: Any) -> Message | None:
    if not isinstance(raw, str):
        raise _bad("'instructions' must be a string.", "instructions")
    return Message("system", raw) if raw else None


def _tool(tool: Any, where: str) -> ToolDefinition:
    kind = _kind(tool, where)
    if kind != "function":
        if kind in BUILT_IN_TOOLS:
            message = f"Built-in tool {_shown(kind)} is not served by this gateway yet; only function tools are."
        else:
            message = f"Tool type {_shown(kind)} is not supported yet by this gateway; only function tools are."
        raise UnsupportedParameter(message, param=f"{where}.type")
    _check_keys(tool, _TOOL_KEYS, where)
    name = _string(tool, "name", where, non_empty=True)
    desc, params, strict = tool.get("description"), tool.get("parameters"), tool.get("strict")
    if desc is not None and not isinstance(desc, str):
        raise _bad(f"{where}.description must be a string.", f"{where}.description")
    if params is not None and not isinstance(params, dict):
        raise _bad(f"{where}.parameters must be an object.", f"{where}.parameters")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{where}.strict must be a boolean.", f"{where}.strict")
    return ToolDefinition(name, desc, params, strict)


def _tools(raw: Any, plan: AliasPlan) -> list[ToolDefinition]:
    """Built-in tool types are refused first, naming ``tools[i].type``, whatever the alias can do."""
    if not isinstance(raw, list) or len(raw) > _MAX_TOOLS:
        raise _bad(f"'tools' must be an array of at most {_MAX_TOOLS} tools.", "tools")
    tools = [_tool(tool, f"tools[{j}]") for j, tool in enumerate(raw)]
    _require(plan, "tools", "tools")
    return tools


def _tool_choice(raw: Any, names: set[str]) -> ToolChoice:
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    if isinstance(raw, dict) and raw.get("type") == "function":
        _check_keys(raw, frozenset({"type", "name"}), "tool_choice")
        name = raw.get("name")
        if not isinstance(name, str) or name not in names:
            raise _bad("'tool_choice.name' must name one of the defined function tools.", "tool_choice.name")
        return ToolChoice("function", name)
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        raise UnsupportedParameter(
            f"Tool choice type {_shown(raw['type'])} is not supported yet by this gateway.", param="tool_choice.type"
        )
    raise _bad("'tool_choice' must be auto, none, required or a function choice.", "tool_choice")


def _json_schema(fmt: dict[str, Any], plan: AliasPlan) -> ResponseFormat:
    where = "text.format"
    _require(plan, "json_schema", where)
    _check_keys(fmt, _SCHEMA_KEYS, where)
    name, schema = _string(fmt, "name", where, non_empty=True), fmt.get("schema")
    desc, strict = fmt.get("description"), fmt.get("strict")
    if not isinstance(schema, dict):
        raise _bad(f"{where}.schema must be an object.", f"{where}.schema")
    if desc is not None and not isinstance(desc, str):
        raise _bad(f"{where}.description must be a string.", f"{where}.description")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{where}.strict must be a boolean.", f"{where}.strict")
    spec: dict[str, Any] = {"name": name}
    if desc is not None:
        spec["description"] = desc
    spec["schema"] = schema
    if strict is not None:
        spec["strict"] = strict
    return ResponseFormat("json_schema", spec)


def _text_format(raw: Any, plan: AliasPlan) -> ResponseFormat | None:
    if not isinstance(raw, dict):
        raise _bad("'text' must be an object.", "text")
    _check_keys(raw, frozenset({"format"}), "text")
    fmt = raw.get("format")
    if fmt is None:
        return None
    kind = _kind(fmt, "text.format")
    if kind == "text":
        _check_keys(fmt, frozenset({"type"}), "text.format")
        return None
    if kind == "json_object":
        _require(plan, "json_object", "text.format")
        _check_keys(fmt, frozenset({"type"}), "text.format")
        return ResponseFormat("json_object")
    if kind == "json_schema":
        return _json_schema(fmt, plan)
    raise _bad("'text.format.type' must be text, json_object or json_schema.", "text.format.type")


def _max_output_tokens(body: dict[str, Any], plan: AliasPlan) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad("'max_output_tokens' must be a positive integer.", "max_output_tokens")
    if value > plan.max_output_tokens:
        raise _bad(f"'max_output_tokens' exceeds this model's limit of {plan.max_output_tokens}.", "max_output_tokens")
    return value


_SAME_IN_CHAT = frozenset({"prompt_cache_key", "safety_identifier"})
"""Responses fields that Chat Completions has too, with the same meaning: an alias that allowlists
them (``allowedParameters``) gets them passed on, as a Chat Completions request would."""


def _refuse_unknown_fields(body: dict[str, Any], plan: AliasPlan) -> dict[str, Any]:
    """The fields the alias allowlists, to pass on; every other field outside the profile is refused."""
    extensions: dict[str, Any] = {}
    for key, value in body.items():
        if key in _PROFILE or value is None:
            continue
        if key in _SAME_IN_CHAT and key in plan.allowed_parameters:
            if not isinstance(value, str) or len(value) > 512:
                raise _bad(f"'{key}' must be a string of at most 512 characters.", key)
            extensions[key] = value
            continue
        served = _DEFAULT_ONLY.get(key)
        if served is not None:
            defaults, why = served
            if not any(value == d and type(value) is type(d) for d in defaults):
                raise _not_yet(key, f": {why}")
        elif key in _NOT_YET:
            raise _not_yet(key)
        else:
            raise UnsupportedParameter(f"Unsupported parameter: '{key[:_MAX_NAME]}'.", param=key[:_MAX_NAME])
    return extensions


def _stream_options(raw: Any, stream: bool) -> None:
    if not isinstance(raw, dict) or not stream:
        raise _bad("'stream_options' is only allowed with stream: true.", "stream_options")
    _check_keys(raw, frozenset({"include_obfuscation"}), "stream_options")
    obfuscation = raw.get("include_obfuscation")
    if obfuscation is not None and not isinstance(obfuscation, bool):
        raise _bad("'stream_options.include_obfuscation' must be a boolean.", "stream_options.include_obfuscation")
    if obfuscation:
        raise _not_yet("stream_options.include_obfuscation", "; send false")


def _apply_options(req: CanonicalRequest, body: dict[str, Any], plan: AliasPlan) -> None:
    if body.get("tools") is not None:
        req.tools = _tools(body["tools"], plan)
    if body.get("tool_choice") is not None:
        if not req.tools:
            raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
        req.tool_choice = _tool_choice(body["tool_choice"], {t.name for t in req.tools})
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise _bad("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
        req.parallel_tool_calls = parallel
    if body.get("text") is not None:
        req.response_format = _text_format(body["text"], plan)
    req.user = _user(body)
    if body.get("metadata") is not None:
        req.metadata = _metadata(body["metadata"])


def to_canonical(env: ParsedEnvelope, plan: AliasPlan) -> CanonicalRequest:
    """Check ``env`` against the alias's policy and build the canonical request. A Responses
    stream always ends with its usage (in ``response.completed``), so ``include_usage`` follows
    ``stream``."""
    body = env.body
    extensions = _refuse_unknown_fields(body, plan)
    if env.stream:
        _require(plan, "streaming", "stream")
    if body.get("stream_options") is not None:
        _stream_options(body["stream_options"], env.stream)
    if body.get("input") is None:
        raise _bad("'input' is required.", "input")
    messages = _input(body["input"], plan)
    system = _instructions(body["instructions"]) if body.get("instructions") is not None else None
    req = CanonicalRequest(
        messages=[system, *messages] if system is not None else messages,
        max_output_tokens=_max_output_tokens(body, plan),
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        stream=env.stream,
        include_usage=env.stream,
        extensions=extensions,
    )
    _apply_options(req, body, plan)
    return req
