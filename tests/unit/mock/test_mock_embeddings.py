"""The mock's embeddings: deterministic unit vectors, OpenAI's shape, float and base64."""

from __future__ import annotations

import base64
import math
from array import array
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from tollway.mock import MockServer
from tollway.mock.openai_embeddings import DEFAULT_DIMENSIONS, mock_embedding


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with MockServer() as server, httpx.AsyncClient(base_url=server.base_url, timeout=5) as http:
        yield http


def test_the_same_text_gives_the_same_unit_vector() -> None:
    a, b = mock_embedding("hello"), mock_embedding("hello", DEFAULT_DIMENSIONS)
    assert a == b and len(a) == DEFAULT_DIMENSIONS
    assert math.isclose(math.fsum(x * x for x in a), 1.0)
    assert mock_embedding("hello") != mock_embedding("hello!")
    assert mock_embedding((1, 2)) != mock_embedding((2, 1))
    assert len(mock_embedding("x", 8)) == 8


@pytest.mark.asyncio(loop_scope="module")
async def test_the_answer_has_openais_shape(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/embeddings",
        json={"model": "m", "input": ["hi there", "again"], "dimensions": 4},
        headers={"authorization": "Bearer k"},
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["data"] == [
        {"object": "embedding", "index": 0, "embedding": list(mock_embedding("hi there", 4))},
        {"object": "embedding", "index": 1, "embedding": list(mock_embedding("again", 4))},
    ]
    assert body["usage"] == {"prompt_tokens": 2 + 2, "total_tokens": 4}
    tokens = await client.post("/v1/embeddings", json={"model": "m", "input": [[5, 6, 7]], "dimensions": 4})
    assert tokens.json()["data"][0]["embedding"] == list(mock_embedding((5, 6, 7), 4))
    assert tokens.json()["usage"]["prompt_tokens"] == 3
    b64 = await client.post(
        "/v1/embeddings", json={"model": "m", "input": "hi", "dimensions": 4, "encoding_format": "base64"}
    )
    raw = base64.b64decode(b64.json()["data"][0]["embedding"])
    assert raw == array("f", mock_embedding("hi", 4)).tobytes()


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_input_is_a_400(client: httpx.AsyncClient) -> None:
    for body in (
        {"model": "m", "input": ""},
        {"model": "m", "input": [1, "a"]},
        {"model": "m", "input": "x", "dimensions": 0},
    ):
        resp = await client.post("/v1/embeddings", json=body)
        assert resp.status_code == 400, body
        assert resp.json()["error"]["type"] == "invalid_request_error"
    faulted = await client.post("/_fault/status=503/v1/embeddings", json={"model": "m", "input": "x"})
    assert faulted.status_code == 503
