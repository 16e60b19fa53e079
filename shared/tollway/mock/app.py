"""The mock providers as one raw ASGI 3 application.

Routes::

    POST   /v1/chat/completions       OpenAI Chat Completions (buffered or SSE)
    POST   /v1/messages               Anthropic Messages (buffered or SSE)
    POST   /v1/embeddings             OpenAI Embeddings (deterministic vectors)
    POST   /v1beta/models/{model}:generateContent
                                      Gemini API, buffered
    POST   /v1beta/models/{model}:streamGenerateContent
                                      Gemini API, SSE (as with ``?alt=sse``)
    POST   /v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent
                                      Vertex AI (Gemini bodies), buffered; ``:streamGenerateContent``
                                      streams. Bearer-token requests only
    POST   /model/{modelId}/converse  Amazon Bedrock Converse, buffered (SigV4-signed requests only)
    POST   /model/{modelId}/converse-stream
                                      Amazon Bedrock ConverseStream (AWS event stream)
    *      /_fault/<k=v,k=v>/<route>  the route above, with faults (see tollway.mock.faults)
    GET    /_mock/health              {"ok": true}
    GET    /_mock/requests            the request log, oldest first; DELETE clears it
    GET    /_mock/faults              the default faults; POST sets them, DELETE clears them

It is written against ASGI directly, without a framework, because benchmarks drive it at
1000+ requests per second on two cores: one JSON parse per request, static frames
precomputed, a whole SSE stream sent in one write unless a fault asks for pacing, no
per-request logging, and a bounded request log.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final

import orjson

from tollway.mock.anthropic_messages import AnthropicMessages
from tollway.mock.bedrock_converse import BedrockConverse, corrupt_frame, signed
from tollway.mock.bedrock_converse import context_refusal as bedrock_context_refusal
from tollway.mock.bedrock_converse import route as bedrock_route
from tollway.mock.content import (
    DEFAULT_CHUNKS,
    MockRequest,
    TextReply,
    build_text_reply,
    json_reply,
    placeholder_reply,
    split_text,
    text_reply,
    tool_reply,
)
from tollway.mock.faults import (
    NO_FAULTS,
    FaultSpec,
    FaultSpecError,
    context_refusal,
    fault_spec,
    normalize_key,
    parse_fault_items,
    prefill_text,
)
from tollway.mock.gemini import VERTEX_PROJECTS, Gemini, Vertex, vertex_route
from tollway.mock.gemini import context_refusal as gemini_context_refusal
from tollway.mock.gemini import prefill_text as gemini_prefill_text
from tollway.mock.openai_chat import OpenAIChat
from tollway.mock.openai_embeddings import OpenAIEmbeddings
from tollway.mock.wire import Reply, RequestError, WireFormat

__all__ = ["REQUEST_LOG_SIZE", "MockApp", "create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

REQUEST_LOG_SIZE = 1000
ECHO_LOGGED = 512
"""How much of the text a request's answer echoes its log entry keeps (``echo``): what a test
inspects to see what a provider was sent (that no PII reached it, say)."""

_FORMATS: Final[dict[str, WireFormat]] = {
    "/v1/chat/completions": OpenAIChat(),
    "/v1/messages": AnthropicMessages(),
    "/v1/embeddings": OpenAIEmbeddings(),
}
_GEMINI: Final = Gemini()
_VERTEX: Final = Vertex()
_GEMINI_MODELS: Final = "/v1beta/models/"
_GEMINI_METHODS: Final = {"generateContent": False, "streamGenerateContent": True}
"""Gemini's methods, by whether they stream."""
_BEDROCK: Final = BedrockConverse()
_BEDROCK_MODELS: Final = "/model/"
_UNSIGNED: Final = "Mock: the request is not signed with AWS Signature Version 4"
_FAULT_PREFIX: Final = "/_fault/"
_JSON_TYPE: Final = (b"content-type", b"application/json")
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_MALFORMED_BODY: Final = b'{"id": "mock", not json'


def create_app() -> MockApp:
    """A new mock application with its own request log, fault defaults and counters."""
    return MockApp()


class MockApp:
    """The ASGI application; its state is per instance (and so per worker process)."""

    def __init__(self, *, request_log_size: int = REQUEST_LOG_SIZE) -> None:
        self._seq = itertools.count(1)
        self._log: deque[dict[str, Any]] = deque(maxlen=request_log_size)
        self._defaults: dict[str, str] = {}
        self._model_defaults: dict[str, dict[str, str]] = {}
        self._fail_counts: dict[str, int] = {}
        self._down_since: dict[str, float] = {}
        """``down_for_ms``: when the first request of each canonical spec arrived."""

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the request log, oldest first."""
        return list(self._log)

    def clear_requests(self) -> None:
        self._log.clear()

    def set_faults(self, faults: Mapping[str, object] | str, model: str | None = None) -> FaultSpec:
        """Replace the default faults (for ``model`` only, when given); resets ``fail_first`` counters.

        Raises :class:`~tollway.mock.faults.FaultSpecError` when the spec is invalid.
        """
        items = parse_fault_items(faults) if isinstance(faults, str) else _items(faults)
        spec = fault_spec(items)
        if model is None:
            self._defaults = items
        elif items:
            self._model_defaults[model] = items
        else:
            self._model_defaults.pop(model, None)
        self._fail_counts.clear()
        self._down_since.clear()
        return spec

    def clear_faults(self) -> None:
        """Drop every default fault and every ``fail_first`` counter."""
        self._defaults = {}
        self._model_defaults = {}
        self._fail_counts.clear()
        self._down_since.clear()

    def reset(self) -> None:
        self.clear_requests()
        self.clear_faults()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        spec = ""
        if path.startswith(_FAULT_PREFIX):
            slash = path.find("/", len(_FAULT_PREFIX))
            if slash < 0:
                await _not_found(send, path)
                return
            spec, path = path[len(_FAULT_PREFIX) : slash], path[slash:]
        wire = _FORMATS.get(path)
        route: tuple[str, bool] | None = None
        if wire is None and path.startswith(_GEMINI_MODELS):
            route = _gemini_route(path)
            wire = _GEMINI if route is not None else None
        elif wire is None and path.startswith(VERTEX_PROJECTS):
            route = vertex_route(path)
            wire = _VERTEX if route is not None else None
        elif wire is None and path.startswith(_BEDROCK_MODELS):
            route = bedrock_route(path)
            wire = _BEDROCK if route is not None else None
        if wire is not None:
            if scope["method"] != "POST":
                await _method_not_allowed(send, b"POST")
                return
            try:
                await self._provider(wire, spec, scope, receive, send, route)
            except OSError:
                return
        elif path.startswith("/_mock/") and not spec:
            await self._control(path, scope["method"], receive, send)
        else:
            await _not_found(send, path)

    async def _provider(
        self, wire: WireFormat, spec: str, scope: Scope, receive: Receive, send: Send, route: tuple[str, bool] | None
    ) -> None:
        """``route``: the model and whether to stream, for a format that puts them in the path (Gemini,
        Bedrock)."""
        seq = next(self._seq)
        bearer = api_key = goog_key = sigv4 = auth = False
        header_faults: dict[str, str] | None = None
        traceparent: str | None = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = value.decode("latin-1")
            elif name == b"authorization":
                auth = True
                bearer = value[:7].lower() == b"bearer " and bool(value[7:].strip())
                sigv4 = signed(value)
            elif name == b"x-api-key":
                auth = True
                api_key = bool(value.strip())
            elif name == b"x-goog-api-key":
                auth = True
                goog_key = bool(value.strip())
            elif name.startswith(b"x-mock-"):
                if header_faults is None:
                    header_faults = {}
                header_faults[normalize_key(name[7:].decode("latin-1"))] = value.decode("latin-1").strip()
        record: dict[str, Any] = {
            "seq": seq,
            "path": scope["path"],
            "format": wire.name,
            "model": None,
            "stream": False,
            "auth": auth,
            "messages": 0,
            "faults": "",
            "status": None,
        }
        if traceparent is not None:
            record["traceparent"] = traceparent  # W3C trace context the gateway propagated, if any
        self._log.append(record)
        exchange = _Exchange(wire, seq, record, receive, send)
        raw = await _read_body(receive)
        if raw is None:
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            await exchange.error(400, "the request body must be a JSON object")
            return
        if route is not None:
            body["model"], body["stream"] = route
            api_key = goog_key if wire is _GEMINI else bearer if wire is _VERTEX else sigv4
        model = body.get("model")
        messages = body.get("contents" if isinstance(wire, Gemini) else "messages")
        record["model"] = model if isinstance(model, str) else None
        record["stream"] = body.get("stream") is True
        record["messages"] = len(messages) if isinstance(messages, list) else 0
        try:
            faults = self._faults(spec, header_faults, record["model"])
        except FaultSpecError as exc:
            await exchange.error(400, str(exc))
            return
        record["faults"] = faults.canonical
        await self._answer(exchange, body, faults, bearer, api_key)

    def _faults(self, spec: str, header_faults: dict[str, str] | None, model: str | None) -> FaultSpec:
        if header_faults is None and not self._defaults and not self._model_defaults:
            return _path_faults(spec) if spec else NO_FAULTS
        items = dict(self._defaults)
        if model is not None and model in self._model_defaults:
            items.update(self._model_defaults[model])
        if spec:
            items.update(parse_fault_items(spec))
        if header_faults:
            items.update(header_faults)
        return fault_spec(items)

    def _failing(self, faults: FaultSpec) -> bool:
        """Whether this request gets the spec's failures; counts requests against ``fail_first``."""
        if faults.down_for_ms is not None:
            now = time.monotonic()
            since = self._down_since.setdefault(faults.canonical, now)
            if now - since >= faults.down_for_ms / 1000:
                return False
        if faults.fail_first is None:
            return True
        count = self._fail_counts.get(faults.canonical, 0) + 1
        self._fail_counts[faults.canonical] = count
        return count <= faults.fail_first

    async def _answer(self, x: _Exchange, body: dict[str, Any], faults: FaultSpec, bearer: bool, api_key: bool) -> None:
        delay = faults.delay_s(x.seq)
        if delay:
            await asyncio.sleep(delay)
        refused = _unauthorized(x.wire, faults, bearer, api_key)
        if refused is not None:
            await x.error(401, refused)
            return
        try:
            req = x.wire.parse(body)
        except RequestError as exc:
            await x.error(400, exc.message, param=exc.param)
            return
        x.record["echo"] = req.echo[:ECHO_LOGGED]
        failing = faults is not NO_FAULTS and self._failing(faults)
        stall = faults.stall if failing else None
        if stall is not None and stall[0] < 0 and await _stalled(x.receive, stall[1]):
            return
        status = faults.fail_status if failing else None
        if status is not None:
            await x.error(status, f"Mock fault: HTTP {status}", faults.error_type, _retry_headers(faults))
            return
        prefill = gemini_prefill_text(body) if isinstance(x.wire, Gemini) else prefill_text(body.get("messages"))
        if faults.no_prefill and prefill is not None:
            await x.error(400, "Mock: a final assistant message (prefill) is not supported", param="messages")
            return
        if faults.context_window is not None and req.prompt_tokens > faults.context_window:
            used, limit = req.prompt_tokens, faults.context_window
            await x.error(400, *_context_refusal(x.wire, used, limit))
            return
        chunks = faults.chunks or DEFAULT_CHUNKS
        reply: Reply
        if req.tool is not None:
            reply = tool_reply(req.tool, chunks)
        elif req.json_format is not None:
            reply = json_reply(req.json_format, req.echo, faults.words, chunks)
        else:
            build = build_text_reply if faults.no_reply_cache else text_reply
            reply = build(req.echo, faults.words, req.max_tokens, chunks)
            if prefill and reply.text.startswith(prefill) and len(reply.text) > len(prefill):
                rest = reply.text[len(prefill) :]
                reply = TextReply(rest, split_text(rest, chunks), len(rest.split()), reply.truncated)
        if faults.placeholders is not None:
            reply = placeholder_reply(
                reply, faults.placeholders, req.echo, chunks, structured=req.json_format is not None
            )
        if req.stream:
            await self._stream(x, req, reply, faults, failing)
        else:
            await self._buffered(x, req, reply, faults, failing)

    async def _buffered(self, x: _Exchange, req: MockRequest, reply: Reply, faults: FaultSpec, failing: bool) -> None:
        if failing and faults.malformed is not None:
            await x.respond(200, _MALFORMED_BODY, [_JSON_TYPE])
            return
        payload = x.wire.render(req, reply, x.seq, int(time.time()))
        if failing and faults.abort_after is not None:
            await x.start(200, [_JSON_TYPE])
            await x.abort(payload[: len(payload) // 2], faults.abort_mode)
            return
        stall = faults.stall if failing else None
        if stall is None or stall[0] < 0:
            await x.respond(200, payload, [_JSON_TYPE])
            return
        await x.start(200, [_JSON_TYPE, (b"content-length", b"%d" % len(payload))])
        if not await _stalled(x.receive, stall[1]):
            await x.body(payload, more=False)

    async def _stream(self, x: _Exchange, req: MockRequest, reply: Reply, faults: FaultSpec, failing: bool) -> None:
        plan = x.wire.stream(req, reply, x.seq, int(time.time()))
        if faults.no_done:
            plan.tail = plan.tail.removesuffix(x.wire.terminal_frame)
        await x.start(200, _BEDROCK.stream_headers if x.wire is _BEDROCK else _SSE_HEADERS)
        if not faults.paced:
            await x.body(b"".join([plan.preamble, *plan.deltas, plan.tail]), more=False)
            return
        count = len(plan.deltas)
        stall = faults.stall if failing else None
        stall_at = min(stall[0], count) if stall is not None and stall[0] >= 0 else None
        abort_at = _clamp(faults.abort_after, count, failing)
        error_at = _clamp(faults.midstream_error, count, failing)
        malformed_at = _clamp(faults.malformed, count, failing)
        corrupt_at = _clamp(faults.corrupt_frame, count, failing) if x.wire is _BEDROCK else None
        pending = corrupt_frame(plan.preamble, faults.corrupt_mode) if corrupt_at == 0 else plan.preamble
        for k in range(count + 1):
            if k:
                gap = faults.ttft_ms if k == 1 else faults.chunk_gap_ms
                if gap:
                    await asyncio.sleep(gap / 1000)
                frame = x.wire.malformed_frame if k == malformed_at else plan.deltas[k - 1]
                if k == corrupt_at:
                    frame = corrupt_frame(frame, faults.corrupt_mode)
                await x.body(pending + frame)
                pending = b""
            if k == stall_at and stall is not None and await _stalled(x.receive, stall[1]):
                return
            if k == abort_at:
                following = pending + (plan.deltas[k] if k < count else plan.tail)
                await x.abort(following[: len(following) // 2], faults.abort_mode)
                return
            if k == error_at:
                await x.body(pending + x.wire.midstream_error(faults.error_type), more=False)
                return
        await x.body(pending + plan.tail, more=False)

    async def _control(self, path: str, method: str, receive: Receive, send: Send) -> None:
        if path == "/_mock/health" and method == "GET":
            await _json(send, 200, {"ok": True})
        elif path == "/_mock/requests" and method in ("GET", "DELETE"):
            if method == "DELETE":
                self.clear_requests()
                await _json(send, 200, {"ok": True})
            else:
                await _json(send, 200, self.requests)
        elif path == "/_mock/faults" and method in ("GET", "POST", "DELETE"):
            await self._control_faults(method, receive, send)
        elif path in ("/_mock/health", "/_mock/requests", "/_mock/faults"):
            await _method_not_allowed(send, b"GET, POST, DELETE")
        else:
            await _not_found(send, path)

    async def _control_faults(self, method: str, receive: Receive, send: Send) -> None:
        if method == "GET":
            await _json(send, 200, {"defaults": self._defaults, "models": self._model_defaults})
            return
        if method == "DELETE":
            self.clear_faults()
            await _json(send, 200, {"ok": True})
            return
        raw = await _read_body(receive)
        try:
            body = orjson.loads(raw or b"")
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            await _json(send, 400, _control_error("the body must be a JSON object of fault settings"))
            return
        model = body.pop("model", None)
        spec = body.pop("spec", None)
        try:
            items = {**parse_fault_items(spec), **_items(body)} if isinstance(spec, str) else _items(body)
            faults = self.set_faults(items, model if isinstance(model, str) else None)
        except FaultSpecError as exc:
            await _json(send, 400, _control_error(str(exc)))
            return
        await _json(send, 200, {"ok": True, "faults": faults.canonical, "model": model})


class _Exchange:
    """One provider request's response side: where to send, and what to record."""

    __slots__ = ("receive", "record", "send", "seq", "wire")

    def __init__(self, wire: WireFormat, seq: int, record: dict[str, Any], receive: Receive, send: Send) -> None:
        self.wire = wire
        self.seq = seq
        self.record = record
        self.receive = receive
        self.send = send

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.record["status"] = status
        all_headers = [*headers, (self.wire.request_id_header, b"req_mock%d" % self.seq)]
        await self.send({"type": "http.response.start", "status": status, "headers": all_headers})

    async def body(self, data: bytes, *, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, payload: bytes, headers: Headers) -> None:
        await self.start(status, [*headers, (b"content-length", b"%d" % len(payload))])
        await self.body(payload, more=False)

    async def error(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Headers | None = None,
        param: str | None = None,
    ) -> None:
        extra = _BEDROCK.error_headers(status, error_type) if self.wire is _BEDROCK else []
        payload = self.wire.error(status, message, error_type, param)
        await self.respond(status, payload, [_JSON_TYPE, *extra, *(headers or ())])

    async def abort(self, partial: bytes, mode: str) -> None:
        """End the body after ``partial``; ``reset`` leaves it unfinished so the server drops the connection."""
        await self.body(partial, more=mode == "reset")


def _gemini_route(path: str) -> tuple[str, bool] | None:
    """``(model, stream)`` of ``/v1beta/models/{model}:{method}``, or ``None`` for another path."""
    model, colon, method = path[len(_GEMINI_MODELS) :].rpartition(":")
    stream = _GEMINI_METHODS.get(method)
    if not colon or not model or "/" in model or stream is None:
        return None
    return model, stream


def _unauthorized(wire: WireFormat, faults: FaultSpec, bearer: bool, api_key: bool) -> str | None:
    """Why the request's credential is refused, or ``None``. Bedrock refuses every unsigned
    request, whatever the faults (for it, ``api_key`` says the request carries a SigV4 signature)."""
    if wire is _BEDROCK:
        return None if _BEDROCK.authorized(bearer, False, sigv4=api_key) else _UNSIGNED
    if wire is _VERTEX:
        return None if bearer else _VERTEX.unauthenticated
    if faults.require_auth and not wire.authorized(bearer, api_key):
        return "Mock: missing or invalid API key"
    return None


def _context_refusal(wire: WireFormat, used: int, limit: int) -> tuple[str, str | None]:
    if isinstance(wire, Gemini):
        return gemini_context_refusal(used, limit)
    if wire is _BEDROCK:
        return bedrock_context_refusal(used, limit)
    return context_refusal(wire.name, used, limit)


def _clamp(k: int | None, count: int, failing: bool) -> int | None:
    return None if k is None or not failing else min(k, count)


def _retry_headers(faults: FaultSpec) -> Headers:
    headers: Headers = []
    if faults.retry_after is not None:
        headers.append((b"retry-after", faults.retry_after.encode()))
    if faults.retry_after_ms is not None:
        headers.append((b"retry-after-ms", b"%d" % faults.retry_after_ms))
    return headers


async def _stalled(receive: Receive, seconds: float) -> bool:
    """Wait ``seconds`` unless the client disconnects first; True when it did."""
    try:
        async with asyncio.timeout(seconds):
            while (await receive())["type"] != "http.disconnect":
                pass
    except TimeoutError:
        return False
    return True


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away first."""
    message = await receive()
    if message["type"] != "http.request":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _items(faults: Mapping[str, object]) -> dict[str, str]:
    items: dict[str, str] = {}
    for key, value in faults.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, str | int | float):
            text = str(value)
        else:
            raise FaultSpecError(f"mock fault {key} must be a string, number or boolean")
        items[normalize_key(key)] = text
    return items


@functools.lru_cache(maxsize=4096)
def _path_faults(spec: str) -> FaultSpec:
    return fault_spec(parse_fault_items(spec))


def _control_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_request"}}


async def _json(send: Send, status: int, data: Any) -> None:
    payload = orjson.dumps(data)
    headers = [_JSON_TYPE, (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _not_found(send: Send, path: str) -> None:
    message = f"Mock: no route for {path}"
    await _json(
        send, 404, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "not_found"}}
    )


async def _method_not_allowed(send: Send, allow: bytes) -> None:
    payload = orjson.dumps(_control_error("Mock: method not allowed"))
    headers = [_JSON_TYPE, (b"content-length", b"%d" % len(payload)), (b"allow", allow)]
    await send({"type": "http.response.start", "status": 405, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
