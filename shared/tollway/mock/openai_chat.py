"""The OpenAI Chat Completions wire format, as the mock speaks it."""

from __future__ import annotations

from typing import Any, Final

import orjson

from tollway.mock.content import JsonFormat, MockRequest, ToolReply, ToolSpec, content_text, pick_tool
from tollway.mock.wire import Reply, RequestError, StreamPlan

__all__ = ["OpenAIChat"]

_ERROR_KINDS: Final = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "overloaded"),
}
_CHUNK_OPEN: Final = b',"logprobs":null,"finish_reason":'
_DONE: Final = b"data: [DONE]\n\n"
_TOOL_ID_MAX: Final = 40


def _error_kind(status: int) -> tuple[str, str]:
    kind = _ERROR_KINDS.get(status)
    if kind is not None:
        return kind
    return ("server_error", "server_error") if status >= 500 else ("invalid_request_error", "invalid_request")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _check_tool_ids(messages: list[dict[str, Any]]) -> None:
    """Refuse, in OpenAI's words, a tool call id over 40 characters and an assistant turn's calls
    that the tool messages after it do not all answer."""
    pending: list[str] = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        fields = [("tool_call_id", message.get("tool_call_id"))]
        if isinstance(calls, list):
            fields += [(f"tool_calls[{k}].id", c.get("id")) for k, c in enumerate(calls) if isinstance(c, dict)]
        for field, value in fields:
            if isinstance(value, str) and len(value) > _TOOL_ID_MAX:
                raise RequestError(
                    f"Invalid 'messages[{i}].{field}': string too long. Expected a string with maximum length "
                    f"{_TOOL_ID_MAX}, but got a string with length {len(value)} instead.",
                    f"messages[{i}].{field}",
                )
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in pending:
                raise RequestError(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    f"messages[{i}].role",
                )
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise RequestError(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
                f"messages[{i}].role",
            )
        pending = [str(c.get("id")) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


class OpenAIChat:
    name = "openai"
    request_id_header = b"x-request-id"
    malformed_frame = b"data: {not json\n\n"
    terminal_frame = _DONE

    def parse(self, body: dict[str, Any]) -> MockRequest:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("you must provide a model parameter", "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("'messages' must be a non-empty array of objects", "messages")
        if len(messages) > 1:
            _check_tool_ids(messages)
        texts = [content_text(m.get("content")) for m in messages]
        echo = next(
            (texts[i] for i in reversed(range(len(messages))) if messages[i].get("role") in ("user", "tool")), ""
        )
        options = body.get("stream_options")
        return MockRequest(
            model=model,
            stream=body.get("stream") is True,
            message_count=len(messages),
            echo=echo,
            prompt_chars=sum(map(len, texts)),
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
            max_tokens=_max_tokens(body),
            tool=self._tool(body, messages[-1]),
            json_format=_json_format(body.get("response_format")),
        )

    @staticmethod
    def _tool(body: dict[str, Any], last: dict[str, Any]) -> ToolSpec | None:
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if not isinstance(tools, list) or not tools or choice == "none" or last.get("role") in ("tool", "function"):
            return None
        forced = None
        if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            forced = choice["function"].get("name")
        functions = [t.get("function") for t in tools if isinstance(t, dict)]
        tool = pick_tool(functions, forced if isinstance(forced, str) else None, "parameters")
        if tool is None:
            raise RequestError(f"tool_choice names a tool that is not in tools: {forced!r}", "tool_choice")
        return tool

    def authorized(self, bearer: bool, api_key: bool) -> bool:
        return bearer

    def error(self, status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
        kind, code = (error_type, error_type) if error_type else _error_kind(status)
        return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})

    def midstream_error(self, error_type: str | None) -> bytes:
        kind = error_type or "server_error"
        error = {"message": "Mock midstream error", "type": kind, "param": None, "code": kind}
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes:
        message: dict[str, Any]
        if isinstance(reply, ToolReply):
            call = {"id": f"call_mock{seq}", "type": "function", "function": _function(reply)}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": reply.text}
            finish = "length" if reply.truncated else "stop"
        return orjson.dumps(
            {
                "id": f"chatcmpl-mock{seq}",
                "object": "chat.completion",
                "created": created,
                "model": req.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": _usage(req, reply),
            }
        )

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan:
        head = b'data: {"id":"chatcmpl-mock%d","object":"chat.completion.chunk","created":%d,"model":%s,' % (
            seq,
            created,
            orjson.dumps(req.model),
        )
        open_delta = head + b'"choices":[{"index":0,"delta":'
        close = b"}]" + (b',"usage":null' if req.include_usage else b"") + b"}\n\n"
        close_delta = _CHUNK_OPEN + b"null" + close
        deltas: list[bytes]
        if isinstance(reply, ToolReply):
            header = {"index": 0, "id": f"call_mock{seq}", "type": "function", "function": _function(reply, "")}
            first = orjson.dumps({"role": "assistant", "content": None, "tool_calls": [header]})
            deltas = [
                open_delta
                + orjson.dumps({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})
                + close_delta
                for fragment in reply.fragments
            ]
            finish = b'"tool_calls"'
        else:
            first = b'{"role":"assistant","content":""}'
            deltas = [open_delta + orjson.dumps({"content": piece}) + close_delta for piece in reply.deltas]
            finish = b'"length"' if reply.truncated else b'"stop"'
        tail = open_delta + b"{}" + _CHUNK_OPEN + finish + close
        if req.include_usage:
            tail += head + b'"choices":[],"usage":' + orjson.dumps(_usage(req, reply)) + b"}\n\n"
        return StreamPlan(open_delta + first + close_delta, deltas, tail + _DONE)


def _json_format(raw: Any) -> JsonFormat | None:
    """``response_format``: ``text`` (or none) is a text reply; ``json_object`` and ``json_schema`` a JSON one."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat()
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise RequestError("response_format.json_schema must be an object with a name", "response_format")
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be an object", "response_format")
        return JsonFormat(schema)
    raise RequestError("response_format.type must be one of text, json_object, json_schema", "response_format")


def _function(reply: ToolReply, arguments: str | None = None) -> dict[str, str]:
    return {"name": reply.name, "arguments": reply.arguments if arguments is None else arguments}


def _usage(req: MockRequest, reply: Reply) -> dict[str, int]:
    prompt = req.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": prompt + reply.completion_tokens,
    }
