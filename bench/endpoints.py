"""The APIs a benchmark calls: one :class:`Endpoint` per kind.

Four are client APIs the gateway serves (chat, messages, responses, embeddings), which a step names.
Two more are provider APIs only the direct baseline calls, on the mock (``gemini``: ``generateContent``,
``bedrock``: Converse): they name the model and whether to stream in the path, and are what the
gateway's chat alias calls when a profile sets ``gateway.provider_format`` (:func:`direct_kind`).

An endpoint kind holds everything that differs between ``POST /v1/chat/completions``,
``/v1/messages``, ``/v1/responses`` and ``/v1/embeddings`` from the load generator's point of view:

- the path under the ``/v1`` base, and the headers the official SDKs send: the key as a bearer
  token, or in ``x-api-key`` with ``anthropic-version`` for Anthropic's;
- the request body, built from a payload file (``bench/payloads/``, chat-shaped for the three chat
  APIs) the way an application writes the same request in that API; a payload field the API has
  no place for is an error, never dropped;
- how an answer is judged complete: a 2xx read to its end, and for SSE the format's terminal frame
  (``data: [DONE]``, ``event: message_stop``, ``event: response.completed``);
- which frame is the first token, for TTFT.

The two tests are byte scans over each body chunk (with the previous chunk's tail), not SSE parses:
the load generator shares two cores with the gateway, and a JSON parse per frame would cost more
than some of what it measures. Chat's scan is the one the harness always used.

``upstream`` names the kind of the mock endpoint that the gateway's bench alias for this kind calls,
which is the direct baseline: messages go to the mock's ``/v1/messages`` (an Anthropic-format
route, same format end to end), responses to its ``/v1/chat/completions`` (the gateway translates
Responses to Chat Completions upstream), embeddings to its ``/v1/embeddings``. A chat alias routed to
Gemini or Bedrock moves the baseline of chat and responses to that API (:func:`direct_kind`).

Bedrock requires a SigV4 ``Authorization`` on every request. The mock checks only its scheme
(``AWS4-HMAC-SHA256 ``), not the signature, so the direct baseline sends one fixed header of a real
signature's shape, computed once (:func:`sigv4_headers`); the gateway signs each request, and that
signing is part of what it adds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import quote

__all__ = [
    "ANTHROPIC_VERSION",
    "ENDPOINTS",
    "PROVIDER_FORMATS",
    "ClientEndpointName",
    "Endpoint",
    "EndpointName",
    "ProviderFormat",
    "direct_kind",
    "endpoint_kind",
    "has_content",
    "has_event",
    "sigv4_headers",
]

ClientEndpointName = Literal["chat", "messages", "responses", "embeddings"]
"""The client APIs the gateway serves: what a step calls it on."""
EndpointName = Literal["chat", "messages", "responses", "embeddings", "gemini", "bedrock"]
ProviderFormat = Literal["openai-chat-completions", "gemini", "bedrock-converse"]
"""The formats the gateway's chat alias can be routed in (``gateway.provider_format``)."""
PROVIDER_FORMATS: Final[Mapping[str, EndpointName]] = {
    "openai-chat-completions": "chat",
    "gemini": "gemini",
    "bedrock-converse": "bedrock",
}
"""The mock endpoint kind that speaks each provider format."""

ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 1024
"""``max_tokens`` for a messages body whose payload sets none (Anthropic requires it)."""

_CHAT_CONTENT: Final = (b'"content":"', b'"text":"', b'"arguments":"', b'"partial_json":"')
_MESSAGES_CONTENT: Final = (b'"text_delta","text":"', b'"input_json_delta","partial_json":"')
_GEMINI_CONTENT: Final = (b'"parts":[{"text":"', b'"functionCall":{"name":"')
_GEMINI_FINISH: Final = b'"finishReason":"'
"""Gemini's stream has no end marker: its last chunk is the one with a ``finishReason``."""
_BEDROCK_CONTENT: Final = (b'"delta":{"text":"', b'"delta":{"toolUse":{"input":"')
_BEDROCK_METADATA: Final = b":event-type\x07\x00\x08metadata"
"""The ``:event-type`` header of a ConverseStream's last event, ``metadata`` (a string header,
type 7, of 8 bytes), as the AWS event stream frames it."""
_SIGV4_DATE: Final = "20250101T000000Z"
_RESPONSES_DELTAS: Final = (
    b"event: response.output_text.delta\n",
    b"event: response.function_call_arguments.delta\n",
)


def has_content(data: bytes, markers: tuple[bytes, ...] = _CHAT_CONTENT) -> bool:
    """True when ``data`` holds one of ``markers`` (each ends with a JSON string's opening quote)
    followed by a non-empty string."""
    for marker in markers:
        at = data.find(marker)
        while at >= 0:
            end = at + len(marker)
            if end < len(data) and data[end] != 0x22:  # '"' would be an empty string
                return True
            at = data.find(marker, end)
    return False


def has_event(data: bytes, events: tuple[bytes, ...]) -> bool:
    """True when ``data`` holds one of ``events``, each a whole ``event: NAME\\n`` line."""
    return any(event in data for event in events)


def _messages_content(data: bytes) -> bool:
    return has_content(data, _MESSAGES_CONTENT)


def _responses_delta(data: bytes) -> bool:
    return has_event(data, _RESPONSES_DELTAS)


def _gemini_content(data: bytes) -> bool:
    return has_content(data, _GEMINI_CONTENT)


def _bedrock_content(data: bytes) -> bool:
    return has_content(data, _BEDROCK_CONTENT)


def sigv4_headers(key: str) -> dict[str, str]:
    """A fixed ``Authorization`` of SigV4's shape (and its ``x-amz-date``), for the direct baseline to
    Bedrock's mock, which checks the scheme but not the signature."""
    signature = hashlib.sha256(key.encode()).hexdigest()
    scope = f"{_SIGV4_DATE[:8]}/us-east-1/bedrock/aws4_request"
    return {
        "authorization": (
            f"AWS4-HMAC-SHA256 Credential=BENCH/{scope}, SignedHeaders=content-type;host;x-amz-date, "
            f"Signature={signature}"
        ),
        "x-amz-date": _SIGV4_DATE,
    }


Payload = Mapping[str, Any]
BodyBuilder = Callable[[Payload, str, bool], dict[str, Any]]


def _refuse_fields(payload: Payload, allowed: frozenset[str], kind: str) -> None:
    extra = sorted(set(payload) - allowed)
    if extra:
        raise ValueError(f"the {kind} endpoint has no place for the payload's {', '.join(extra)}")


def _conversation(payload: Payload, kind: str) -> tuple[str | None, list[dict[str, str]]]:
    """The payload's system text and its other messages, all plain text: what every chat API can carry."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("a chat payload needs a non-empty messages list")
    system: list[str] = []
    turns: list[dict[str, str]] = []
    for message in messages:
        role, content = (message.get("role"), message.get("content")) if isinstance(message, dict) else (None, None)
        if not isinstance(content, str) or role not in ("system", "user", "assistant"):
            raise ValueError(f"the {kind} endpoint's bodies are built from plain-text system/user/assistant messages")
        if role == "system":
            system.append(content)
        else:
            turns.append({"role": role, "content": content})
    if not turns:
        raise ValueError("a chat payload needs a user message")
    return ("\n\n".join(system) or None), turns


def _chat_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    if "messages" not in payload:
        raise ValueError("the chat endpoint needs a payload with messages")
    body = {"model": model, **payload}
    if stream:
        body["stream"] = True
    return body


_MESSAGES_FIELDS: Final = frozenset({"messages", "max_tokens", "temperature", "top_p", "stop"})


def _messages_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    """An Anthropic Messages request: system text apart, ``max_tokens`` always, ``stop_sequences``."""
    _refuse_fields(payload, _MESSAGES_FIELDS, "messages")
    system, turns = _conversation(payload, "messages")
    body: dict[str, Any] = {"model": model, "max_tokens": payload.get("max_tokens", DEFAULT_MAX_TOKENS)}
    if system is not None:
        body["system"] = system
    body["messages"] = turns
    for key in ("temperature", "top_p"):
        if key in payload:
            body[key] = payload[key]
    if "stop" in payload:
        stop = payload["stop"]
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if stream:
        body["stream"] = True
    return body


_RESPONSES_FIELDS: Final = frozenset({"messages", "max_tokens", "temperature", "top_p"})


def _responses_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    """An OpenAI Responses request: system text as ``instructions``, a lone user turn as ``input`` text."""
    _refuse_fields(payload, _RESPONSES_FIELDS, "responses")
    system, turns = _conversation(payload, "responses")
    body: dict[str, Any] = {"model": model}
    if system is not None:
        body["instructions"] = system
    lone_user = len(turns) == 1 and turns[0]["role"] == "user"
    body["input"] = turns[0]["content"] if lone_user else turns
    if "max_tokens" in payload:
        body["max_output_tokens"] = payload["max_tokens"]
    for key in ("temperature", "top_p"):
        if key in payload:
            body[key] = payload[key]
    if stream:
        body["stream"] = True
    return body


_PROVIDER_FIELDS: Final = frozenset({"messages", "max_tokens", "temperature", "top_p", "stop"})


def _stop_sequences(payload: Payload) -> list[str] | None:
    if "stop" not in payload:
        return None
    stop = payload["stop"]
    return [stop] if isinstance(stop, str) else list(stop)


def _gemini_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    """A ``generateContent`` request, as the gateway's Gemini codec encodes the chat payload; the model
    and the method are in the path (:func:`_gemini_path`)."""
    del model, stream
    _refuse_fields(payload, _PROVIDER_FIELDS, "gemini")
    system, turns = _conversation(payload, "gemini")
    contents = [
        {"role": "model" if t["role"] == "assistant" else "user", "parts": [{"text": t["content"]}]} for t in turns
    ]
    body: dict[str, Any] = {"contents": contents}
    if system is not None:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    config = {name: payload[key] for key, name in _GEMINI_CONFIG if key in payload}
    if (stop := _stop_sequences(payload)) is not None:
        config["stopSequences"] = stop
    if config:
        body["generationConfig"] = config
    return body


_GEMINI_CONFIG: Final = (("max_tokens", "maxOutputTokens"), ("temperature", "temperature"), ("top_p", "topP"))


def _gemini_path(model: str, stream: bool) -> str:
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/{quote(model, safe='-._~')}:{method}"


def _bedrock_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    """A Converse request, as the gateway's Bedrock codec encodes the chat payload; the model and the
    choice of stream are in the path (:func:`_bedrock_path`)."""
    del model, stream
    _refuse_fields(payload, _PROVIDER_FIELDS, "bedrock")
    system, turns = _conversation(payload, "bedrock")
    messages = [{"role": t["role"], "content": [{"text": t["content"]}]} for t in turns]
    body: dict[str, Any] = {"messages": messages}
    if system is not None:
        body["system"] = [{"text": system}]
    config = {name: payload[key] for key, name in _BEDROCK_CONFIG if key in payload}
    if (stop := _stop_sequences(payload)) is not None:
        config["stopSequences"] = stop
    if config:
        body["inferenceConfig"] = config
    return body


_BEDROCK_CONFIG: Final = (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP"))


def _bedrock_path(model: str, stream: bool) -> str:
    return f"/model/{quote(model, safe='')}/{'converse-stream' if stream else 'converse'}"


_EMBEDDINGS_FIELDS: Final = frozenset({"input", "encoding_format", "dimensions", "user"})


def _embeddings_body(payload: Payload, model: str, stream: bool) -> dict[str, Any]:
    _refuse_fields(payload, _EMBEDDINGS_FIELDS, "embeddings")
    inputs = payload.get("input")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) and x for x in inputs):
        raise ValueError("an embeddings payload needs input: a non-empty list of non-empty strings")
    if stream:
        raise ValueError("the embeddings endpoint does not stream")
    return {"model": model, **payload}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One client API, as the load generator calls it and judges its answers."""

    name: EndpointName
    path: str
    """Under the ``/v1`` base: ``chat/completions``, ``messages``, ...; empty for a kind with a ``route``."""
    upstream: EndpointName
    """The mock endpoint behind the gateway's bench alias for this kind: the direct baseline."""
    build: BodyBuilder
    terminal: bytes | None
    """The terminal frame's marker, which makes a stream complete; ``None``: the API does not stream."""
    first_token: Callable[[bytes], bool] | None
    """Whether a chunk holds the first-token frame; ``None`` with ``terminal``."""
    auth: Literal["bearer", "anthropic", "goog", "sigv4"] = "bearer"
    """How the key is sent: a bearer token; in ``x-api-key`` with ``anthropic-version``, as Anthropic's
    SDKs send it; in ``x-goog-api-key`` (Gemini); a SigV4 ``Authorization`` (:func:`sigv4_headers`)."""
    route: Callable[[str, bool], str] | None = None
    """The path from the server's root for a model and stream choice, for a provider API that names
    them in the path (Gemini, Bedrock). Such a kind is a direct baseline only: the gateway serves no such API."""

    @property
    def streams(self) -> bool:
        return self.terminal is not None

    @property
    def client_api(self) -> bool:
        """Whether the gateway serves this API, so that a step can call it."""
        return self.route is None

    def url_path(self, model: str, stream: bool) -> str:
        """The path from the server's root: ``/v1/<path>``, or the ``route`` of the model."""
        return self.route(model, stream) if self.route is not None else f"/v1/{self.path}"

    def headers(self, key: str) -> dict[str, str]:
        if self.auth == "anthropic":
            return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}
        if self.auth == "goog":
            return {"x-goog-api-key": key}
        if self.auth == "sigv4":
            return sigv4_headers(key)
        return {"authorization": f"Bearer {key}"}

    def body(self, payload: Payload, model: str, stream: bool) -> dict[str, Any]:
        """The request body for ``payload``; ``ValueError`` when this API cannot carry it."""
        if stream and not self.streams:
            raise ValueError(f"the {self.name} endpoint does not stream")
        return self.build(payload, model, stream)


ENDPOINTS: Final[dict[str, Endpoint]] = {
    "chat": Endpoint("chat", "chat/completions", "chat", _chat_body, b"data: [DONE]", has_content),
    "messages": Endpoint(
        "messages",
        "messages",
        "messages",
        _messages_body,
        b"event: message_stop",
        _messages_content,
        auth="anthropic",
    ),
    "responses": Endpoint(
        "responses", "responses", "chat", _responses_body, b"event: response.completed", _responses_delta
    ),
    "embeddings": Endpoint("embeddings", "embeddings", "embeddings", _embeddings_body, None, None),
    "gemini": Endpoint(
        "gemini", "", "gemini", _gemini_body, _GEMINI_FINISH, _gemini_content, auth="goog", route=_gemini_path
    ),
    "bedrock": Endpoint(
        "bedrock", "", "bedrock", _bedrock_body, _BEDROCK_METADATA, _bedrock_content, auth="sigv4", route=_bedrock_path
    ),
}


def direct_kind(kind: Endpoint, provider_format: str = "openai-chat-completions") -> Endpoint:
    """The mock endpoint the direct baseline of ``kind`` calls: the one the gateway's alias for it calls.

    Chat and responses go through the chat alias, whose route speaks ``provider_format``; messages
    and embeddings have aliases of their own, whatever the chat alias's format.
    """
    if kind.upstream == "chat":
        return ENDPOINTS[PROVIDER_FORMATS[provider_format]]
    return ENDPOINTS[kind.upstream]


def endpoint_kind(name: str) -> Endpoint:
    try:
        return ENDPOINTS[name]
    except KeyError:
        raise ValueError(f"unknown endpoint {name!r}; choose one of {', '.join(ENDPOINTS)}") from None
