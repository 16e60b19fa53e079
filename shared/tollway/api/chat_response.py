"""Render canonical results as OpenAI Chat Completions JSON and ``chat.completion.chunk`` frames.

Chunks are rendered by splicing a per-request prefix (id, created, model: built once) with
a small orjson-encoded delta, so a frame costs one small ``dumps`` and a bytes join.
"""

from __future__ import annotations

from typing import Any

import orjson

from tollway.api.errors import error_body
from tollway.canonical import CanonicalResponse, ToolCallDelta, Usage
from tollway.exceptions import GatewayError
from tollway.sse import encode_data

__all__ = ["ChunkRenderer", "render_completion", "usage_json"]


def usage_json(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_prompt_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_prompt_tokens}
    if usage.reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def render_completion(response_id: str, created: int, model: str, resp: CanonicalResponse) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": resp.content, "refusal": resp.refusal}
    if resp.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in resp.tool_calls
        ]
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": resp.finish_reason}],
    }
    if resp.usage is not None:
        body["usage"] = usage_json(resp.usage)
    return orjson.dumps(body)


class ChunkRenderer:
    """Renders one stream's frames. ``include_usage`` mirrors the client's ``stream_options``."""

    __slots__ = ("_head", "_include_usage", "_role_sent", "_tail", "_tail_finish_prefix")

    def __init__(self, response_id: str, created: int, model: str, include_usage: bool) -> None:
        self._head = (
            b'{"id":'
            + orjson.dumps(response_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":[{"index":0,"delta":'
        )
        usage_tail = b',"usage":null}' if include_usage else b"}"
        self._tail = b',"logprobs":null,"finish_reason":null}]' + usage_tail
        self._tail_finish_prefix = b',"logprobs":null,"finish_reason":'
        self._include_usage = include_usage
        self._role_sent = False

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        if not self._role_sent:
            self._role_sent = True
            return {"role": "assistant", **delta}
        return delta

    def text(self, text: str) -> bytes:
        delta = self._delta({"content": text})
        return encode_data(self._head + orjson.dumps(delta) + self._tail)

    def tool_call(self, ev: ToolCallDelta) -> bytes:
        call: dict[str, Any] = {"index": ev.index}
        if ev.id is not None:
            call["id"] = ev.id
            call["type"] = "function"
            call["function"] = {"name": ev.name or "", "arguments": ev.arguments}
        else:
            call["function"] = {"arguments": ev.arguments}
        delta = self._delta({"content": None, "tool_calls": [call]} if call.get("id") else {"tool_calls": [call]})
        return encode_data(self._head + orjson.dumps(delta) + self._tail)

    def finish(self, reason: str) -> bytes:
        delta = self._delta({})
        usage_tail = b',"usage":null}' if self._include_usage else b"}"
        return encode_data(
            self._head + orjson.dumps(delta) + self._tail_finish_prefix + orjson.dumps(reason) + b"}]" + usage_tail
        )

    def usage(self, usage: Usage) -> bytes:
        head = self._head[: self._head.index(b'"choices":')]
        return encode_data(head + b'"choices":[],"usage":' + orjson.dumps(usage_json(usage)) + b"}")

    @staticmethod
    def error(err: GatewayError) -> bytes:
        return encode_data(error_body(err))
