"""The official ``openai`` SDK's ``responses.create`` against ``POST /v1/responses``, stateless.

Same gateway as the other e2e tests: ``chat-fast-v1`` is served by the OpenAI-format mock and
``chat-claude-v1`` by the Anthropic-format mock, so each case crosses formats once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.support.processes import Gateway

pytestmark = pytest.mark.e2e

ALIASES = ["chat-fast-v1", "chat-claude-v1"]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.keys["team-a"], max_retries=0, timeout=20) as c:
        yield c


@pytest.mark.parametrize("alias", ALIASES)
def test_a_buffered_response_has_a_message_output_and_usage(client: openai.OpenAI, alias: str) -> None:
    response = client.responses.create(model=alias, input="echo this responses text", instructions="Be brief.")
    assert response.object == "response" and response.status == "completed"
    assert response.model == alias and response.id.startswith("resp_")
    assert "echo this responses text" in response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0


@pytest.mark.parametrize("alias", ALIASES)
def test_a_streamed_response_emits_deltas_and_completes(client: openai.OpenAI, alias: str) -> None:
    deltas: list[str] = []
    types: list[str] = []
    sequence: list[int] = []
    completed = None
    for event in client.responses.create(model=alias, input="stream these responses words", stream=True):
        types.append(event.type)
        sequence.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert completed is not None and "".join(deltas) == completed.output_text
    assert "stream these responses words" in completed.output_text
    assert sequence == list(range(len(sequence)))  # every event numbered, in order, from 0


@pytest.mark.parametrize("alias", ALIASES)
def test_function_calls_round_trip(client: openai.OpenAI, alias: str) -> None:
    first = client.responses.create(model=alias, input="weather in Paris?", tools=[WEATHER])  # type: ignore[list-item]
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    second = client.responses.create(
        model=alias,
        tools=[WEATHER],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
        ],
    )
    assert "sunny, 21 C" in second.output_text


def test_stateful_and_built_in_features_are_refused_by_name(client: openai.OpenAI) -> None:
    for kwargs, field in (
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model="chat-fast-v1", input="x", **kwargs)  # type: ignore[arg-type]
        assert bad.value.body["param"] == field  # type: ignore[index]
