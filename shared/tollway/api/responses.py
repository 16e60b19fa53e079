"""The OpenAI Responses front end: ``POST /v1/responses`` bodies in, the ``response`` object, its
named and numbered SSE events and the OpenAI error envelope out, translated through the canonical
types so any route of the alias can serve it. Pure, like the provider codecs.

Stateless: each request carries its whole conversation in ``input``, and nothing is stored, so
the API's server-side state (``store: true``, ``previous_response_id``, ``conversation``,
``background``) is refused by name rather than half served. Decoding is ``responses_request``,
rendering ``responses_response``; their docstrings say what is refused and how each field maps.
The key comes in ``Authorization: Bearer``, as the OpenAI SDKs send it, and no format header is
checked: the OpenAI SDKs send none that changes this API's shapes.
"""

from __future__ import annotations

from tollway.api.errors import error_body, error_headers
from tollway.api.responses_request import parse_body, to_canonical
from tollway.api.responses_response import ResponseStream, render_response, request_settings
from tollway.canonical import CanonicalRequest, CanonicalResponse
from tollway.exceptions import GatewayError
from tollway.pipeline.frontend import ErrorReply, HeaderGetter, Resolve, ResponseMeta

__all__ = ["RESPONSES", "OpenAIResponses"]


class OpenAIResponses:
    name = "openai-responses"
    api_key_header: str | None = None

    def check_headers(self, headers: HeaderGetter) -> None:
        return None

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> CanonicalRequest:
        env = parse_body(raw)
        return to_canonical(env, resolve(env.model, env.stream))

    def encode_response(self, meta: ResponseMeta, resp: CanonicalResponse, req: CanonicalRequest) -> bytes:
        return render_response(meta.request_id, meta.created, meta.model, resp, req)

    def encode_stream(self, meta: ResponseMeta, req: CanonicalRequest) -> ResponseStream:
        return ResponseStream(meta.request_id, meta.created, meta.model, request_settings(req))

    def encode_error(self, err: GatewayError) -> ErrorReply:
        return ErrorReply(err.status, error_headers(err), error_body(err))


RESPONSES = OpenAIResponses()
