"""OpenAI Chat Completions answers for ``MockTransport``: the bodies a provider of the format that
test configs route to (``openai-chat-completions``) sends, so the real codec decodes them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tests.fakes.transport import End, MockResponse

__all__ = ["DONE", "completion", "delta", "error", "finish", "stream"]

DONE = b"data: [DONE]\n\n"


def completion(text: str = "Hello", *, prompt_tokens: int = 5, completion_tokens: int = 2) -> MockResponse:
    """A buffered answer with its usage."""
    return MockResponse.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def error(
    status: int,
    message: str = "upstream failure",
    *,
    kind: str = "server_error",
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> MockResponse:
    """An error status with OpenAI's error envelope (``kind`` is its ``type``)."""
    return MockResponse.json({"error": {"message": message, "type": kind, "code": code}}, status, headers)


def _frame(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def delta(text: str) -> bytes:
    """One SSE frame carrying a piece of the answer's text."""
    return _frame({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": text}}]})


def finish(reason: str = "stop") -> bytes:
    """The SSE frame that ends the answer, with its usage."""
    return _frame(
        {
            "id": "chatcmpl-1",
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


def stream(*texts: str, complete: bool = True, ends: End = "close") -> MockResponse:
    """A streamed answer, one frame per text; ``complete`` adds its finish and ``[DONE]``, and
    ``ends`` says what comes after the last frame (``connection_lost()``: a cut; ``"stall"``)."""
    chunks = [delta(t) for t in texts]
    if complete:
        chunks += [finish(), DONE]
    return MockResponse(200, {"Content-Type": "text/event-stream"}, chunks=chunks, ends=ends)
