"""The Anthropic Messages wire format, as the mock speaks it."""

from __future__ import annotations

from typing import Any, Final

import orjson

from tollway.mock.content import MockRequest, ToolReply, ToolSpec, content_text, pick_tool
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
_TEXT_BLOCK_START: Final = (
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
)
_PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'
_TEXT_DELTA: Final = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
)
_JSON_DELTA: Final = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":'
)
_BLOCK_STOP: Final = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
_MESSAGE_STOP: Final = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


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
        return MockRequest(
            model=model,
            stream=body.get("stream") is True,
            message_count=len(messages),
            echo=echo,
            prompt_chars=sum(map(len, texts)) + len(content_text(body.get("system"))),
            max_tokens=max_tokens,
            tool=self._tool(body, messages[-1]),
        )

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
        content: dict[str, Any]
        if isinstance(reply, ToolReply):
            arguments = orjson.Fragment(reply.arguments)
            content = {"type": "tool_use", "id": f"toolu_mock{seq:016d}", "name": reply.name, "input": arguments}
            stop = "tool_use"
        else:
            content = {"type": "text", "text": reply.text}
            stop = "max_tokens" if reply.truncated else "end_turn"
        return orjson.dumps(
            {
                "id": f"msg_mock{seq:016d}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": [content],
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": _usage(req.prompt_tokens, reply.completion_tokens),
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
            "usage": _usage(req.prompt_tokens, 1),
        }
        start = _frame(b"message_start", {"type": "message_start", "message": message})
        if isinstance(reply, ToolReply):
            block = {"type": "tool_use", "id": f"toolu_mock{seq:016d}", "name": reply.name, "input": {}}
            block_start = _frame(
                b"content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
            )
            deltas = [_JSON_DELTA + orjson.dumps(fragment) + b"}}\n\n" for fragment in reply.fragments]
            stop = "tool_use"
        else:
            block_start = _TEXT_BLOCK_START
            deltas = [_TEXT_DELTA + orjson.dumps(piece) + b"}}\n\n" for piece in reply.deltas]
            stop = "max_tokens" if reply.truncated else "end_turn"
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": reply.completion_tokens},
        }
        tail = _BLOCK_STOP + _frame(b"message_delta", message_delta) + _MESSAGE_STOP
        return StreamPlan(start + block_start + _PING, deltas, tail)


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }
