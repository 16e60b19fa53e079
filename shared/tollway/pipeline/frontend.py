"""Client formats as front ends: the mirror of the provider codecs.

A front end turns one client format's request body into the canonical request, and the
canonical response, stream events and errors back into that format. Front ends are pure: no
I/O, no clock, no logging; the pipeline owns the request's lifecycle and the route owns HTTP.
A new client format is one front-end module plus its route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    StreamEvent,
    Usage,
)
from tollway.exceptions import GatewayError
from tollway.routing.plan import AliasPlan

__all__ = [
    "ClientFormat",
    "EmbeddingsFrontEnd",
    "ErrorReply",
    "FrontEnd",
    "HeaderGetter",
    "Resolve",
    "ResponseMeta",
    "StreamEncoder",
]


class HeaderGetter(Protocol):
    """Case-insensitive request headers, as the HTTP layer has them."""

    def get(self, key: str, /) -> str | None: ...

    def getlist(self, key: str) -> list[str]: ...


Resolve = Callable[[str, bool], AliasPlan]
"""The pipeline's alias resolution, handed to :meth:`FrontEnd.decode`: the requested model name
and whether the request streams in, the caller's alias plan out, or the 404/403 raised. Decoding
checks the body against the plan, so it has to resolve between parsing and building."""


class ResponseMeta:
    """What every encoded answer names: its id, creation time and public model."""

    __slots__ = ("created", "model", "request_id")

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self.request_id = request_id
        self.created = created
        self.model = model


@dataclass(slots=True, frozen=True)
class ErrorReply:
    status: int
    headers: dict[str, str]
    body: bytes


class StreamEncoder(Protocol):
    """One stream's frames, in order. It may hold a frame back (a finish frame that should leave
    with the usage and end frames in one write), so every method returns the bytes to write now,
    possibly empty."""

    def event(self, ev: StreamEvent) -> bytes:
        """The frames for one canonical event (``b""`` for an event the format does not show)."""
        ...

    def end(self, usage: Usage) -> bytes:
        """The stream's last frames after its last event; ``usage`` is final, reported or estimated."""
        ...

    def error(self, err: GatewayError) -> bytes:
        """An in-stream error frame that ends the stream after its first token."""
        ...


class ClientFormat(Protocol):
    """What the pipeline asks of every client format before and after the operation itself."""

    name: str
    """The format's name in logs and the audit trail (``openai-chat-completions``)."""
    api_key_header: str | None
    """A header that may carry the Tollway key instead of ``Authorization: Bearer`` (Anthropic's
    ``x-api-key``); ``None``: only ``Authorization``."""

    def check_headers(self, headers: HeaderGetter) -> None:
        """Refuse format headers the gateway cannot honour (after authentication, before the body)."""
        ...

    def encode_error(self, err: GatewayError) -> ErrorReply: ...


class EmbeddingsFrontEnd(ClientFormat, Protocol):
    """An embeddings format: one buffered request, one buffered answer, nothing streams."""

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> EmbeddingRequest: ...

    def encode_response(self, meta: ResponseMeta, resp: EmbeddingResponse, req: EmbeddingRequest) -> bytes: ...


class FrontEnd(ClientFormat, Protocol):
    """One chat client format: decode a request, encode a response, a stream, or an error."""

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> CanonicalRequest:
        """The canonical request for body ``raw``; raises the client's ``GatewayError``. ``headers``
        are the request's (already through :meth:`check_headers`), for a format whose headers shape
        the request (Anthropic's ``anthropic-beta``); ``None`` reads as no such header."""
        ...

    def encode_response(self, meta: ResponseMeta, resp: CanonicalResponse, req: CanonicalRequest) -> bytes:
        """The buffered answer; ``req`` is the request it answers (a format may echo its settings)."""
        ...

    def encode_stream(self, meta: ResponseMeta, req: CanonicalRequest) -> StreamEncoder: ...
