"""The Anthropic Messages front end: ``POST /v1/messages`` bodies in, the ``message`` object, its
named SSE events and its error envelope out, translated through the canonical types so any route
of the alias can serve it. Pure, like the provider codecs.

Decoding is ``anthropic_request``, rendering ``anthropic_response``; their docstrings say what
is refused and how each field maps. The Tollway key may come in ``x-api-key``, as Anthropic's SDKs
send it. ``anthropic-version`` may be absent or any dated version from ``2023-06-01`` on: that
version fixed the stream events this front end writes and later ones add to them (the official SDK
sends its own, newer, date); ``2023-01-01``'s older stream format is refused. ``anthropic-beta``
values must be on the allowlist of ``anthropic_beta``; the body's checks then hold them against
the alias's routes, and the Anthropic codec sends them on.
"""

from __future__ import annotations

import re

import orjson

from tollway.api.anthropic_beta import parse_betas
from tollway.api.anthropic_request import parse_body, to_canonical
from tollway.api.anthropic_response import MessageStream, error_body, message_id, render_message
from tollway.api.errors import error_headers
from tollway.canonical import CanonicalRequest, CanonicalResponse, estimate_request_tokens
from tollway.exceptions import GatewayError, InvalidRequest
from tollway.pipeline.frontend import ErrorReply, HeaderGetter, Resolve, ResponseMeta

__all__ = ["ANTHROPIC_MESSAGES", "ANTHROPIC_VERSION", "AnthropicMessages", "count_tokens"]


ANTHROPIC_VERSION = "2023-06-01"
"""The oldest ``anthropic-version`` whose response and stream shapes this front end writes."""
_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")


def _supported_version(value: str) -> bool:
    return _VERSION.fullmatch(value) is not None and value >= ANTHROPIC_VERSION


def _betas(headers: HeaderGetter | None) -> tuple[str, ...]:
    values = headers.getlist("anthropic-beta") if headers is not None else None
    return parse_betas(values) if values else ()


class AnthropicMessages:
    name = "anthropic-messages"
    api_key_header: str | None = "x-api-key"

    def check_headers(self, headers: HeaderGetter) -> None:
        if not all(_supported_version(v.strip()) for v in headers.getlist("anthropic-version")):
            raise InvalidRequest(
                f"'anthropic-version' must be a date from {ANTHROPIC_VERSION} on (YYYY-MM-DD).",
                param="anthropic-version",
            )
        _betas(headers)  # an unknown beta is refused before the body is read

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> CanonicalRequest:
        betas = _betas(headers)
        env = parse_body(raw)
        return to_canonical(env, resolve(env.model, env.stream), betas=betas)

    def encode_response(self, meta: ResponseMeta, resp: CanonicalResponse, req: CanonicalRequest) -> bytes:
        return render_message(message_id(meta.request_id), meta.model, resp)

    def encode_stream(self, meta: ResponseMeta, req: CanonicalRequest) -> MessageStream:
        """``message_start`` must state ``input_tokens`` before any usage is known: it carries the
        local estimate, and ``message_delta`` at the end carries the final count."""
        return MessageStream(message_id(meta.request_id), meta.model, estimate_request_tokens(req))

    def encode_error(self, err: GatewayError) -> ErrorReply:
        return ErrorReply(err.status, error_headers(err), error_body(err))


ANTHROPIC_MESSAGES = AnthropicMessages()


def count_tokens(raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> bytes:
    """The answer to ``POST /v1/messages/count_tokens``: ``{"input_tokens": n}`` for the same body
    a message would take, checked against the same alias, with ``max_tokens`` optional. ``n`` is
    the gateway's local estimate (about four characters a token), the same figure the alias's
    input bound and the budget reservation use, not a provider's tokenizer count."""
    env = parse_body(raw)
    req = to_canonical(env, resolve(env.model, False), counting=True, betas=_betas(headers))
    return orjson.dumps({"input_tokens": estimate_request_tokens(req)})
