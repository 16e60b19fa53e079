"""Codec for the Amazon Bedrock Converse API (``bedrock-runtime``, API version 2023-09-30).

One request shape serves every Bedrock chat model: ``POST model/{modelId}/converse`` answers with
one JSON document, ``POST model/{modelId}/converse-stream`` with an AWS event stream
(``tollway.eventstream`` frames it; ``framing`` tells the gateway which framing to use). The model id
is a path segment, percent-encoded here (``:`` and ``/`` of ARNs included), so the transport and its
SigV4 signer see the path exactly as it is sent.

Encoding reshapes the canonical request as the Anthropic codec does: system and developer
messages become ``system`` text blocks, tool results become ``toolResult`` blocks of a user turn,
and neighbouring turns of one role merge, since Converse requires user and assistant turns to
alternate. What Converse cannot carry is refused, never dropped: images by ``http(s)`` URL (Bedrock
takes bytes or an ``s3://`` location, and a codec fetches nothing), ``response_format`` other than
text, ``top_k`` (a model-specific field, not Converse's), and ``tool_choice: none`` once the
conversation holds tool calls (Converse has no ``none``: without tool calls the tools are simply not
sent; with them Bedrock requires ``toolConfig``). Two hints are
left out on purpose: ``parallel_tool_calls`` (Converse has no such switch) and cache breakpoints
(``cachePoint`` blocks are refused by models without prompt caching). ``user``, ``metadata`` and
``extensions`` are not forwarded: ``requestMetadata`` has a narrower grammar than clients' metadata.

Extended thinking is Converse's ``reasoningContent``. A thinking budget is sent as Anthropic's
``thinking`` in ``additionalModelRequestFields`` (the models that think on Bedrock take it there);
the answer's ``reasoningContent`` blocks (``reasoningText`` with its ``signature``, or encrypted
``redactedContent``) become canonical thinking blocks, and thinking blocks of an assistant turn go
back as ``reasoningContent`` with the signature unchanged, as Bedrock requires in a multi-turn
conversation. The codec decodes whatever reasoning the model returned: it cannot tell whether the
client asked (a model such as DeepSeek-R1 reasons unasked), and the client format decides whether to
show it (only Anthropic Messages does). In a stream, reasoning arrives as ``reasoningContent``
deltas of one content block (``text`` pieces, then one ``signature``; or ``redactedContent``);
a redacted block is reported whole when its content block stops.

Converse's ``inputTokens`` excludes the prompt tokens read from or written to the prompt cache;
the canonical prompt count includes them, so the codec adds them back. The buffered answer
carries no response id (Bedrock sends it only as the ``x-amzn-RequestId`` header).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal
from urllib.parse import quote

import orjson

from tollway.canonical import (
    SKIPPED,
    CanonicalRequest,
    CanonicalResponse,
    ContentPart,
    FinishReason,
    ImagePart,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingBlock,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.eventstream import EventStreamMessage
from tollway.exceptions import InvalidRequest, UnsupportedParameter, UpstreamCategory, UpstreamError
from tollway.providers.base import ProviderFormat, Target
from tollway.providers.openai_chat import (
    ErrorInfo,
    as_int,
    client_reason,
    describe,
    header,
    load_object,
    malformed,
    nonblank_parts,
    refine_category,
    retry_after,
    status_category,
    tool_arguments,
    truncated,
)
from tollway.providers.tool_ids import bedrock_tool_id
from tollway.wire import UpstreamRequest

__all__ = ["BedrockConverseCodec"]

_HEADERS: Final[Mapping[str, str]] = MappingProxyType({"content-type": "application/json"})
_STREAM_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {"content-type": "application/json", "accept": "application/vnd.amazon.eventstream"}
)

_FINISH: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}

_IMAGE_FORMATS: Final[Mapping[str, str]] = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}

_ERROR_TYPES: Final[Mapping[str, UpstreamCategory]] = {
    "throttlingexception": UpstreamCategory.RATE_LIMIT,
    "servicequotaexceededexception": UpstreamCategory.RATE_LIMIT,
    "validationexception": UpstreamCategory.INVALID_REQUEST,
    "modelnotreadyexception": UpstreamCategory.OVERLOADED,
    "serviceunavailableexception": UpstreamCategory.OVERLOADED,
    "accessdeniedexception": UpstreamCategory.PERMISSION,
    "unrecognizedclientexception": UpstreamCategory.AUTHENTICATION,
    "invalidsignatureexception": UpstreamCategory.AUTHENTICATION,
    "incompletesignatureexception": UpstreamCategory.AUTHENTICATION,
    "missingauthenticationtokenexception": UpstreamCategory.AUTHENTICATION,
    "expiredtokenexception": UpstreamCategory.AUTHENTICATION,
    "resourcenotfoundexception": UpstreamCategory.NOT_FOUND,
    "modeltimeoutexception": UpstreamCategory.TIMEOUT,
    "internalserverexception": UpstreamCategory.SERVER,
    "modelerrorexception": UpstreamCategory.SERVER,
    "modelstreamerrorexception": UpstreamCategory.SERVER,
}
"""By the lower-cased exception name: HTTP responses name it ``ThrottlingException``, stream
exception messages ``throttlingException``."""

_CONTEXT_MESSAGE: Final = re.compile(
    r"input is too long|too many (?:input )?tokens|input length .{0,40}exceeds|exceeds? the context window", re.I
)
"""Bedrock's own words for an over-long prompt; ``refine_category`` knows the models' (Anthropic's
"prompt is too long", OpenAI's "maximum context length")."""


class BedrockConverseCodec:
    """``POST model/{modelId}/converse`` or ``…/converse-stream`` relative to a base URL such as
    ``https://bedrock-runtime.us-east-1.amazonaws.com``. The transport adds the base URL and signs
    each request (SigV4, ``tollway.transport.sigv4``); the codec adds no credential."""

    format: ClassVar[ProviderFormat] = ProviderFormat.BEDROCK_CONVERSE
    framing: ClassVar[Literal["eventstream"]] = "eventstream"
    """How a stream's bytes are framed into the events ``decode_stream`` takes."""

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest:
        _refuse_unsupported(req)
        system, messages = _conversation(req.messages)
        body: dict[str, Any] = {"messages": messages}
        if system:
            body["system"] = system
        inference = {
            "maxTokens": req.max_output_tokens,
            "temperature": req.temperature,
            "topP": req.top_p,
            "stopSequences": req.stop or None,
        }
        inference = {k: v for k, v in inference.items() if v is not None}
        if inference:
            body["inferenceConfig"] = inference
        if req.tools:
            tool_config = _tool_config(req.tools, req.tool_choice, messages)
            if tool_config is not None:
                body["toolConfig"] = tool_config
        if req.thinking_budget is not None:
            body["additionalModelRequestFields"] = {
                "thinking": {"type": "enabled", "budget_tokens": req.thinking_budget}
            }
        model = quote(target.model, safe="")
        if req.stream:
            return UpstreamRequest(
                path=f"model/{model}/converse-stream", body=orjson.dumps(body), headers=_STREAM_HEADERS, stream=True
            )
        return UpstreamRequest(path=f"model/{model}/converse", body=orjson.dumps(body), headers=_HEADERS, stream=False)

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse:
        doc = load_object(body, status=status, what="response")
        output = doc.get("output")
        message = output.get("message") if isinstance(output, dict) else None
        blocks = message.get("content") if isinstance(message, dict) else None
        if not isinstance(blocks, list):
            raise malformed("response has no output.message.content list", status=status)
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[ThinkingBlock] = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if "text" in block:
                text = block["text"]
                if not isinstance(text, str):
                    raise malformed("text block has no text", status=status)
                texts.append(text)
            elif "toolUse" in block:
                calls.append(_decode_tool_use(block["toolUse"], status))
            elif "reasoningContent" in block:
                thinking.append(_decode_reasoning(block["reasoningContent"], status))
        stop = doc.get("stopReason")
        raw_usage = doc.get("usage")
        return CanonicalResponse(
            content="".join(texts) if texts or not calls else None,
            tool_calls=calls or None,
            finish_reason=_FINISH.get(stop, "stop") if isinstance(stop, str) else "stop",
            usage=_usage(raw_usage) if isinstance(raw_usage, dict) else None,
            thinking=thinking or None,
        )

    async def decode_stream(self, events: AsyncIterator[EventStreamMessage]) -> AsyncIterator[StreamEvent]:
        """Complete at ``metadata`` (the last event, with usage), or when the stream ends after
        ``messageStop`` gave its stop reason; ending before that is a truncation. An exception
        message ends the stream with the error it names. One event that does not decode, after one
        that did, is reported as ``SKIPPED``."""
        state = _StreamState()
        started = False
        async for message in events:
            if message.message_type != "event":
                raise _stream_error(message)
            try:
                doc = load_object(message.payload, status=None, what="stream event")
            except UpstreamError:
                if not started:
                    raise
                yield SKIPPED
                continue
            if not started:
                started = True
                yield StreamStart(None)
            kind = message.event_type
            if kind == "metadata":
                usage = doc.get("usage")
                if isinstance(usage, dict):
                    yield StreamUsage(_usage(usage))
                if state.finished:
                    return
                continue
            for event in state.apply(kind, doc):
                yield event
        if not state.finished:
            raise truncated("stream ended before its stop reason")

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError:
        info = _error_info(headers, body)
        category = status_category(status)
        if info.type is not None:
            category = _ERROR_TYPES.get(info.type.lower(), category)
        category = _refine(category, info)
        return UpstreamError(
            category,
            status=status,
            retry_after=retry_after(headers),
            detail=describe(info, body),
            reason=client_reason(category, info, body),
            reported=True,
        )


def _refuse_unsupported(req: CanonicalRequest) -> None:
    if req.response_format is not None and req.response_format.type != "text":
        raise UnsupportedParameter(
            f"response_format {req.response_format.type} is not supported by this model.", param="response_format"
        )
    if req.top_k is not None:
        raise UnsupportedParameter("'top_k' is not supported by this model.", param="top_k")


def _conversation(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``system`` blocks and the alternating turns, merging neighbours of the same role."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("system", "developer"):
            text = m.text()
            if text:
                system.append({"text": text})
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        if not m.tool_call_id:
            raise InvalidRequest("A tool message needs a tool_call_id.", param="messages")
        content = nonblank_parts(m.content, _part) or [{"text": ""}]
        return [{"toolResult": {"toolUseId": bedrock_tool_id(m.tool_call_id), "content": content}}]
    blocks = nonblank_parts(m.content, _part)  # Bedrock refuses a blank text block
    for call in m.tool_calls or ():
        blocks.append(
            {"toolUse": {"toolUseId": bedrock_tool_id(call.id), "name": call.name, "input": tool_arguments(call)}}
        )
    return blocks


def _part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    if isinstance(part, ImagePart):
        return {"image": _image(part.url)}
    if isinstance(part, ThinkingPart):
        reasoning: dict[str, str] = {"text": part.thinking}
        if part.signature:
            reasoning["signature"] = part.signature
        return {"reasoningContent": {"reasoningText": reasoning}}
    return {"reasoningContent": {"redactedContent": part.data}}


def _image(url: str) -> dict[str, Any]:
    """A base64 data URL's bytes (JSON carries Bedrock's blobs base64-encoded, as the URL has them)
    or an ``s3://`` location."""
    if url.startswith("data:"):
        head, comma, data = url[len("data:") :].partition(",")
        media_type, *params = head.split(";")
        if not comma or "base64" not in params or not media_type:
            raise InvalidRequest("An image data URL must be data:<media-type>;base64,<data>.", param="messages")
        image_format = _IMAGE_FORMATS.get(media_type.lower())
        if image_format is None:
            raise UnsupportedParameter(
                f"Images of type {media_type} are not supported by this model (png, jpeg, gif and webp are).",
                param="messages",
            )
        return {"format": image_format, "source": {"bytes": data}}
    if url.startswith("s3://"):
        suffix = url.rsplit(".", 1)[-1].lower()
        image_format = _IMAGE_FORMATS.get(f"image/{suffix}")
        if image_format is None:
            raise UnsupportedParameter(
                "An s3:// image must end in .png, .jpeg, .jpg, .gif or .webp for this model.", param="messages"
            )
        return {"format": image_format, "source": {"s3Location": {"uri": url}}}
    if url.startswith(("https://", "http://")):
        raise UnsupportedParameter(
            "Image URLs are not supported by this model; send the image as a base64 data URL.", param="messages"
        )
    raise InvalidRequest("An image URL must be an http(s) URL or a base64 data URL.", param="messages")


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name}
    if tool.description:
        spec["description"] = tool.description
    schema = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
    spec["inputSchema"] = {"json": schema}
    return {"toolSpec": spec}


def _tool_config(
    tools: list[ToolDefinition], choice: ToolChoice | None, turns: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """``toolConfig``, or ``None`` for ``tool_choice: none`` in a conversation without tool calls."""
    if choice is not None and choice.mode == "none":
        if any("toolUse" in b or "toolResult" in b for t in turns for b in t["content"]):
            raise UnsupportedParameter(
                "tool_choice none is not supported by this model once the conversation has tool calls.",
                param="tool_choice",
            )
        return None
    config: dict[str, Any] = {"tools": [_tool(t) for t in tools]}
    if choice is None or choice.mode == "auto":
        if choice is not None:
            config["toolChoice"] = {"auto": {}}
    elif choice.mode == "required":
        config["toolChoice"] = {"any": {}}
    else:
        if not choice.name:
            raise InvalidRequest("tool_choice of type function needs a function name.", param="tool_choice")
        config["toolChoice"] = {"tool": {"name": choice.name}}
    return config


def _decode_tool_use(block: object, status: int) -> ToolCall:
    if not isinstance(block, dict):
        raise malformed("toolUse block is not an object", status=status)
    call_id, name = block.get("toolUseId"), block.get("name")
    if not (isinstance(call_id, str) and isinstance(name, str)):
        raise malformed("toolUse block lacks a string toolUseId or name", status=status)
    return ToolCall(id=call_id, name=name, arguments=orjson.dumps(block.get("input", {})).decode())


def _decode_reasoning(block: object, status: int) -> ThinkingBlock:
    """A ``reasoningContent`` block, kept whole: the client must be able to send it back unchanged.
    A model that does not sign its reasoning (DeepSeek-R1) gives an empty signature."""
    if isinstance(block, dict):
        redacted = block.get("redactedContent")
        if isinstance(redacted, str) and redacted:
            return RedactedThinkingPart(redacted)
        reasoning = block.get("reasoningText")
        text = reasoning.get("text") if isinstance(reasoning, dict) else None
        if isinstance(text, str):
            signature = reasoning.get("signature") if isinstance(reasoning, dict) else None
            return ThinkingPart(text, signature if isinstance(signature, str) else "")
    raise malformed("reasoningContent block has neither reasoningText nor redactedContent", status=status)


def _usage(raw: Mapping[str, Any]) -> Usage:
    cache_read = as_int(raw.get("cacheReadInputTokens"))
    cache_write = as_int(raw.get("cacheWriteInputTokens"))
    return Usage(
        prompt_tokens=as_int(raw.get("inputTokens")) + cache_read + cache_write,
        completion_tokens=as_int(raw.get("outputTokens")),
        cached_prompt_tokens=cache_read,
        cache_creation_tokens=cache_write,
    )


def _error_info(headers: Mapping[str, str], body: bytes) -> ErrorInfo:
    """The exception name, from ``x-amzn-ErrorType`` (``ThrottlingException:http://…``) or the
    body's ``__type`` (``com.amazon…#ThrottlingException``), and the body's ``message``."""
    doc: object = None
    if body:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
    fields = doc if isinstance(doc, dict) else {}
    name = header(headers, "x-amzn-errortype")
    if name is None:
        raw = fields.get("__type") or fields.get("code")
        name = raw if isinstance(raw, str) else None
    if name is not None:
        name = name.split(":", 1)[0].rsplit("#", 1)[-1].strip() or None
    message = fields.get("message") or fields.get("Message")
    return ErrorInfo(name, None, message if isinstance(message, str) else "")


def _refine(category: UpstreamCategory, info: ErrorInfo) -> UpstreamCategory:
    if category is UpstreamCategory.INVALID_REQUEST and _CONTEXT_MESSAGE.search(info.message):
        return UpstreamCategory.CONTEXT_LENGTH
    return refine_category(category, info)


def _stream_error(message: EventStreamMessage) -> UpstreamError:
    """An ``exception`` message (``throttlingException``…) or an ``error`` one: the provider's own
    report, so ``reported``; an unknown exception counts as a server failure."""
    try:
        doc = orjson.loads(message.payload) if message.message_type == "exception" else None
    except orjson.JSONDecodeError:
        doc = None
    text = doc.get("message") if isinstance(doc, dict) else None
    if message.message_type == "error":
        text = message.payload.decode("utf-8", "replace")
    info = ErrorInfo(message.event_type, None, text if isinstance(text, str) else "")
    category = _ERROR_TYPES.get((message.event_type or "").lower(), UpstreamCategory.SERVER)
    category = _refine(category, info)
    return UpstreamError(
        category, detail="stream error " + describe(info, b""), reason=client_reason(category, info, b""), reported=True
    )


class _StreamState:
    """What a stream has told so far: which content blocks are tool calls or reasoning, and whether
    it finished."""

    __slots__ = ("args_seen", "finished", "redacted", "thinking", "tools")

    def __init__(self) -> None:
        self.tools: dict[int, int] = {}
        """Content block index → tool-call ordinal."""
        self.thinking: dict[int, int] = {}
        """Content block index → thinking block ordinal (redacted ones included)."""
        self.redacted: dict[int, bytearray] = {}
        """Redacted reasoning of a content block not yet stopped, decoded."""
        self.args_seen: set[int] = set()
        self.finished = False
        """``messageStop`` gave the stop reason: the answer is complete even without ``metadata``."""

    def apply(self, kind: str | None, doc: Mapping[str, Any]) -> list[StreamEvent]:
        """The canonical events of one upstream event; ``messageStart`` and event types Bedrock
        may add later carry none."""
        if kind == "messageStop":
            stop = doc.get("stopReason")
            self.finished = True
            pending: list[StreamEvent] = [
                RedactedThinking(self.thinking[i], base64.b64encode(data).decode("ascii"))
                for i, data in self.redacted.items()
            ]
            self.redacted.clear()
            return [*pending, StreamFinish(_FINISH.get(stop, "stop") if isinstance(stop, str) else "stop")]
        index = doc.get("contentBlockIndex")
        if not isinstance(index, int):
            return []
        if kind == "contentBlockDelta":
            return self._delta(index, doc.get("delta"))
        if kind == "contentBlockStart":
            return self._start(index, doc.get("start"))
        if kind == "contentBlockStop" and index in self.redacted:
            data = base64.b64encode(self.redacted.pop(index)).decode("ascii")
            return [RedactedThinking(self.thinking[index], data)]
        if kind == "contentBlockStop" and index in self.tools and self.tools[index] not in self.args_seen:
            return [ToolCallDelta(index=self.tools[index], arguments="{}")]
        return []

    def _start(self, index: int, start: object) -> list[StreamEvent]:
        tool = start.get("toolUse") if isinstance(start, dict) else None
        if not isinstance(tool, dict):
            return []
        call_id, name = tool.get("toolUseId"), tool.get("name")
        if not (isinstance(call_id, str) and isinstance(name, str)):
            raise malformed("toolUse start lacks a string toolUseId or name")
        ordinal = self.tools[index] = len(self.tools)
        return [ToolCallDelta(index=ordinal, id=call_id, name=name)]

    def _delta(self, index: int, delta: object) -> list[StreamEvent]:
        if not isinstance(delta, dict):
            return []
        text = delta.get("text")
        if isinstance(text, str):
            return [TextDelta(text)] if text else []
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            return self._reasoning(index, reasoning)
        tool = delta.get("toolUse")
        if isinstance(tool, dict) and index in self.tools:
            fragment = tool.get("input")
            if isinstance(fragment, str) and fragment:
                self.args_seen.add(self.tools[index])
                return [ToolCallDelta(index=self.tools[index], arguments=fragment)]
        return []

    def _reasoning(self, index: int, delta: Mapping[str, Any]) -> list[StreamEvent]:
        """One ``reasoningContent`` delta: a piece of text, the signature, or redacted content
        (kept until the block stops: its pieces are base64 of byte chunks, not of one string)."""
        text, signature, redacted = delta.get("text"), delta.get("signature"), delta.get("redactedContent")
        opened = index not in self.thinking
        ordinal = self.thinking.setdefault(index, len(self.thinking))
        if isinstance(redacted, str):
            try:
                self.redacted.setdefault(index, bytearray()).extend(base64.b64decode(redacted, validate=True))
            except binascii.Error:
                raise malformed("redactedContent is not base64") from None
            return []
        if isinstance(text, str) and (text or opened):
            return [ThinkingDelta(ordinal, thinking=text)]
        if isinstance(signature, str) and signature:
            return [ThinkingDelta(ordinal, signature=signature)]
        return [ThinkingDelta(ordinal)] if opened else []
