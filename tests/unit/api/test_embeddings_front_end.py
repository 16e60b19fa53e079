"""The embeddings front end: what it accepts, what it refuses and how, and how it writes vectors."""

from __future__ import annotations

import base64
from array import array
from typing import Any

import orjson
import pytest

from tollway.api.embeddings import EMBEDDINGS
from tollway.canonical import EmbeddingRequest, EmbeddingResponse, Usage
from tollway.exceptions import ContextLengthExceeded, GatewayError, InvalidRequest, UnsupportedParameter
from tollway.pipeline.frontend import ResponseMeta
from tollway.routing.plan import AliasPlan, RetryPolicy


def plan(**overrides: Any) -> AliasPlan:
    fields: dict[str, Any] = {
        "name": "embed-v1",
        "capabilities": frozenset({"streaming"}),
        "max_input_tokens": 100,
        "max_output_tokens": 1,
        "default_max_output_tokens": 1,
        "allowed_parameters": frozenset(),
        "reject_unknown_parameters": True,
        "groups": (),
        "retry": RetryPolicy(),
        "operation": "embeddings",
        "client_formats": frozenset({"openai-embeddings"}),
        "max_embedding_inputs": 4,
    }
    fields.update(overrides)
    return AliasPlan(**fields)


def decode(body: dict[str, Any], alias: AliasPlan | None = None) -> EmbeddingRequest:
    p = alias or plan()
    return EMBEDDINGS.decode(orjson.dumps(body), lambda model, stream: p)


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_every_input_shape_openai_accepts(value: object, inputs: list[object]) -> None:
    req = decode({"model": "embed-v1", "input": value})
    assert req.inputs == inputs
    assert req.encoding_format == "float" and req.dimensions is None and req.max_output_tokens == 0


def test_options_are_carried() -> None:
    req = decode({"model": "m", "input": "x", "dimensions": 256, "encoding_format": "base64", "user": "u-1"})
    assert (req.dimensions, req.encoding_format, req.user) == (256, "base64", "u-1")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1], []]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": [True]}, "input"),
        ({"input": ["x"] * 5}, "input"),
        ({"input": {"text": "x"}}, "input"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 1.5}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "stream": True}, "stream"),
        ({"input": "x", "user": 7}, "user"),
    ],
)
def test_bad_fields_are_named_and_never_echoed(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode({"model": "m", **body})
    assert info.value.param == param and info.value.status == 400
    assert "secret-text" not in info.value.message


def test_an_input_over_the_aliass_limit_is_a_context_length_error() -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        decode({"model": "m", "input": ["short", "x" * 401]})
    assert info.value.param == "input"
    assert decode({"model": "m", "input": ["x" * 400]}).inputs == ["x" * 400]


def test_unknown_fields_are_refused_unless_allowlisted() -> None:
    with pytest.raises(UnsupportedParameter) as info:
        decode({"model": "m", "input": "x", "input_type": "query"})
    assert info.value.param == "input_type"
    req = decode(
        {"model": "m", "input": "x", "input_type": "query"}, plan(allowed_parameters=frozenset({"input_type"}))
    )
    assert req.extensions == {"input_type": "query"}
    assert (
        decode({"model": "m", "input": "x", "input_type": "q"}, plan(reject_unknown_parameters=False)).extensions == {}
    )


def test_float_and_base64_answers() -> None:
    vectors = [[0.5, -0.25, 1e-3], [1.0, 0.0, -1.0]]
    resp = EmbeddingResponse(vectors, Usage(prompt_tokens=7))
    meta = ResponseMeta("req_1", 0, "embed-v1")
    as_float = orjson.loads(EMBEDDINGS.encode_response(meta, resp, EmbeddingRequest(["a", "b"])))
    assert as_float == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": vectors[0]},
            {"object": "embedding", "index": 1, "embedding": vectors[1]},
        ],
        "model": "embed-v1",
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    as_b64 = orjson.loads(
        EMBEDDINGS.encode_response(meta, resp, EmbeddingRequest(["a", "b"], encoding_format="base64"))
    )
    decoded = [array("f", base64.b64decode(d["embedding"])) for d in as_b64["data"]]
    assert [list(v) for v in decoded] == [list(array("f", v)) for v in vectors]
    assert base64.b64decode(as_b64["data"][0]["embedding"])[:4] == bytes.fromhex("0000003f")  # 0.5, little-endian


def test_errors_use_openais_envelope() -> None:
    reply = EMBEDDINGS.encode_error(GatewayError("nope"))
    body = orjson.loads(reply.body)
    assert set(body["error"]) == {"message", "type", "param", "code"} and reply.status == 500
