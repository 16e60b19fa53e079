"""The Gemini API wire format (``generateContent``, ``streamGenerateContent?alt=sse``), as the mock
speaks it.

Gemini names the model and the method in the path; :mod:`tollway.mock.app` adds them to the body as
``model`` and ``stream``, the keys the other formats carry, before this module reads it. A stream
is SSE whatever ``alt`` says (the JSON-array form is not played): one ``GenerateContentResponse``
chunk per text delta, a function call whole in one chunk, then a chunk with the ``finishReason`` and
``usageMetadata``. Gemini has no terminal frame, so ``no_done`` changes nothing.

The answer's tool is the one ``allowedFunctionNames`` forces, else the first declared; none under
mode ``NONE`` or when the last turn answers a call. ``responseMimeType: application/json`` asks for a
JSON reply, an instance of ``responseJsonSchema`` (or ``responseSchema``) when one is given.

Gemini 3 models (a model name starting ``gemini-3``) sign their function calls as Gemini 3 does: the
call's part carries a ``thoughtSignature`` (:func:`thought_signature`, a digest of the call), and a
request whose ``model`` turn holds a call without the signature it was given on its first
``functionCall`` part is refused with Gemini's 400, so a client that loses it is caught.

Vertex AI serves the same bodies at
``/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:{method}``
(:func:`vertex_route`), with the same answers and faults, to OAuth2 bearer tokens only: like Vertex,
the mock answers 401 ``UNAUTHENTICATED`` to a request without ``Authorization: Bearer``, whatever
the faults (it checks that a token is present, not what it is).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Final

import orjson

from tollway.mock.content import JsonFormat, MockRequest, ToolReply, ToolSpec, pick_tool
from tollway.mock.wire import Reply, RequestError, StreamPlan

__all__ = [
    "VERTEX_PROJECTS",
    "Gemini",
    "Vertex",
    "context_refusal",
    "prefill_text",
    "thought_signature",
    "vertex_route",
]

VERTEX_PROJECTS: Final = "/v1/projects/"
"""Where Vertex AI paths begin."""
_VERTEX_MODELS: Final = "/publishers/google/models/"
_METHODS: Final = {"generateContent": False, "streamGenerateContent": True}

_STATUS: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _status(status: int) -> str:
    return _STATUS.get(status) or ("INTERNAL" if status >= 500 else "INVALID_ARGUMENT")


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return ""
    text = part.get("text")
    if isinstance(text, str):
        return text
    answer = part.get("functionResponse")
    response = answer.get("response") if isinstance(answer, dict) else None
    if isinstance(response, dict):
        content = response.get("content")
        return content if isinstance(content, str) else orjson.dumps(response).decode()
    return ""


def _text(content: Any) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ""
    return " ".join(t for t in map(_part_text, parts) if t)


def _answers_call(content: dict[str, Any]) -> bool:
    parts = content.get("parts")
    return isinstance(parts, list) and any(isinstance(p, dict) and "functionResponse" in p for p in parts)


def _json_format(config: dict[str, Any]) -> JsonFormat | None:
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema", config.get("responseSchema"))
    if schema is not None and not isinstance(schema, dict):
        raise RequestError("generationConfig.responseJsonSchema must be an object", "generationConfig")
    return JsonFormat(schema)


def prefill_text(body: dict[str, Any]) -> str | None:
    """The text of a trailing ``model`` turn (an assistant prefill), or ``None``."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents or not isinstance(contents[-1], dict):
        return None
    last = contents[-1]
    return _text(last) if last.get("role") == "model" else None


def vertex_route(path: str) -> tuple[str, bool] | None:
    """``(model, stream)`` of ``/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:{method}``,
    or ``None`` for another path."""
    scope, found, name = path[len(VERTEX_PROJECTS) :].partition(_VERTEX_MODELS)
    project, locations, location = scope.partition("/locations/")
    model, colon, method = name.rpartition(":")
    stream = _METHODS.get(method)
    if not (found and locations and project and location and colon and model) or stream is None:
        return None
    if "/" in project or "/" in location or "/" in model:
        return None
    return model, stream


def thought_signature(name: str, args: Any) -> str:
    """The mock's signature of a call: base64 of 256 bytes derived from its name and arguments
    (standard alphabet, padded, as Gemini's JSON carries bytes). Gemini's run to hundreds of
    characters too, so a tool call id that carries one is far longer than other providers accept."""
    call = name.encode() + b"\x00" + orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    return base64.b64encode(b"\xfb\xff" + hashlib.shake_256(call).digest(254)).decode()


def _signs(model: str) -> bool:
    return model.startswith("gemini-3")


def _check_signatures(contents: list[dict[str, Any]]) -> None:
    """Each ``model`` turn's first function call must carry the signature the mock gave it."""
    for i, content in enumerate(contents):
        parts = content.get("parts")
        if content.get("role") != "model" or not isinstance(parts, list):
            continue
        call = next((p for p in parts if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)), None)
        if call is None:
            continue
        fc = call["functionCall"]
        name = fc.get("name") if isinstance(fc.get("name"), str) else ""
        if call.get("thoughtSignature") != thought_signature(name, fc.get("args") or {}):
            raise RequestError(
                f"Function call `{name}` in the {i + 1}. content block is missing a `thought_signature`.", "contents"
            )


def context_refusal(used: int, limit: int) -> tuple[str, str | None]:
    """A context-length refusal in Gemini's words; its status stays ``INVALID_ARGUMENT``."""
    return f"The input token count ({used}) exceeds the maximum number of tokens allowed ({limit}).", None


class Gemini:
    name = "gemini"
    request_id_header = b"x-request-id"
    malformed_frame = b"data: {not json\n\n"
    terminal_frame = b""

    def parse(self, body: dict[str, Any]) -> MockRequest:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("a model name is required", "model")
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents or not all(isinstance(c, dict) for c in contents):
            raise RequestError("* GenerateContentRequest.contents: contents is not specified", "contents")
        config = body.get("generationConfig")
        config = config if isinstance(config, dict) else {}
        max_tokens = config.get("maxOutputTokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            raise RequestError("generationConfig.maxOutputTokens must be an integer", "generationConfig")
        if _signs(model):
            _check_signatures(contents)
        texts = [_text(c) for c in contents]
        echo = next((texts[i] for i in reversed(range(len(contents))) if contents[i].get("role") != "model"), "")
        return MockRequest(
            model=model,
            stream=body.get("stream") is True,
            message_count=len(contents),
            echo=echo,
            prompt_chars=sum(map(len, texts)) + len(_text(body.get("systemInstruction"))),
            include_usage=True,
            max_tokens=max_tokens,
            tool=self._tool(body, contents[-1]),
            json_format=_json_format(config),
        )

    @staticmethod
    def _tool(body: dict[str, Any], last: dict[str, Any]) -> ToolSpec | None:
        tools = body.get("tools")
        declared = [
            {"name": d.get("name"), "schema": d.get("parametersJsonSchema", d.get("parameters"))}
            for t in (tools if isinstance(tools, list) else ())
            if isinstance(t, dict) and isinstance(t.get("functionDeclarations"), list)
            for d in t["functionDeclarations"]
            if isinstance(d, dict)
        ]
        tool_config = body.get("toolConfig")
        calling = tool_config.get("functionCallingConfig") if isinstance(tool_config, dict) else None
        calling = calling if isinstance(calling, dict) else {}
        if not declared or calling.get("mode") == "NONE" or _answers_call(last):
            return None
        allowed = calling.get("allowedFunctionNames")
        forced = allowed[0] if isinstance(allowed, list) and allowed and isinstance(allowed[0], str) else None
        tool = pick_tool(declared, forced, "schema")
        if tool is None:
            raise RequestError(f"allowedFunctionNames names a function that is not declared: {forced!r}", "toolConfig")
        return tool

    def authorized(self, bearer: bool, api_key: bool) -> bool:
        return api_key

    def error(self, status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
        return orjson.dumps({"error": {"code": status, "message": message, "status": error_type or _status(status)}})

    def midstream_error(self, error_type: str | None) -> bytes:
        error = {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}
        if error_type:
            error["status"] = error_type
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes:
        parts, finish = _answer(reply, _signs(req.model))
        return orjson.dumps(
            {
                "candidates": [
                    {"content": {"parts": parts, "role": "model"}, "finishReason": finish, "index": 0},
                ],
                "usageMetadata": _usage(req, reply),
                "modelVersion": req.model,
                "responseId": f"mock{seq:016d}",
            }
        )

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan:
        tail_doc = {"modelVersion": req.model, "responseId": f"mock{seq:016d}"}
        parts, finish = _answer(reply, _signs(req.model))
        if isinstance(reply, ToolReply):
            chunks = [parts]
        else:
            chunks = [[{"text": piece}] for piece in reply.deltas]
        deltas = [_chunk({"candidates": [_candidate(p)], **tail_doc}) for p in chunks]
        last = {**_candidate([{"text": ""}]), "finishReason": finish}
        tail = _chunk({"candidates": [last], "usageMetadata": _usage(req, reply), **tail_doc})
        return StreamPlan(b"", deltas, tail)


class Vertex(Gemini):
    """Gemini on Vertex AI: the same bodies, authenticated by an OAuth2 bearer token."""

    name = "vertex"
    unauthenticated = (
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
        "valid authentication credential."
    )

    def authorized(self, bearer: bool, api_key: bool) -> bool:
        return bearer


def _answer(reply: Reply, signed: bool = False) -> tuple[list[dict[str, Any]], str]:
    if isinstance(reply, ToolReply):
        part: dict[str, Any] = {"functionCall": {"name": reply.name, "args": orjson.Fragment(reply.arguments)}}
        if signed:
            part["thoughtSignature"] = thought_signature(reply.name, orjson.loads(reply.arguments))
        return [part], "STOP"
    return [{"text": reply.text}], "MAX_TOKENS" if reply.truncated else "STOP"


def _candidate(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": {"parts": parts, "role": "model"}, "index": 0}


def _chunk(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _usage(req: MockRequest, reply: Reply) -> dict[str, int]:
    prompt = req.prompt_tokens
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": reply.completion_tokens,
        "totalTokenCount": prompt + reply.completion_tokens,
    }
