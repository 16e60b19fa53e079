"""Tool-call ids made by one provider, sent to another: each encoder gives ids its provider accepts,
and a call and the result that answers it keep matching ids."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tollway.canonical import CanonicalRequest, Message, ToolCall, ToolDefinition
from tollway.mock.anthropic_messages import AnthropicMessages
from tollway.mock.bedrock_converse import BedrockConverse, route
from tollway.mock.openai_chat import OpenAIChat
from tollway.mock.wire import RequestError
from tollway.providers.anthropic_messages import AnthropicMessagesCodec
from tollway.providers.base import Target
from tollway.providers.bedrock_converse import BedrockConverseCodec
from tollway.providers.gemini.signatures import signed_id
from tollway.providers.openai_chat import OpenAIChatCodec
from tollway.providers.tool_ids import anthropic_tool_id, bedrock_tool_id, fit_tool_id, openai_tool_id

ALPHABET = re.compile(r"[A-Za-z0-9_-]+")
GEMINI_SIGNED = signed_id("call_resp1234_0", "CiQB" + "x9/+Q" * 120 + "==")  # a real signature runs to ~600 bytes
KIMI_STYLE = "functions.get_weather:0"  # fits OpenAI, not Anthropic's or Bedrock's alphabet
NATIVE = ["call_abcdefghijklmnopqrstuvwx", "toolu_01A09q90qw90lq917835lq9", "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q"]


def _fits_openai(value: str) -> bool:
    return len(value) <= 40


def _fits_anthropic(value: str) -> bool:
    return ALPHABET.fullmatch(value) is not None


def _fits_bedrock(value: str) -> bool:
    return len(value) <= 64 and ALPHABET.fullmatch(value) is not None


RULES = [(openai_tool_id, _fits_openai), (anthropic_tool_id, _fits_anthropic), (bedrock_tool_id, _fits_bedrock)]


@pytest.mark.parametrize("call_id", NATIVE)
def test_every_provider_s_own_ids_go_through_unchanged(call_id: str) -> None:
    assert [fit(call_id) for fit, _ in RULES] == [call_id] * 3


@given(st.text(max_size=300))
def test_any_id_comes_out_as_each_provider_accepts_it(call_id: str) -> None:
    for fit, fits in RULES:
        out = fit(call_id)
        assert fits(out), (fit.__name__, call_id, out)
        assert out == call_id if fits(call_id) else out.startswith("tw_") and len(out) == 25
        assert fit(call_id) == out  # the same id always gets the same stand-in


def test_distinct_ids_get_distinct_stand_ins() -> None:
    ids = [f"{GEMINI_SIGNED}{i}" for i in range(2000)] + [f"functions.f:{i}" for i in range(2000)]
    assert len({bedrock_tool_id(i) for i in ids}) == len(ids)


def test_a_length_limit_alone_keeps_any_alphabet() -> None:
    assert fit_tool_id(KIMI_STYLE, 40, id_alphabet=False) == KIMI_STYLE
    assert fit_tool_id("", 40, id_alphabet=False) == ""
    assert fit_tool_id("", None, id_alphabet=True).startswith("tw_")


def _conversation(call_id: str) -> CanonicalRequest:
    call = ToolCall(call_id, "get_weather", '{"city":"Oslo"}')
    return CanonicalRequest(
        [
            Message("user", "Weather in Oslo?"),
            Message("assistant", None, tool_calls=[call]),
            Message("tool", "sunny", tool_call_id=call_id),
            Message("user", "And tomorrow?"),
        ],
        tools=[ToolDefinition("get_weather", parameters={"type": "object", "properties": {}})],
    )


def _openai(req: CanonicalRequest) -> tuple[dict[str, Any], list[str]]:
    body = orjson.loads(OpenAIChatCodec().encode_request(req, Target("gpt-4o")).body)
    msgs = body["messages"]
    return body, [msgs[1]["tool_calls"][0]["id"], msgs[2]["tool_call_id"]]


def _anthropic(req: CanonicalRequest) -> tuple[dict[str, Any], list[str]]:
    body = orjson.loads(AnthropicMessagesCodec().encode_request(req, Target("claude-sonnet-4-5")).body)
    msgs = body["messages"]
    return body, [msgs[1]["content"][0]["id"], msgs[2]["content"][0]["tool_use_id"]]


def _bedrock(req: CanonicalRequest) -> tuple[dict[str, Any], list[str]]:
    upstream = BedrockConverseCodec().encode_request(req, Target("anthropic.claude-3-5-haiku-20241022-v1:0"))
    found = route("/" + upstream.path)
    assert found is not None
    body = {**orjson.loads(upstream.body), "model": found[0], "stream": found[1]}
    msgs = body["messages"]
    return body, [msgs[1]["content"][0]["toolUse"]["toolUseId"], msgs[2]["content"][0]["toolResult"]["toolUseId"]]


PROVIDERS = [
    (_openai, OpenAIChat(), _fits_openai),
    (_anthropic, AnthropicMessages(), _fits_anthropic),
    (_bedrock, BedrockConverse(), _fits_bedrock),
]


@pytest.mark.parametrize("call_id", [GEMINI_SIGNED, KIMI_STYLE, *NATIVE], ids=["gemini", "kimi", *NATIVE])
@pytest.mark.parametrize(("encode", "mock", "fits"), PROVIDERS, ids=["openai", "anthropic", "bedrock"])
def test_each_encoder_sends_ids_its_provider_accepts_and_a_call_and_its_result_still_match(
    encode: Any, mock: Any, fits: Any, call_id: str
) -> None:
    body, (call, result) = encode(_conversation(call_id))
    assert call == result
    assert fits(call)
    assert call == call_id if fits(call_id) else call != call_id
    mock.parse(body)  # the mock checks ids as the provider does, and would raise RequestError


@pytest.mark.parametrize(("encode", "mock", "fits"), PROVIDERS, ids=["openai", "anthropic", "bedrock"])
def test_the_mocks_refuse_an_id_their_provider_refuses(encode: Any, mock: Any, fits: Any) -> None:
    body, _ = encode(_conversation("call_ok"))
    raw = orjson.dumps(body).decode().replace("call_ok", "x" * 41 if encode is _openai else "call:" + "y" * 64)
    with pytest.raises(RequestError):
        mock.parse(orjson.loads(raw))


@pytest.mark.parametrize(("encode", "mock", "fits"), PROVIDERS, ids=["openai", "anthropic", "bedrock"])
def test_the_mocks_refuse_a_result_that_answers_no_call(encode: Any, mock: Any, fits: Any) -> None:
    body, _ = encode(_conversation("call_ok"))
    raw = orjson.dumps(body).decode()
    # Only the result's id changes: the call stays unanswered and the result answers nothing.
    first = raw.index("call_ok")
    second = raw.index("call_ok", first + 1)
    broken = raw[:second] + "call_other" + raw[second + len("call_ok") :]
    with pytest.raises(RequestError, match=r"call_ok|call_other|preceeding message with 'tool_calls'"):
        mock.parse(orjson.loads(broken))
