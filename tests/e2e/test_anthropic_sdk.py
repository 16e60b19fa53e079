"""The official ``anthropic`` Python SDK against ``POST /v1/messages``, changing only the base URL and key.

The e2e gateway (``tests/e2e/conftest.py``) serves ``chat-claude-v1`` from the Anthropic-format mock
(same format) and ``chat-fast-v1`` from the OpenAI-format mock (translated both ways through the
canonical types), so each case runs over both.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from tests.support.processes import Gateway

pytestmark = pytest.mark.e2e

ALIASES = ["chat-claude-v1", "chat-fast-v1"]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


_OPEN: list[anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every client a test made is closed after it: a socket left to the collector warns (an error here)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(gateway: Gateway, key: str | None = None) -> anthropic.Anthropic:
    base = gateway.base_url.removesuffix("/v1")  # the SDK appends /v1/messages itself
    client = anthropic.Anthropic(base_url=base, api_key=key or gateway.keys["team-a"], max_retries=0, timeout=20)
    _OPEN.append(client)
    return client


@pytest.mark.parametrize("alias", ALIASES)
def test_a_buffered_message_answers_in_anthropics_shape(gateway: Gateway, alias: str) -> None:
    message = _client(gateway).messages.create(
        model=alias,
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "say hello to anthropic"}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == alias
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    text = "".join(block.text for block in message.content if block.type == "text")
    assert "say hello to anthropic" in text  # the mock echoes the last user message
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


@pytest.mark.parametrize("alias", ALIASES)
def test_the_sdk_stream_helper_reads_the_event_sequence(gateway: Gateway, alias: str) -> None:
    with _client(gateway).messages.stream(
        model=alias, max_tokens=64, messages=[{"role": "user", "content": "stream these words please"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "stream these words please" in text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("stream", [False, True])
def test_tools_round_trip_as_tool_use_and_tool_result(gateway: Gateway, alias: str, stream: bool) -> None:
    client = _client(gateway)
    first_kwargs = {
        "model": alias,
        "max_tokens": 128,
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "weather in Paris?"}],
    }
    if stream:
        with client.messages.stream(**first_kwargs) as s:  # type: ignore[arg-type]
            first = s.get_final_message()
    else:
        first = client.messages.create(**first_kwargs)  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input, dict) and "city" in call.input
    second = client.messages.create(
        model=alias,
        max_tokens=64,
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
        ],
    )
    assert second.stop_reason == "end_turn"
    assert "sunny, 21 C" in "".join(b.text for b in second.content if b.type == "text")


def test_count_tokens_answers_a_local_estimate(gateway: Gateway) -> None:
    client = _client(gateway)
    short = client.messages.count_tokens(model="chat-claude-v1", messages=[{"role": "user", "content": "hi"}])
    long = client.messages.count_tokens(model="chat-claude-v1", messages=[{"role": "user", "content": "hi " * 400}])
    assert 0 < short.input_tokens < long.input_tokens


def test_errors_come_in_anthropics_envelope_with_the_matching_status(gateway: Gateway) -> None:
    client = _client(gateway)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-alias", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        _client(gateway, key="tw-not-a-key").messages.create(
            model="chat-claude-v1", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="chat-claude-v1",
            max_tokens=8,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
            ],
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "cache_control" in bad.value.body["error"]["message"]  # type: ignore[index]


def test_the_chat_completions_surface_still_serves_the_same_aliases(gateway: Gateway) -> None:
    from openai import OpenAI

    with OpenAI(base_url=gateway.base_url, api_key=gateway.keys["team-a"], max_retries=0) as openai_client:
        for alias in ALIASES:
            reply = openai_client.chat.completions.create(
                model=alias, messages=[{"role": "user", "content": "both ways"}]
            )
            assert "both ways" in (reply.choices[0].message.content or "")


def test_a_key_in_both_x_api_key_and_authorization_is_refused(gateway: Gateway) -> None:
    import httpx

    key = gateway.keys["team-a"]
    body = {"model": "chat-claude-v1", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    both = httpx.post(
        gateway.base_url + "/messages",
        json=body,
        headers={"x-api-key": key, "authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert both.status_code == 401
    assert both.json()["error"]["type"] == "authentication_error"
    bearer = httpx.post(
        gateway.base_url + "/messages", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
    beta = httpx.post(
        gateway.base_url + "/messages", json=body, headers={"x-api-key": key, "anthropic-beta": "x-2025"}, timeout=10
    )
    assert beta.status_code == 400 and "anthropic-beta" in beta.json()["error"]["message"]
