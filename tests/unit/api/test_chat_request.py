"""Parsing the OpenAI request envelope against an alias's compiled policy."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from tollway.api.chat_request import parse_body, to_canonical
from tollway.canonical import ImagePart, TextPart
from tollway.exceptions import InvalidRequest, UnsupportedParameter
from tollway.routing.plan import AliasPlan, RetryPolicy


def plan(capabilities: set[str] | None = None, allowed: set[str] | None = None, reject: bool = True) -> AliasPlan:
    return AliasPlan(
        name="chat-fast-v1",
        capabilities=frozenset(capabilities if capabilities is not None else {"streaming", "tools", "vision"}),
        max_input_tokens=1000,
        max_output_tokens=500,
        default_max_output_tokens=256,
        allowed_parameters=frozenset(allowed or set()),
        reject_unknown_parameters=reject,
        groups=(),
        retry=RetryPolicy(3, 0.1, 1.0, frozenset({429, 503})),
    )


def parse(body: dict[str, Any], p: AliasPlan | None = None) -> Any:
    return to_canonical(parse_body(orjson.dumps(body)), p or plan())


def base(**extra: Any) -> dict[str, Any]:
    return {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_minimal_request_parses() -> None:
    req = parse(base())
    assert req.messages[0].role == "user" and req.messages[0].content == "hi"
    assert req.stream is False and req.include_usage is False


def test_invalid_json_and_non_object_bodies() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse_body(b"{nope")
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_body(b"[1]")
    with pytest.raises(InvalidRequest) as info:
        parse_body(b'{"messages": []}')
    assert info.value.param == "model"


def test_unknown_parameter_rejected_with_its_name() -> None:
    with pytest.raises(UnsupportedParameter) as info:
        parse(base(logit_bias={"1": 2}))
    assert info.value.param == "logit_bias" and info.value.status == 400


def test_unknown_parameter_allowed_by_alias_goes_to_extensions() -> None:
    req = parse(base(seed=7), plan(allowed={"seed"}))
    assert req.extensions == {"seed": 7}


def test_ignore_policy_drops_unknown_fields() -> None:
    assert parse(base(seed=7), plan(reject=False)).extensions == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 1), ("presence_penalty", 0), ("frequency_penalty", 0.0), ("store", False), ("service_tier", "auto")],
)
def test_documented_sdk_defaults_are_ignored(field: str, value: Any) -> None:
    assert parse(base(**{field: value})).extensions == {}


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("n", True), ("presence_penalty", 0.5), ("store", True)])
def test_non_default_values_of_ignored_fields_are_rejected(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParameter):
        parse(base(**{field: value}))


def test_null_fields_count_as_absent() -> None:
    req = parse(base(temperature=None, frobnicate=None, tools=None))
    assert req.temperature is None and req.tools is None


def test_max_tokens_conflict_and_bound() -> None:
    assert parse(base(max_tokens=10, max_completion_tokens=10)).max_output_tokens == 10
    with pytest.raises(InvalidRequest, match="disagree"):
        parse(base(max_tokens=10, max_completion_tokens=11))
    with pytest.raises(InvalidRequest, match="limit of 500") as info:
        parse(base(max_completion_tokens=501))
    assert info.value.param == "max_completion_tokens"


def test_stream_options_require_stream_and_are_preserved() -> None:
    assert parse(base(stream=True, stream_options={"include_usage": True})).include_usage is True
    assert parse(base(stream=True, stream_options={"include_usage": False})).include_usage is False
    with pytest.raises(InvalidRequest):
        parse(base(stream_options={"include_usage": True}))


def test_capabilities_gate_features() -> None:
    with pytest.raises(UnsupportedParameter) as info:
        parse(base(stream=True), plan({"tools"}))
    assert info.value.param == "stream"
    with pytest.raises(UnsupportedParameter):
        parse(base(response_format={"type": "json_object"}))
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    with pytest.raises(UnsupportedParameter):
        parse({"model": "m", "messages": [image]}, plan({"streaming"}))


def test_content_parts_and_images() -> None:
    msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        ],
    }
    req = parse({"model": "m", "messages": [msg]})
    assert req.messages[0].content == [TextPart("look"), ImagePart("data:image/png;base64,AAAA", "low")]
    with pytest.raises(InvalidRequest):
        parse({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    with pytest.raises(UnsupportedParameter):
        parse({"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})


def test_tool_round_trip_messages() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    req = parse({"model": "m", "messages": messages, "tools": tools, "tool_choice": "required"})
    assert req.messages[1].tool_calls is not None
    assert req.messages[1].tool_calls[0].arguments == '{"a": 1}'
    assert req.messages[2].tool_call_id == "c1"
    assert req.tool_choice is not None and req.tool_choice.mode == "required"


def test_tool_choice_must_name_a_defined_tool() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(InvalidRequest, match="undefined tool"):
        parse(base(tools=tools, tool_choice={"type": "function", "function": {"name": "g"}}))
    with pytest.raises(InvalidRequest, match="requires 'tools'"):
        parse(base(tool_choice="auto"))


def test_tool_message_needs_tool_call_id_and_unknown_message_keys_are_rejected() -> None:
    with pytest.raises(InvalidRequest, match="tool_call_id"):
        parse({"model": "m", "messages": [{"role": "tool", "content": "x"}]})
    with pytest.raises(UnsupportedParameter):
        parse({"model": "m", "messages": [{"role": "user", "content": "x", "weight": 2}]})
    with pytest.raises(InvalidRequest, match="role"):
        parse({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 3),
        ("temperature", True),
        ("top_p", -0.1),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", [""]),
        ("metadata", {"k": 1}),
        ("user", 5),
        ("parallel_tool_calls", "yes"),
        ("max_tokens", 0),
    ],
)
def test_out_of_range_values_are_invalid(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(base(**{field: value}))
    assert info.value.param == field


def test_parsing_random_garbage_never_raises_anything_but_invalid_request() -> None:
    rng = random.Random(7)
    pieces: list[Any] = [None, 1, "x", [], {}, [1], {"role": "user"}, True, 2.5, {"type": "text"}]
    for _ in range(500):
        body = {"model": "m", "messages": [rng.choice(pieces) for _ in range(rng.randint(0, 3))]}
        for key in rng.sample(["tools", "tool_choice", "stop", "response_format", "metadata", "stream_options"], 2):
            body[key] = rng.choice(pieces)
        try:
            parse(body)
        except InvalidRequest:
            pass
