"""What every route shares: the pipeline's HTTP edge (an :class:`Inbound` from a Starlette
request, a Starlette response from the pipeline's reply) and the OpenAI error envelope."""

from __future__ import annotations

import asyncio
import functools

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tollway.api.errors import error_body, error_headers
from tollway.exceptions import GatewayError, InvalidRequest, RequestTimeout, RequestTooLarge, UnsupportedMediaType
from tollway.pipeline.core import ClientGone, Inbound, Pipeline, Reply, StreamReply
from tollway.server.runtime import GatewayRuntime
from tollway.server.streaming import SseResponse

__all__ = ["JSON", "error_response", "inbound", "json_response", "pipeline_of", "render", "runtime_of"]

JSON = "application/json"


def runtime_of(request: Request) -> GatewayRuntime:
    runtime: GatewayRuntime = request.app.state.runtime
    return runtime


def pipeline_of(request: Request) -> Pipeline:
    pipeline = runtime_of(request).pipeline
    assert pipeline is not None
    return pipeline


def error_response(err: GatewayError) -> Response:
    return Response(error_body(err), status_code=err.status, media_type=JSON, headers=error_headers(err))


def json_response(body: bytes) -> Response:
    return Response(body, media_type=JSON)


def inbound(request: Request) -> Inbound:
    return Inbound(
        request.scope["state"]["request_id"],
        request.headers,
        functools.partial(_read_body, request),
        functools.partial(_disconnected, request),
    )


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be ``http.disconnect``.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise InvalidRequest("Invalid Content-Length header.")
        if int(length) > max_bytes:
            raise RequestTooLarge(f"The request body exceeds {max_bytes} bytes.")
    encoding = request.headers.get("content-encoding")
    if encoding and encoding.lower() != "identity":
        raise UnsupportedMediaType("Content-Encoding is not supported; send an uncompressed body.")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise RequestTooLarge(f"The request body exceeds {max_bytes} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout("The request body was not received in time.") from None
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


def render(reply: Reply | StreamReply) -> Response:
    if isinstance(reply, Reply):
        if reply.status == 499:
            return Response(status_code=499)
        headers = dict(reply.headers) if reply.headers else None  # Starlette walks even an empty mapping
        return Response(reply.body, status_code=reply.status, media_type=JSON, headers=headers)
    limits = reply.limits
    return SseResponse(
        reply.frames,
        on_close=reply.on_close,
        on_cut=reply.on_cut,
        headers=reply.headers or {},
        write_timeout_s=limits.downstream_write_timeout_s,
        lifetime_s=limits.max_stream_lifetime_s,
        lifetime_frame=reply.lifetime_frame,
        min_drain_bytes_per_s=limits.min_drain_bytes_per_s,
        drain_grace_s=limits.drain_grace_s,
    )
