"""The official ``openai`` Python SDK against a real gateway process and real mock providers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import mock_requests
from tests.support.processes import Gateway, Proc

pytestmark = pytest.mark.e2e


_clients: dict[tuple[str, str], openai.OpenAI] = {}


def client(gw: Gateway, principal: str = "team-a") -> openai.OpenAI:
    key = (gw.base_url, principal)
    if key not in _clients:
        _clients[key] = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[principal], max_retries=0, timeout=20)
    return _clients[key]


@pytest.fixture(autouse=True, scope="module")
def _close_clients() -> Iterator[None]:
    yield
    for c in _clients.values():
        c.close()
    _clients.clear()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def test_buffered_chat_returns_alias_not_physical_model(gateway: Gateway) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="chat-fast-v1", messages=[{"role": "user", "content": "hello there"}]
    )
    resp = raw.parse()
    assert resp.model == "chat-fast-v1"
    assert resp.id.startswith("chatcmpl-")
    assert resp.choices[0].message.role == "assistant"
    assert "hello there" in (resp.choices[0].message.content or "")
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert raw.headers["x-request-id"].startswith("req_")
    assert "phys-" not in raw.http_response.text


@pytest.mark.parametrize("alias", ["chat-fast-v1", "chat-claude-v1"])
def test_stream_with_include_usage_ends_with_usage_chunk(gateway: Gateway, alias: str) -> None:
    chunks = list(
        client(gateway).chat.completions.create(
            model=alias,
            messages=[{"role": "user", "content": "stream me some words please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "stream me some words please" in text
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.model for c in chunks} == {alias}
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage(gateway: Gateway) -> None:
    chunks = list(
        client(gateway).chat.completions.create(
            model="chat-claude-v1", messages=[{"role": "user", "content": "no usage please"}], stream=True
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_tools_buffered_through_anthropic_route(gateway: Gateway) -> None:
    resp = client(gateway).chat.completions.create(
        model="chat-claude-v1",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert set(args) == {"city", "days"}
    call = msg.tool_calls[0]
    follow = client(gateway).chat.completions.create(
        model="chat-claude-v1",
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert follow.choices[0].finish_reason == "stop"
    assert follow.choices[0].message.content


def test_tools_streamed_through_anthropic_route_reassemble(gateway: Gateway) -> None:
    stream = client(gateway).chat.completions.create(
        model="chat-claude-v1",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    ids, names, args, finish = set(), set(), "", None
    fragments = 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                names.add(tc.function.name)
            if tc.function and tc.function.arguments:
                args += tc.function.arguments
                fragments += 1
        finish = chunk.choices[0].finish_reason or finish
    assert len(ids) == 1 and names == {"get_weather"}
    assert fragments >= 2
    assert json.loads(args) == {"city": "mock-city", "days": 1}
    assert finish == "tool_calls"


def test_fallback_from_failing_primary_to_healthy_secondary(gateway: Gateway, mock_provider: Proc) -> None:
    resp = client(gateway).chat.completions.create(
        model="chat-fallback-v1", messages=[{"role": "user", "content": "fall back please"}]
    )
    assert "fall back please" in (resp.choices[0].message.content or "")
    log = [r for r in mock_requests(mock_provider) if r.get("model") in ("phys-fb-primary", "phys-fb-secondary")]
    models = [r["model"] for r in log]
    assert "phys-fb-primary" in models and models[-1] == "phys-fb-secondary"


def test_streamed_fallback_happens_before_first_token(gateway: Gateway) -> None:
    chunks = list(
        client(gateway).chat.completions.create(
            model="chat-fallback-v1", messages=[{"role": "user", "content": "stream fallback"}], stream=True
        )
    )
    assert "stream fallback" in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_no_fallback_after_first_chunk(gateway: Gateway, mock_provider: Proc) -> None:
    before = len([r for r in mock_requests(mock_provider) if r.get("model") == "phys-mid-secondary"])
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client(gateway).chat.completions.create(
            model="chat-midstream-v1",
            messages=[{"role": "user", "content": "one two three four five six"}],
            stream=True,
        ):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received), "output had started before the failure"
    assert info.value.code == "upstream_stream_cut"
    assert "phys-" not in str(info.value.message) and "127.0.0.1" not in str(info.value.message)
    after = len([r for r in mock_requests(mock_provider) if r.get("model") == "phys-mid-secondary"])
    assert after == before, "the gateway must not fall back once output was sent"


def test_midstream_failure_has_no_done_frame(gateway: Gateway) -> None:
    with httpx.stream(
        "POST",
        gateway.base_url + "/chat/completions",
        headers={"authorization": f"Bearer {gateway.keys['team-a']}"},
        json={"model": "chat-midstream-v1", "messages": [{"role": "user", "content": "a b c d e f"}], "stream": True},
        timeout=20,
    ) as resp:
        body = resp.read().decode()
    assert resp.status_code == 200
    frames = [f for f in body.split("\n\n") if f]
    assert frames[-1].startswith('data: {"error"')
    assert "[DONE]" not in body
    assert sum(1 for f in frames if '"error"' in f) == 1


def test_non_retryable_provider_error_does_not_fall_back(gateway: Gateway, mock_provider: Proc) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(model="chat-badrequest-v1", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "invalid_request"
    assert not [r for r in mock_requests(mock_provider) if r.get("model") == "phys-bad-secondary"]


def test_unknown_parameter_is_rejected(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(
            model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}], extra_body={"best_of": 3}
        )
    assert info.value.code == "unsupported_parameter"
    assert info.value.param == "best_of"


def test_sdk_default_values_are_accepted(gateway: Gateway) -> None:
    resp = client(gateway).chat.completions.create(
        model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}], n=1, presence_penalty=0, store=False
    )
    assert resp.choices[0].message.content


def test_max_tokens_conflict_is_rejected(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(
            model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}], max_tokens=10, max_completion_tokens=20
        )
    assert info.value.param == "max_tokens"


def test_hidden_alias_looks_like_a_missing_one(gateway: Gateway) -> None:
    errors = []
    for model in ("chat-hidden-v1", "chat-does-not-exist"):
        with pytest.raises(openai.NotFoundError) as info:
            client(gateway).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        errors.append(info.value)
    assert {e.code for e in errors} == {"model_not_found"}
    assert errors[0].message.replace("chat-hidden-v1", "X") == errors[1].message.replace("chat-does-not-exist", "X")
    visible_a = {m.id for m in client(gateway).models.list()}
    visible_b = {m.id for m in client(gateway, "team-b").models.list()}
    assert "chat-hidden-v1" not in visible_a and "chat-fast-v1" in visible_a
    assert visible_b == {"chat-hidden-v1"}
    resp = client(gateway, "team-b").chat.completions.create(
        model="chat-hidden-v1", messages=[{"role": "user", "content": "hi"}]
    )
    assert resp.model == "chat-hidden-v1"


def test_bad_key_is_401(gateway: Gateway) -> None:
    with openai.OpenAI(base_url=gateway.base_url, api_key="tw-not-a-real-key", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            bad.chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}])
        assert info.value.code == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_oversized_body_is_413(gateway: Gateway) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client(gateway).chat.completions.create(
            model="chat-fast-v1", messages=[{"role": "user", "content": "x" * 70_000}]
        )
    assert info.value.status_code == 413
    assert info.value.code == "request_too_large"


def test_wrong_content_type_is_415(gateway: Gateway) -> None:
    resp = httpx.post(
        gateway.base_url + "/chat/completions",
        headers={"authorization": f"Bearer {gateway.keys['team-a']}", "content-type": "text/plain"},
        content=b'{"model":"chat-fast-v1","messages":[{"role":"user","content":"hi"}]}',
    )
    assert resp.status_code == 415
    assert resp.json()["error"]["code"] == "unsupported_media_type"
    assert resp.headers["x-request-id"]


def test_unknown_path_uses_error_envelope(gateway: Gateway) -> None:
    resp = httpx.get(gateway.base_url + "/nope")
    assert resp.status_code == 404
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert resp.headers["x-request-id"]


def test_provider_credential_never_reaches_client_or_logs(gateway: Gateway) -> None:
    client(gateway).chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APIError):
        list(
            client(gateway).chat.completions.create(
                model="chat-midstream-v1", messages=[{"role": "user", "content": "a b c d e"}], stream=True
            )
        )
    gateway.proc.wait_log_line(lambda line: '"alias":"chat-midstream-v1"' in line)  # both requests were logged
    log = gateway.proc.log()
    assert "sk-e2e-provider-credential-do-not-leak" not in log
    assert "weather in Paris" not in log and "hello there" not in log
    assert '"alias":"chat-fast-v1"' in log
