"""The OpenAI Embeddings front end: ``POST /v1/embeddings`` bodies in, OpenAI's embedding list
and error envelope out. Pure, like the other front ends.

``input`` is a string, an array of strings, one token array, or an array of token arrays, as
OpenAI accepts; each input is embedded separately. The client's ``encoding_format`` decides
only how the gateway writes the vectors: ``float`` as JSON numbers, ``base64`` as the
little-endian float32 bytes of each vector, which is what the official SDKs ask for by default
and decode themselves.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any, Literal

import orjson

from tollway.api.envelope import bad, extensions, parse_body, user
from tollway.api.errors import error_body, error_headers
from tollway.canonical import EmbeddingRequest, EmbeddingResponse, estimate_tokens
from tollway.exceptions import ContextLengthExceeded, GatewayError
from tollway.pipeline.frontend import ErrorReply, HeaderGetter, Resolve, ResponseMeta
from tollway.routing.plan import AliasPlan

__all__ = ["EMBEDDINGS", "Embeddings"]

_PROFILE = frozenset({"model", "input", "dimensions", "encoding_format", "user", "stream"})
"""``stream`` is read by ``decode`` itself: ``false`` is served, ``true`` refused."""
_MAX_DIMENSIONS = 65_536
_MAX_TOKEN_ID = 2**31 - 1
_LITTLE_ENDIAN = sys.byteorder == "little"


def _inputs(raw: Any, plan: AliasPlan) -> list[str] | list[list[int]]:
    """The inputs as one list of strings or one list of token arrays; never echoes them."""
    if isinstance(raw, str):
        if not raw:
            raise bad("'input' must not be empty.", "input")
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise bad("'input' must be a string, an array of strings, or an array of token arrays.", "input")
    if len(raw) > plan.max_embedding_inputs:
        raise bad(f"'input' may hold at most {plan.max_embedding_inputs} items for this model.", "input")
    first = raw[0]
    if isinstance(first, str):
        if not all(isinstance(item, str) and item for item in raw):
            raise bad("Every item of 'input' must be a non-empty string.", "input")
        return raw
    if type(first) is int:  # one token array
        return [_tokens(raw)]
    if isinstance(first, list):
        return [_tokens(item) for item in raw]
    raise bad("'input' must be a string, an array of strings, or an array of token arrays.", "input")


def _tokens(raw: Any) -> list[int]:
    if not isinstance(raw, list) or not raw or not all(type(t) is int and 0 <= t <= _MAX_TOKEN_ID for t in raw):
        raise bad("Every token array in 'input' must be a non-empty array of token ids.", "input")
    return raw


def _size(item: str | list[int]) -> int:
    return len(item) if isinstance(item, list) else estimate_tokens(len(item))


class Embeddings:
    name = "openai-embeddings"
    api_key_header: str | None = None

    def check_headers(self, headers: HeaderGetter) -> None:
        return None

    def decode(self, raw: bytes, resolve: Resolve, headers: HeaderGetter | None = None) -> EmbeddingRequest:
        env = parse_body(raw)
        if env.stream:
            raise bad("Embeddings do not stream; leave 'stream' out.", "stream")
        plan = resolve(env.model, False)
        body = env.body
        passed = extensions(body, _PROFILE, plan)
        inputs = _inputs(body.get("input"), plan)
        if max(map(_size, inputs)) > plan.max_input_tokens:
            raise ContextLengthExceeded(
                f"An input exceeds this model's input limit of {plan.max_input_tokens} tokens.", param="input"
            )
        dimensions = body.get("dimensions")
        if dimensions is not None and (type(dimensions) is not int or not 1 <= dimensions <= _MAX_DIMENSIONS):
            raise bad(f"'dimensions' must be an integer between 1 and {_MAX_DIMENSIONS}.", "dimensions")
        fmt = body.get("encoding_format")
        if fmt is not None and fmt not in ("float", "base64"):
            raise bad("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
        encoding: Literal["float", "base64"] = "base64" if fmt == "base64" else "float"
        return EmbeddingRequest(inputs, dimensions, encoding, user(body), extensions=passed)

    def encode_response(self, meta: ResponseMeta, resp: EmbeddingResponse, req: EmbeddingRequest) -> bytes:
        usage = resp.usage
        prompt = usage.prompt_tokens if usage is not None else 0
        encode = _base64 if req.encoding_format == "base64" else None
        data = [
            {"object": "embedding", "index": i, "embedding": encode(v) if encode is not None else v}
            for i, v in enumerate(resp.vectors)
        ]
        return orjson.dumps(
            {
                "object": "list",
                "data": data,
                "model": meta.model,
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
        )

    def encode_error(self, err: GatewayError) -> ErrorReply:
        return ErrorReply(err.status, error_headers(err), error_body(err))


def _base64(vector: list[float]) -> str:
    """The vector as OpenAI's base64: little-endian float32, whatever this machine's byte order."""
    packed = array("f", vector)
    if not _LITTLE_ENDIAN:  # pragma: no cover - every supported host is little-endian
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


EMBEDDINGS = Embeddings()
