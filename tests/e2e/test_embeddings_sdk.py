"""The official ``openai`` SDK's ``embeddings.create`` against ``POST /v1/embeddings``.

``embed-v1`` is an embeddings alias on the OpenAI-format mock, whose vectors are deterministic
(:func:`tollway.mock.openai_embeddings.mock_embedding`), so every value is asserted exactly;
``embed-fallback-v1`` fails over from a 503 route. ``chat-fast-v1`` is a chat alias, which the
embeddings endpoint must refuse, as the chat endpoint must refuse an embeddings alias.
"""

from __future__ import annotations

import base64
import math
from array import array
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import mock_requests
from tests.support.processes import Gateway, Proc
from tollway.mock.openai_embeddings import DEFAULT_DIMENSIONS, mock_embedding

pytestmark = pytest.mark.e2e

TEXTS = ["The quick brown fox.", "jumps over the lazy dog", "naïve café ☕"]


@pytest.fixture
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.keys["team-a"], max_retries=0, timeout=20) as c:
        yield c


def _tokens(texts: list[str]) -> int:
    return sum(math.ceil(len(t) / 4) for t in texts)


def test_float_vectors_are_the_providers_exactly(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="embed-v1", input=TEXTS, encoding_format="float")
    assert result.object == "list" and result.model == "embed-v1"
    assert [d.index for d in result.data] == [0, 1, 2]
    for item, text in zip(result.data, TEXTS, strict=True):
        assert item.object == "embedding"
        assert item.embedding == list(mock_embedding(text))
    assert result.usage.prompt_tokens == result.usage.total_tokens == _tokens(TEXTS)


def test_the_sdk_default_base64_decodes_to_float32_of_the_same_vector(client: openai.OpenAI) -> None:
    # The SDK asks for base64 when the caller names no encoding, and decodes it itself.
    result = client.embeddings.create(model="embed-v1", input=TEXTS[0])
    assert len(result.data) == 1
    assert result.data[0].embedding == list(array("f", mock_embedding(TEXTS[0])))
    assert len(result.data[0].embedding) == DEFAULT_DIMENSIONS


def test_base64_on_the_wire_is_little_endian_float32(gateway: Gateway) -> None:
    resp = httpx.post(
        gateway.base_url + "/embeddings",
        json={"model": "embed-v1", "input": "one", "encoding_format": "base64", "dimensions": 4},
        headers={"authorization": f"Bearer {gateway.keys['team-a']}"},
        timeout=20,
    )
    assert resp.status_code == 200, resp.text
    raw = base64.b64decode(resp.json()["data"][0]["embedding"])
    assert raw == array("f", mock_embedding("one", 4)).tobytes()  # this host is little-endian


def test_dimensions_and_token_arrays_reach_the_provider(client: openai.OpenAI, mock_provider: Proc) -> None:
    result = client.embeddings.create(
        model="embed-v1", input=[[1, 2, 3], [40, 50]], dimensions=16, encoding_format="float"
    )
    assert [d.embedding for d in result.data] == [
        list(mock_embedding((1, 2, 3), 16)),
        list(mock_embedding((40, 50), 16)),
    ]
    assert result.usage.prompt_tokens == 5
    sent = [
        r for r in mock_requests(mock_provider) if r["format"] == "openai-embeddings" and r["model"] == "phys-embed"
    ]
    assert sent, "the mock saw no embeddings request for the embed route"


def test_fallback_before_an_answer_moves_to_the_next_route(client: openai.OpenAI, mock_provider: Proc) -> None:
    before = {r["seq"] for r in mock_requests(mock_provider)}
    result = client.embeddings.create(model="embed-fallback-v1", input="fall back", encoding_format="float")
    assert result.data[0].embedding == list(mock_embedding("fall back"))
    seen = [(r["model"], r["status"]) for r in mock_requests(mock_provider) if r["seq"] not in before]
    assert ("phys-embed-fb-primary", 503) in seen and ("phys-embed-fb-secondary", 200) in seen


def test_bad_input_is_a_400_in_openais_envelope(client: openai.OpenAI) -> None:
    cases: list[tuple[object, str]] = [
        ("", "input"),
        ([], "input"),
        ([1, "mixed"], "input"),
        (["x"] * 9, "input"),  # embed-v1 allows 8 inputs
        ("x" * 4000, "input"),  # over embed-v1's 512-token input limit
    ]
    for value, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="embed-v1", input=value, encoding_format="float")  # type: ignore[arg-type]
        assert info.value.status_code == 400
        body = info.value.body
        assert isinstance(body, dict) and body["param"] == param, value
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="embed-v1", input="x", dimensions=0)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "dimensions"


def test_a_chat_alias_is_not_an_embeddings_model_nor_the_reverse(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="chat-fast-v1", input="x")
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="embed-v1", messages=[{"role": "user", "content": "x"}])
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="chat-hidden-v1", input="x")


def test_models_list_the_operation_of_each_alias(client: openai.OpenAI) -> None:
    model = client.models.retrieve("embed-v1")
    assert model.model_extra is not None
    assert model.model_extra["operations"] == ["embeddings"]
    assert model.model_extra["client_formats"] == ["openai-embeddings"]
    chat = client.models.retrieve("chat-fast-v1")
    assert chat.model_extra is not None and chat.model_extra["operations"] == ["chat"]
