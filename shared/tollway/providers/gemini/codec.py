"""Codec for Google's Gemini API ``generateContent`` and ``streamGenerateContent``.

The model and the method are in the path, not the body: :func:`generate_path` builds it, and is the
one place a Vertex AI deployment differs. Vertex AI takes the same bodies under a
``projects/{project}/locations/{location}/publishers/google/`` base URL (:func:`vertex_base_url`),
where the models are ``models/{model}`` (:class:`VertexGeminiCodec`). Translation is in
:mod:`.request`, :mod:`.response` and :mod:`.stream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import ClassVar, Literal
from urllib.parse import quote

import orjson

from tollway.canonical import CanonicalRequest, CanonicalResponse, StreamEvent, ToolCall
from tollway.exceptions import UpstreamError
from tollway.providers.base import ProviderFormat, Target
from tollway.providers.gemini.request import encode_body
from tollway.providers.gemini.response import (
    blocked,
    candidate,
    classify,
    decode_call,
    error_fields,
    finish_reason,
    retry_delay,
    usage,
)
from tollway.providers.gemini.stream import decode_stream
from tollway.providers.openai_chat import describe, load_object, malformed, retry_after, status_category, str_or_none
from tollway.wire import SseEvent, UpstreamRequest

__all__ = ["GEMINI_API_MODELS", "VERTEX_MODELS", "GeminiCodec", "VertexGeminiCodec", "generate_path", "vertex_base_url"]

GEMINI_API_MODELS = "v1beta/models/"
"""The Gemini API's model collection, relative to ``https://generativelanguage.googleapis.com``."""
VERTEX_MODELS = "models/"
"""Google's publisher models on Vertex AI, relative to a :func:`vertex_base_url`."""

_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})


def generate_path(model: str, stream: bool, models: str = GEMINI_API_MODELS) -> str:
    """``<models><model>:generateContent``, or ``:streamGenerateContent?alt=sse`` (SSE rather than
    the default JSON array). ``models`` is the collection the model lives in; a model id written
    as a resource name (``models/gemini-2.5-flash``) is accepted too."""
    name = quote(model.removeprefix("models/"), safe="-._~")
    return f"{models}{name}:streamGenerateContent?alt=sse" if stream else f"{models}{name}:generateContent"


def vertex_base_url(project: str, location: str) -> str:
    """The Vertex AI endpoint of Google's publisher models in ``project`` at ``location``: the
    location's regional host, or ``aiplatform.googleapis.com`` for ``global``."""
    host = "aiplatform.googleapis.com" if location == "global" else f"{location}-aiplatform.googleapis.com"
    return f"https://{host}/v1/projects/{project}/locations/{location}/publishers/google/"


class GeminiCodec:
    """``POST v1beta/models/{model}:generateContent`` relative to a base URL such as
    ``https://generativelanguage.googleapis.com``; the transport adds the ``x-goog-api-key``."""

    format: ClassVar[ProviderFormat] = ProviderFormat.GEMINI
    framing: ClassVar[Literal["sse"]] = "sse"

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest:
        body = orjson.dumps(encode_body(req))
        return UpstreamRequest(
            path=generate_path(target.model, req.stream), body=body, headers=_HEADERS, stream=req.stream
        )

    def decode_response(self, status: int, body: bytes) -> CanonicalResponse:
        doc = load_object(body, status=status, what="response")
        refusal = blocked(doc, status)
        if refusal is not None:
            raise refusal
        cand = candidate(doc)
        if cand is None:
            raise malformed("response has no candidate", status=status)
        response_id = str_or_none(doc.get("responseId"))
        content = cand.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts is not None and not isinstance(parts, list):
            raise malformed("candidate content parts is not a list", status=status)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in parts or ():
            if not isinstance(part, dict):
                raise malformed("a content part is not an object", status=status)
            if "functionCall" in part:
                calls.append(
                    decode_call(part["functionCall"], len(calls), response_id, status, part.get("thoughtSignature"))
                )
                continue
            text = part.get("text")
            if isinstance(text, str) and part.get("thought") is not True:
                texts.append(text)
        raw_usage = doc.get("usageMetadata")
        return CanonicalResponse(
            content="".join(texts) if texts or not calls else None,
            tool_calls=calls or None,
            finish_reason=finish_reason(cand.get("finishReason"), bool(calls)) or ("tool_calls" if calls else "stop"),
            usage=usage(raw_usage) if isinstance(raw_usage, dict) else None,
            provider_response_id=response_id,
        )

    def decode_stream(self, events: AsyncIterator[SseEvent]) -> AsyncIterator[StreamEvent]:
        return decode_stream(events)

    def decode_error(self, status: int, headers: Mapping[str, str], body: bytes) -> UpstreamError:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        fields = error_fields(doc) if isinstance(doc, dict) else None
        info, details = fields if fields is not None else (None, [])
        category, reason = classify(status_category(status), info, body)
        wait = retry_after(headers)
        return UpstreamError(
            category,
            status=status,
            retry_after=wait if wait is not None else retry_delay(details),
            detail=describe(info, body),
            reason=reason,
            reported=True,
        )


class VertexGeminiCodec(GeminiCodec):
    """``POST models/{model}:generateContent`` relative to a :func:`vertex_base_url`; the bodies,
    answers, streams and errors are the Gemini API's. The transport's signer adds the OAuth2
    ``authorization: Bearer`` (:mod:`.vertex_auth`)."""

    def encode_request(self, req: CanonicalRequest, target: Target) -> UpstreamRequest:
        body = orjson.dumps(encode_body(req))
        return UpstreamRequest(
            path=generate_path(target.model, req.stream, VERTEX_MODELS), body=body, headers=_HEADERS, stream=req.stream
        )
