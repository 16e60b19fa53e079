"""The OpenAI Chat Completions front end: ``POST /v1/chat/completions`` bodies in, its JSON,
``chat.completion.chunk`` frames and error envelope out. Pure, like the provider codecs."""

from __future__ import annotations

from tollway.api.chat_request import parse_body, to_canonical
from tollway.api.chat_response import ChunkRenderer, render_completion
from tollway.api.errors import error_body, error_headers
from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    StreamEvent,
    StreamFinish,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from tollway.exceptions import GatewayError
from tollway.pipeline.frontend import ErrorReply, HeaderGetter, Resolve, ResponseMeta
from tollway.sse import DONE

__all__ = ["CHAT_COMPLETIONS", "ChatCompletions"]


def _response_id(meta: ResponseMeta) -> str:
    return "chatcmpl-" + meta.request_id[4:]


class _ChunkStream:
    """One stream's frames. The finish frame is held back and leaves in one write with the usage
    and ``[DONE]`` frames: providers send those back to back, and each write is a syscall."""

    __slots__ = ("_held", "_include_usage", "_renderer")

    def __init__(self, renderer: ChunkRenderer, include_usage: bool) -> None:
        self._renderer = renderer
        self._include_usage = include_usage
        self._held = b""

    def event(self, ev: StreamEvent) -> bytes:
        kind = type(ev)
        if kind is TextDelta:
            out = self._held + self._renderer.text(ev.text)  # type: ignore[union-attr]
        elif kind is ToolCallDelta:
            out = self._held + self._renderer.tool_call(ev)  # type: ignore[arg-type]
        elif kind is StreamFinish:
            self._held += self._renderer.finish(ev.reason)  # type: ignore[union-attr]
            return b""
        else:
            return b""
        self._held = b""
        return out

    def end(self, usage: Usage) -> bytes:
        out = self._held + self._renderer.usage(usage) if self._include_usage else self._held
        self._held = b""
        return out + DONE

    def error(self, err: GatewayError) -> bytes:
        out = self._held + ChunkRenderer.error(err)
        self._held = b""
        return out


class ChatCompletions:
    name = "openai-chat-completions"
    api_key_header: str | None = None

    def check_headers(self, headers: HeaderGetter) -> None:
        return None

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> CanonicalRequest:
        env = parse_body(raw)
        return to_canonical(env, resolve(env.model, env.stream))

    def encode_response(self, meta: ResponseMeta, resp: CanonicalResponse, req: CanonicalRequest) -> bytes:
        return render_completion(_response_id(meta), meta.created, meta.model, resp)

    def encode_stream(self, meta: ResponseMeta, req: CanonicalRequest) -> _ChunkStream:
        renderer = ChunkRenderer(_response_id(meta), meta.created, meta.model, req.include_usage)
        return _ChunkStream(renderer, req.include_usage)

    def encode_error(self, err: GatewayError) -> ErrorReply:
        return ErrorReply(err.status, error_headers(err), error_body(err))


CHAT_COMPLETIONS = ChatCompletions()
