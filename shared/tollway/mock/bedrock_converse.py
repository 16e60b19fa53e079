"""The Amazon Bedrock Converse wire format, as the mock speaks it.

Routes are ``POST /model/{modelId}/converse`` (one JSON answer) and ``POST
/model/{modelId}/converse-stream`` (an AWS event stream, ``application/vnd.amazon.eventstream``).
The model and the choice of stream are in the path, not the body: :func:`route` reads them, and the
app hands them to :meth:`BedrockConverse.parse` as the body's ``model`` and ``stream`` keys (which a
real Converse body never has), so its request log and per-model faults work as for the other formats.

Requests must carry an ``Authorization: AWS4-HMAC-SHA256 …`` header, always, as Bedrock requires a
signature; the signature itself is not checked. Errors are Bedrock's: the exception's name in
``x-amzn-ErrorType`` (:meth:`BedrockConverse.error_headers`) and ``{"message": …}`` as the body.
The checks Bedrock makes that a gateway's encoding could break are made too: at least one message,
the first from the user, roles alternating, no blank text block, ``toolUse`` and ``toolResult``
blocks only with a ``toolConfig``, ``maxTokens`` of at least 1.

The event stream is framed here, not by ``tollway.eventstream``: the mock imports nothing of the
gateway, so a framing bug there cannot hide in both. Each message has the three headers Bedrock
sends (``:event-type``, ``:content-type``, ``:message-type``); ``no_done`` has no effect, as a
ConverseStream has no end marker (its last event, ``metadata``, carries the usage).

Extended thinking, as Claude on Bedrock takes it: ``additionalModelRequestFields.thinking``
(``enabled``, ``budget_tokens`` of at least 1024) opens the answer with a ``reasoningContent`` block
(:func:`tollway.mock.content.thinking`), streamed as ``reasoningContent`` text deltas and a
signature delta of content block 0. A ``reasoningText`` block sent back in an assistant turn must
carry the signature the mock gave its text, or the request is refused. The
``corrupt_frame`` fault breaks one message's framing (:func:`corrupt_frame`): a CRC that does not
hold, which only an event stream can have.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from typing import Any, Final
from urllib.parse import unquote

import orjson

from tollway.mock.content import MockRequest, ToolReply, ToolSpec, pick_tool, thinking, thinking_signature
from tollway.mock.wire import Reply, RequestError, StreamPlan

__all__ = ["BedrockConverse", "context_refusal", "corrupt_frame", "encode_frame", "route", "signed"]

_ROUTE: Final = re.compile(r"/model/([^/]+)/(converse|converse-stream)")
_EXCEPTIONS: Final = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_ERROR_TYPE_SUFFIX: Final = b":http://internal.amazon.com/coral/com.amazon.bedrock/"
_SIGV4_PREFIX: Final = b"AWS4-HMAC-SHA256 "
_FIRST_USER: Final = (
    "A conversation must start with a user message. Try again with a conversation that starts with a user message."
)
_ALTERNATE: Final = (
    "A conversation must alternate between user and assistant roles. "
    "Make sure the conversation alternates between user and assistant roles and try again."
)


def _constraint(field: str, rule: str) -> str:
    return f"1 validation error detected: Value at '{field}' failed to satisfy constraint: Member must have {rule}"


def route(path: str) -> tuple[str, bool] | None:
    """``(model id, stream)`` of a Converse path, the model id percent-decoded; ``None`` for any other path."""
    match = _ROUTE.fullmatch(path)
    if match is None:
        return None
    return unquote(match.group(1)), match.group(2) == "converse-stream"


def signed(authorization: bytes | None) -> bool:
    """Whether an ``Authorization`` value is a SigV4 signature (its validity is not checked)."""
    return authorization is not None and authorization.startswith(_SIGV4_PREFIX)


def context_refusal(used: int, limit: int) -> tuple[str, str | None]:
    """A context-length refusal in Bedrock's words, which give no counts; a ``ValidationException``."""
    del used, limit
    return "Input is too long for requested model.", "ValidationException"


@functools.lru_cache(maxsize=64)
def _headers(message_type: str, type_header: str, name: str) -> bytes:
    out = b""
    for key, value in ((type_header, name), (":content-type", "application/json"), (":message-type", message_type)):
        raw_key, raw_value = key.encode(), value.encode()
        out += bytes((len(raw_key),)) + raw_key + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    return out


def encode_frame(name: str, payload: bytes, *, exception: bool = False) -> bytes:
    """One event stream message: an event named ``name``, or an exception of that type."""
    headers = _headers("exception", ":exception-type", name) if exception else _headers("event", ":event-type", name)
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


def corrupt_frame(frames: bytes, mode: str = "crc") -> bytes:
    """``frames`` with the first message's framing broken: one bit of its message CRC flipped
    (``crc``), or of its prelude CRC (``prelude``), so a parser must reject it at that message."""
    if len(frames) < 16:
        return frames
    total = struct.unpack_from(">I", frames)[0]
    at = 8 if mode == "prelude" else min(total, len(frames)) - 1
    return frames[:at] + bytes((frames[at] ^ 0x01,)) + frames[at + 1 :]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return encode_frame(name, orjson.dumps(data))


_MESSAGE_START: Final = _event("messageStart", {"role": "assistant"})
_MIN_THINKING_BUDGET: Final = 1024
_TOOL_USE_ID: Final = re.compile(r"[a-zA-Z0-9_-]+")
_TOOL_USE_ID_MAX: Final = 64


def _thinking_enabled(fields: Any) -> bool:
    raw = fields.get("thinking") if isinstance(fields, dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "enabled":
        return False
    budget = raw.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < _MIN_THINKING_BUDGET:
        raise RequestError(
            "The model returned the following errors: thinking.enabled.budget_tokens: "
            f"Input should be greater than or equal to {_MIN_THINKING_BUDGET}"
        )
    return True


def _check_reasoning(messages: list[dict[str, Any]]) -> None:
    """Refuse reasoning sent back with another signature than the one the mock gave its text."""
    for i, message in enumerate(messages):
        for j, block in enumerate(message["content"]):
            reasoning = block.get("reasoningContent")
            if not isinstance(reasoning, dict) or "redactedContent" in reasoning:
                continue
            text_block = reasoning.get("reasoningText")
            text = text_block.get("text") if isinstance(text_block, dict) else None
            signature = text_block.get("signature") if isinstance(text_block, dict) else None
            if message["role"] != "assistant" or not isinstance(text, str) or signature != thinking_signature(text):
                raise RequestError(
                    f"The model returned the following errors: messages.{i}.content.{j}: "
                    "Invalid `signature` in `thinking` block"
                )


def _reasoning_frames(thought_deltas: tuple[str, ...], signature: str) -> bytes:
    """Content block 0: the reasoning text deltas, the signature delta and the block's stop."""
    frames = [
        _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": piece}}})
        for piece in thought_deltas
    ]
    signed = {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": signature}}}
    return b"".join(frames) + _event("contentBlockDelta", signed) + _event("contentBlockStop", {"contentBlockIndex": 0})


def _exception_name(status: int) -> str:
    return _EXCEPTIONS.get(status) or ("InternalServerException" if status >= 500 else "ValidationException")


def _block_text(block: Any) -> str:
    if not isinstance(block, dict):
        return ""
    text = block.get("text")
    if isinstance(text, str):
        return text
    result = block.get("toolResult")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        parts = (_block_text(b) or _json_text(b) for b in result["content"])
        return " ".join(p for p in parts if p)
    return ""


def _json_text(block: Any) -> str:
    value = block.get("json") if isinstance(block, dict) else None
    return orjson.dumps(value).decode() if value is not None else ""


def _text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return " ".join(t for t in (_block_text(b) for b in content) if t)


def _check_tool_use_id(block: dict[str, Any], at: str) -> None:
    """Refuse a ``toolUseId`` Bedrock's model refuses: 1 to 64 characters of ``[a-zA-Z0-9_-]``."""
    for kind in ("toolUse", "toolResult"):
        inner = block.get(kind)
        if not isinstance(inner, dict):
            continue
        value = inner.get("toolUseId")
        field = f"{at}.{kind}.toolUseId"
        if not isinstance(value, str) or len(value) > _TOOL_USE_ID_MAX:
            raise RequestError(_constraint(field, f"length less than or equal to {_TOOL_USE_ID_MAX}"))
        if not _TOOL_USE_ID.fullmatch(value):
            raise RequestError(
                f"1 validation error detected: Value at '{field}' failed to satisfy constraint: "
                "Member must satisfy regular expression pattern: [a-zA-Z0-9_-]+"
            )


def _check_tool_results(i: int, content: list[dict[str, Any]], asked: list[str]) -> None:
    """Refuse toolResult blocks that do not answer the previous turn's toolUse blocks, one each."""
    answered = [b["toolResult"].get("toolUseId") for b in content if isinstance(b.get("toolResult"), dict)]
    if len(answered) > len(asked):
        raise RequestError(
            f"The number of toolResult blocks at messages.{i}.content exceeds the number of toolUse blocks of "
            "previous turn."
        )
    missing = [u for u in asked if u not in answered]
    if missing:
        raise RequestError(
            f"Expected toolResult blocks at messages.{i}.content for the following Ids: {', '.join(missing)}"
        )


def _check_messages(messages: Any, has_tools: bool) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(_FIRST_USER)
    previous = None
    asked: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ("user", "assistant") or not isinstance(content, list) or not content:
            raise RequestError(f"messages.{i}: a message needs a role of user or assistant and a content list")
        if i == 0 and role != "user":
            raise RequestError(_FIRST_USER)
        if role == previous:
            raise RequestError(_ALTERNATE)
        previous = role
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise RequestError(f"messages.{i}: a content block must be an object")
            if "text" in block and not str(block["text"]).strip():
                raise RequestError(
                    "The text field in the ContentBlock object is blank. Add text to the text field, and try again."
                )
            if ("toolUse" in block or "toolResult" in block) and not has_tools:
                raise RequestError(
                    "The toolConfig field must be defined when using toolUse and toolResult content blocks."
                )
            _check_tool_use_id(block, f"messages.{i}.member.content.{j}.member")
        _check_tool_results(i, content, asked)
        asked = [b["toolUse"]["toolUseId"] for b in content if isinstance(b.get("toolUse"), dict)]
    return messages


class BedrockConverse:
    name = "bedrock"
    request_id_header = b"x-amzn-requestid"
    malformed_frame = encode_frame("contentBlockDelta", b"{not json")
    terminal_frame = b""
    stream_headers: Final = [(b"content-type", b"application/vnd.amazon.eventstream")]
    always_require_auth = True
    """Bedrock refuses every unsigned request, with or without the ``require_auth`` fault."""

    def parse(self, body: dict[str, Any]) -> MockRequest:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("The provided model identifier is invalid.")
        tool_config = body.get("toolConfig")
        messages = _check_messages(body.get("messages"), isinstance(tool_config, dict))
        config = body.get("inferenceConfig")
        max_tokens = config.get("maxTokens") if isinstance(config, dict) else None
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise RequestError(_constraint("inferenceConfig.maxTokens", "value greater than or equal to 1"))
        _check_reasoning(messages)
        texts = [_text(m["content"]) for m in messages]
        echo = next((texts[i] for i in reversed(range(len(messages))) if messages[i]["role"] == "user"), "")
        return MockRequest(
            model=model,
            stream=body.get("stream") is True,
            message_count=len(messages),
            echo=echo,
            prompt_chars=sum(map(len, texts)) + len(_text(body.get("system"))),
            max_tokens=max_tokens,
            tool=self._tool(tool_config, messages[-1]),
            thinking=_thinking_enabled(body.get("additionalModelRequestFields")),
        )

    @staticmethod
    def _tool(config: Any, last: dict[str, Any]) -> ToolSpec | None:
        if not isinstance(config, dict) or any("toolResult" in b for b in last["content"]):
            return None
        tools = config.get("tools")
        if not isinstance(tools, list) or not tools:
            raise RequestError(_constraint("toolConfig.tools", "length greater than or equal to 1"))
        specs = []
        for tool in tools:
            spec = tool.get("toolSpec") if isinstance(tool, dict) else None
            schema = spec.get("inputSchema") if isinstance(spec, dict) else None
            if isinstance(spec, dict) and isinstance(schema, dict):
                specs.append({"name": spec.get("name"), "schema": schema.get("json")})
        choice = config.get("toolChoice")
        forced_tool = choice.get("tool") if isinstance(choice, dict) else None
        forced = forced_tool.get("name") if isinstance(forced_tool, dict) else None
        tool = pick_tool(specs, forced if isinstance(forced, str) else None, "schema")
        if tool is None:
            raise RequestError(f"The tool {forced!r} named by toolChoice is not in toolConfig.tools.")
        return tool

    def authorized(self, bearer: bool, api_key: bool, sigv4: bool = False) -> bool:
        return sigv4

    def error(self, status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
        return orjson.dumps({"message": message})

    def error_headers(self, status: int, error_type: str | None = None) -> list[tuple[bytes, bytes]]:
        """``x-amzn-ErrorType`` of an error answer: the exception's name, as Bedrock writes it."""
        name = error_type or _exception_name(status)
        return [(b"x-amzn-errortype", name.encode() + _ERROR_TYPE_SUFFIX)]

    def midstream_error(self, error_type: str | None) -> bytes:
        name = error_type or "serviceUnavailableException"
        name = name[:1].lower() + name[1:]
        return encode_frame(
            name, orjson.dumps({"message": "Bedrock is unable to process your request."}), exception=True
        )

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes:
        content: list[dict[str, Any]] = []
        output_tokens = reply.completion_tokens
        if req.thinking:
            thought = thinking(req.echo)
            content.append(
                {"reasoningContent": {"reasoningText": {"text": thought.text, "signature": thought.signature}}}
            )
            output_tokens += thought.tokens
        if isinstance(reply, ToolReply):
            tool_use = {
                "toolUseId": f"tooluse_mock{seq:016d}",
                "name": reply.name,
                "input": orjson.Fragment(reply.arguments),
            }
            content.append({"toolUse": tool_use})
            stop = "tool_use"
        else:
            content.append({"text": reply.text})
            stop = "max_tokens" if reply.truncated else "end_turn"
        return orjson.dumps(
            {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": stop,
                "usage": _usage(req, output_tokens),
                "metrics": {"latencyMs": 0},
            }
        )

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan:
        preamble = _MESSAGE_START
        index, output_tokens = 0, reply.completion_tokens
        if req.thinking:
            thought = thinking(req.echo)
            preamble += _reasoning_frames(thought.deltas, thought.signature)
            index, output_tokens = 1, output_tokens + thought.tokens
        if isinstance(reply, ToolReply):
            start = {"toolUse": {"toolUseId": f"tooluse_mock{seq:016d}", "name": reply.name}}
            preamble += _event("contentBlockStart", {"contentBlockIndex": index, "start": start})
            deltas = [
                _event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": f}}})
                for f in reply.fragments
            ]
            stop = "tool_use"
        else:
            deltas = [
                _event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": p}}) for p in reply.deltas
            ]
            stop = "max_tokens" if reply.truncated else "end_turn"
        metadata = {"usage": _usage(req, output_tokens), "metrics": {"latencyMs": 0}}
        tail = _event("contentBlockStop", {"contentBlockIndex": index})
        tail += _event("messageStop", {"stopReason": stop}) + _event("metadata", metadata)
        return StreamPlan(preamble, deltas, tail)


def _usage(req: MockRequest, output_tokens: int) -> dict[str, int]:
    prompt = req.prompt_tokens
    return {"inputTokens": prompt, "outputTokens": output_tokens, "totalTokens": prompt + output_tokens}
