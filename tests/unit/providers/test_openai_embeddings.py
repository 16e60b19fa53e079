"""The OpenAI embeddings codec: what it sends, and every way an answer can be refused."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tollway.canonical import EmbeddingRequest, UsageEvidence
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.providers import ProviderFormat, Target, embeddings_codec_for

CODEC = embeddings_codec_for(ProviderFormat.OPENAI_CHAT)
assert CODEC is not None


def test_only_formats_whose_providers_embed_have_the_capability() -> None:
    assert embeddings_codec_for(ProviderFormat.ANTHROPIC_MESSAGES) is None


def test_the_request_asks_for_floats_whatever_the_client_wants() -> None:
    req = EmbeddingRequest(["a"], dimensions=64, encoding_format="base64", user="u", extensions={"model": "x", "k": 1})
    up = CODEC.encode_embeddings(req, Target("text-embedding-3-small"))
    assert up.path == "embeddings" and not up.stream
    assert orjson.loads(up.body) == {
        "model": "text-embedding-3-small",
        "input": ["a"],
        "encoding_format": "float",
        "dimensions": 64,
        "user": "u",
        "k": 1,
    }


def answer(data: list[Any], usage: Any = None) -> bytes:
    doc: dict[str, Any] = {"object": "list", "data": data, "model": "m"}
    if usage is not None:
        doc["usage"] = usage
    return orjson.dumps(doc)


def test_vectors_come_back_in_input_order() -> None:
    body = answer([{"index": 1, "embedding": [0.0, 1]}, {"index": 0, "embedding": [0.5, 0.25]}], {"prompt_tokens": 3})
    resp = CODEC.decode_embeddings(200, body, 2)
    assert resp.vectors == [[0.5, 0.25], [0.0, 1]]
    assert resp.usage is not None and resp.usage.prompt_tokens == 3
    assert resp.usage.evidence is UsageEvidence.PROVIDER_REPORTED
    assert CODEC.decode_embeddings(200, answer([{"index": 0, "embedding": [1.0]}]), 1).usage is None


@pytest.mark.parametrize(
    "data",
    [
        [],
        [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}],
        [{"index": 0, "embedding": [1.0]}, {"index": 2, "embedding": [1.0]}],
        [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}],
        [{"index": 0, "embedding": "AAAAAA=="}, {"index": 1, "embedding": [1.0]}],
        [{"index": 0, "embedding": ["1"]}, {"index": 1, "embedding": [1.0]}],
        [{"index": 0, "embedding": []}, {"index": 1, "embedding": [1.0]}],
        [{"index": True, "embedding": [1.0]}, {"index": 1, "embedding": [1.0]}],
        ["x", {"index": 1, "embedding": [1.0]}],
    ],
)
def test_a_malformed_answer_is_refused(data: list[Any]) -> None:
    with pytest.raises(UpstreamError) as info:
        CODEC.decode_embeddings(200, answer(data), 2)
    assert info.value.category is UpstreamCategory.MALFORMED


def test_not_json_is_malformed_and_errors_are_classified() -> None:
    with pytest.raises(UpstreamError) as info:
        CODEC.decode_embeddings(200, b"{not json", 1)
    assert info.value.category is UpstreamCategory.MALFORMED
    err = CODEC.decode_error(429, {"retry-after": "2"}, b'{"error":{"message":"slow","type":"requests"}}')
    assert err.category is UpstreamCategory.RATE_LIMIT and err.retry_after == 2
