"""OpenAI's embeddings wire format, as the mock speaks it: deterministic vectors.

The same input always embeds to the same unit vector (seeded by a BLAKE2b digest of the text, or
of the token ids), so tests can assert exact values with :func:`mock_embedding`. Vectors have
1536 dimensions (``text-embedding-3-small``'s) unless the request asks for ``dimensions``.
Usage is ``ceil(characters / 4)`` prompt tokens per text input, the token count of a token array.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import random
from array import array
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tollway.mock.content import MockRequest
from tollway.mock.openai_chat import OpenAIChat
from tollway.mock.wire import Reply, RequestError, StreamPlan

__all__ = ["DEFAULT_DIMENSIONS", "EmbedRequest", "OpenAIEmbeddings", "mock_embedding"]

DEFAULT_DIMENSIONS: Final = 1536
_MAX_DIMENSIONS: Final = 8192
_MAX_INPUTS: Final = 2048


@functools.lru_cache(maxsize=4096)
def mock_embedding(item: str | tuple[int, ...], dimensions: int = DEFAULT_DIMENSIONS) -> tuple[float, ...]:
    """The mock's vector for one input (a text, or a token array as a tuple): unit length."""
    seed = item.encode() if isinstance(item, str) else orjson.dumps(list(item))
    rng = random.Random(hashlib.blake2b(seed, digest_size=16).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return tuple(x / norm for x in raw)


@dataclass(slots=True)
class EmbedRequest(MockRequest):
    """An embeddings request: the inputs, one key each for :func:`mock_embedding`."""

    inputs: tuple[str | tuple[int, ...], ...] = ()
    dimensions: int = DEFAULT_DIMENSIONS
    base64: bool = False


def _input_items(raw: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(raw, str) and raw:
        return (raw,)
    if isinstance(raw, list) and raw and len(raw) <= _MAX_INPUTS:
        if all(isinstance(x, str) and x for x in raw):
            return tuple(raw)
        if all(type(x) is int for x in raw):
            return (tuple(raw),)
        if all(isinstance(x, list) and x and all(type(t) is int for t in x) for x in raw):
            return tuple(tuple(x) for x in raw)
    raise RequestError("'$.input' is invalid. Please check the API reference.", "input")


class OpenAIEmbeddings(OpenAIChat):
    """``POST /v1/embeddings``; errors and authentication as the chat format has them."""

    name = "openai-embeddings"

    def parse(self, body: dict[str, Any]) -> MockRequest:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("you must provide a model parameter", "model")
        inputs = _input_items(body.get("input"))
        dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
        if type(dimensions) is not int or not 1 <= dimensions <= _MAX_DIMENSIONS:
            raise RequestError("'dimensions' must be an integer between 1 and 8192", "dimensions")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise RequestError("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        chars = sum(len(i) if isinstance(i, str) else 4 * len(i) for i in inputs)
        return EmbedRequest(
            model=model,
            stream=False,
            message_count=0,
            echo="",
            prompt_chars=chars,
            inputs=inputs,
            dimensions=dimensions,
            base64=fmt == "base64",
        )

    def render(self, req: MockRequest, reply: Reply, seq: int, created: int) -> bytes:
        assert isinstance(req, EmbedRequest)
        data = []
        tokens = 0
        for index, item in enumerate(req.inputs):
            vector = mock_embedding(item, req.dimensions)
            tokens += math.ceil(len(item) / 4) if isinstance(item, str) else len(item)
            embedding: Any = base64.b64encode(array("f", vector).tobytes()).decode() if req.base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return orjson.dumps({"object": "list", "data": data, "model": req.model, "usage": usage})

    def stream(self, req: MockRequest, reply: Reply, seq: int, created: int) -> StreamPlan:
        raise AssertionError("embeddings never stream")  # pragma: no cover - parse sets stream=False
