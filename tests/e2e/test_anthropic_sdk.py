"""The official ``anthropic`` Python SDK against ``POST /v1/messages``, changing only the base URL and key.

The e2e gateway (``tests/e2e/conftest.py``) serves ``chat-claude-v1`` from the Anthropic-format mock
(same format) and ``chat-fast-v1`` from the OpenAI-format mock (translated both ways through the
canonical types), so each case runs over both.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from typing import Any

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
            model="chat-fast-v1",  # an OpenAI-format route cannot write a cache breakpoint
            max_tokens=8,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
            ],
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert bad.value.body["error"]["message"].startswith(  # type: ignore[index]
        "'messages[0].content[0].cache_control' is not supported by model 'chat-fast-v1'"
    )


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
    assert beta.status_code == 400
    assert beta.json()["error"]["message"].startswith("The anthropic-beta 'x-2025' is not supported by this gateway")


@pytest.mark.parametrize(
    ("alias", "beta", "status"),
    [
        ("chat-claude-v1", "context-1m-2025-08-07", 200),
        ("chat-claude-v1", "prompt-caching-2024-07-31,fine-grained-tool-streaming-2025-05-14", 200),
        ("chat-fast-v1", "prompt-caching-2024-07-31", 200),
        ("chat-fast-v1", "context-1m-2025-08-07", 400),
        ("chat-fallback-v1", "interleaved-thinking-2025-05-14", 400),
    ],
)
def test_known_betas_pass_where_every_route_can_honour_them(
    gateway: Gateway, alias: str, beta: str, status: int
) -> None:
    client = _client(gateway)
    call = functools.partial(
        client.messages.create,
        model=alias,
        max_tokens=16,
        messages=[{"role": "user", "content": "beta please"}],
        extra_headers={"anthropic-beta": beta},
    )
    if status == 200:
        assert "beta please" in "".join(b.text for b in call().content if b.type == "text")
        return
    with pytest.raises(anthropic.BadRequestError) as bad:
        call()
    assert bad.value.body["error"]["message"] == (  # type: ignore[index]
        f"The anthropic-beta '{beta}' is not supported by model '{alias}'."
    )


# Prompt caching and extended thinking, served by the Anthropic-format mock (docs/mock-provider.md):
# the mock reads the prompt up to the second-to-last cache breakpoint from its "cache" and writes
# the rest up to the last one, and signs its thinking with a digest of the text.

POLICY = "Policy. " * 50  # 400 characters: 100 tokens read from the cache
CONTEXT = "Context. " * 8  # 72 more characters up to the second breakpoint: 118 - 100 = 18 tokens written
CACHED_TURN: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": CONTEXT, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "say hi"},
        ],
    }
]
CACHED_SYSTEM: list[Any] = [{"type": "text", "text": POLICY, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_caching_reports_cache_reads_and_writes(gateway: Gateway, stream: bool) -> None:
    client = _client(gateway)
    kwargs: dict[str, Any] = {"model": "chat-claude-v1", "max_tokens": 64, "system": CACHED_SYSTEM}
    if stream:
        with client.messages.stream(**kwargs, messages=CACHED_TURN) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs, messages=CACHED_TURN)
    # the prompt is ceil((400 + 72 + 1 + 6) / 4) = 120 tokens: 100 read, 18 written, 2 neither
    assert (message.usage.cache_read_input_tokens, message.usage.cache_creation_input_tokens) == (100, 18)
    assert message.usage.input_tokens == 2
    assert message.usage.output_tokens == 13  # "Mock reply #10:" and the echo's 10 words
    assert message.content[0].type == "text" and message.content[0].text.endswith("Context. say hi")


THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
THOUGHT = "Mock thinking about: what is the capital of France?"


@pytest.mark.parametrize("stream", [False, True])
def test_extended_thinking_round_trips_with_its_signature(gateway: Gateway, stream: bool) -> None:
    client = _client(gateway)
    question = [{"role": "user", "content": "what is the capital of France?"}]
    kwargs: dict[str, Any] = {"model": "chat-claude-v1", "max_tokens": 2048, "thinking": THINKING}
    if stream:
        with client.messages.stream(**kwargs, messages=question) as s:
            thinking = "".join(e.thinking for e in s if e.type == "thinking")
            first = s.get_final_message()
        assert thinking == THOUGHT
    else:
        first = client.messages.create(**kwargs, messages=question)
    assert [b.type for b in first.content] == ["thinking", "text"]
    block = first.content[0]
    assert block.type == "thinking" and block.thinking == THOUGHT
    assert block.signature == "mock-signature-" + hashlib.sha256(THOUGHT.encode()).hexdigest()[:32]
    assert first.usage.output_tokens == 9 + 9  # the reply's words and the thinking's
    # The mock refuses a thinking block whose signature does not match its text: this passes only
    # if the gateway sent the block back exactly as it was given.
    second = client.messages.create(
        **kwargs,
        messages=[
            *question,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": "and Spain?"},
        ],  # type: ignore[list-item]
    )
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[1].type == "text" and second.content[1].text == "Mock reply #2: and Spain?"


def test_thinking_is_refused_on_an_alias_that_may_fall_back_to_another_format(gateway: Gateway) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        _client(gateway).messages.create(
            model="chat-fallback-v1",
            max_tokens=2048,
            thinking=THINKING,
            messages=[{"role": "user", "content": "x"}],
        )
    assert bad.value.body["error"]["message"] == "'thinking' is not supported by model 'chat-fallback-v1'."  # type: ignore[index]


def test_chat_completions_clients_do_not_see_anthropic_cache_fields(gateway: Gateway) -> None:
    """The same alias over Chat Completions: no thinking, cache reads as OpenAI counts them."""
    from openai import OpenAI

    with OpenAI(base_url=gateway.base_url, api_key=gateway.keys["team-a"], max_retries=0) as openai_client:
        reply = openai_client.chat.completions.create(
            model="chat-claude-v1", messages=[{"role": "user", "content": "plain question"}]
        )
    assert reply.choices[0].message.content == "Mock reply #2: plain question"
    assert reply.usage is not None and reply.usage.prompt_tokens == 4
