"""The OpenAI Responses front end: request bodies into canonical requests, canonical answers,
streams and errors back into the Responses shapes (checked against the official SDK's models and
its own stream accumulator)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._types import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from tollway.api.chat_request import parse_body as parse_chat
from tollway.api.chat_request import to_canonical as chat_to_canonical
from tollway.api.responses import RESPONSES
from tollway.api.responses_request import BUILT_IN_TOOLS
from tollway.api.responses_response import ResponseStream, request_settings
from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    FinishReason,
    ImagePart,
    Message,
    ResponseFormat,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import (
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    ModelUnavailable,
    RateLimited,
    StreamCut,
    UnsupportedParameter,
)
from tollway.pipeline.frontend import FrontEnd, ResponseMeta
from tollway.routing.plan import AliasPlan, RetryPolicy
from tollway.sse import SseParser

ALIAS = "chat-fast-v1"
HEX = "0123456789abcdef01234567"
META = ResponseMeta(f"req_{HEX}", 1_700_000_000, ALIAS)
PNG = "data:image/png;base64,iVBORw0KGgo="
ALL = {"streaming", "tools", "vision", "json_object", "json_schema"}
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def plan(
    capabilities: set[str] | None = None, allowed: set[str] | None = None, image_policy: str = "https-public"
) -> AliasPlan:
    return AliasPlan(
        name=ALIAS,
        capabilities=frozenset(capabilities if capabilities is not None else ALL),
        max_input_tokens=100_000,
        max_output_tokens=4096,
        default_max_output_tokens=256,
        allowed_parameters=frozenset(allowed or set()),
        reject_unknown_parameters=True,
        groups=(),
        retry=RetryPolicy(3, 0.1, 1.0, frozenset({429, 503})),
        image_url_policy=image_policy,
    )


class Resolver:
    """The pipeline's resolve, recording each call."""

    def __init__(self, p: AliasPlan) -> None:
        self.plan = p
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, model: str, stream: bool) -> AliasPlan:
        self.calls.append((model, stream))
        return self.plan


def body(**extra: Any) -> dict[str, Any]:
    return {"model": ALIAS, "input": "hi", **extra}


def decode(doc: dict[str, Any], p: AliasPlan | None = None) -> CanonicalRequest:
    return RESPONSES.decode(orjson.dumps(doc), Resolver(p or plan()))


def refused(doc: dict[str, Any], p: AliasPlan | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        decode(doc, p)
    return info.value


def msg(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def input_text(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "input_text", "text": text, **extra}


def output_text(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "output_text", "text": text, **extra}


def image(url: str = PNG, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **extra}


def call(call_id: str, name: str = "get_weather", arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **extra}


def result(call_id: str, output: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output, **extra}


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


# Decoding.


def test_the_front_end_satisfies_the_pipeline_protocol() -> None:
    front: FrontEnd = RESPONSES
    assert front.name == "openai-responses" and front.api_key_header is None
    front.check_headers(cast(Any, None))  # nothing to check, not even the headers object


def test_a_string_input_is_one_user_message() -> None:
    req = decode(body())
    assert req.messages == [Message("user", "hi")]
    assert req.stream is False and req.include_usage is False and req.extensions == {}
    assert req.max_output_tokens is None and req.tools is None and req.response_format is None


def test_resolve_runs_once_with_model_and_stream_before_the_plan_is_checked() -> None:
    resolver = Resolver(plan(capabilities={"tools"}))
    with pytest.raises(UnsupportedParameter) as info:
        RESPONSES.decode(orjson.dumps(body(stream=True)), resolver)
    assert resolver.calls == [(ALIAS, True)]
    assert info.value.param == "stream"


def test_a_streaming_request_keeps_stream_and_reports_usage() -> None:
    req = decode(body(stream=True))
    assert req.stream is True and req.include_usage is True


def test_instructions_become_a_leading_system_message_and_empty_ones_are_left_out() -> None:
    assert decode(body(instructions="Be brief.")).messages == [Message("system", "Be brief."), Message("user", "hi")]
    assert decode(body(instructions="")).messages == [Message("user", "hi")]


@pytest.mark.parametrize("role", ["user", "system", "developer", "assistant"])
def test_message_items_keep_their_role_with_or_without_a_type(role: str) -> None:
    req = decode(body(input=[msg(role, "a"), {"type": "message", **msg(role, "b")}]))
    assert req.messages == [Message(role, "a"), Message(role, "b")]  # type: ignore[arg-type]


def test_one_text_part_collapses_to_a_string_and_several_stay_parts() -> None:
    req = decode(body(input=[msg("user", [input_text("one")]), msg("developer", [input_text("a"), input_text("b")])]))
    assert req.messages == [Message("user", "one"), Message("developer", [TextPart("a"), TextPart("b")])]


def test_user_images_become_image_parts_with_their_detail() -> None:
    req = decode(
        body(input=[msg("user", [input_text("look:"), image(detail="low"), image("https://example.com/a.png")])])
    )
    assert req.messages == [
        Message("user", [TextPart("look:"), ImagePart(PNG, "low"), ImagePart("https://example.com/a.png")])
    ]


def test_images_need_the_vision_capability() -> None:
    err = refused(body(input=[msg("user", [image()])]), plan(capabilities={"streaming"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "input[0].content[0]"


@pytest.mark.parametrize(
    ("policy", "url"),
    [
        ("data-only", "https://example.com/a.png"),
        ("https-public", "http://example.com/a.png"),
        ("https-public", "https://169.254.169.254/latest/meta-data"),
    ],
)
def test_image_urls_follow_the_alias_policy(policy: str, url: str) -> None:
    err = refused(body(input=[msg("user", [image(url)])]), plan(image_policy=policy))
    assert type(err) is InvalidRequest and err.param == "input[0].content[0].image_url"


def test_assistant_history_text_and_refusal_parts_become_its_text() -> None:
    history = msg(
        "assistant", [output_text("Sure.", annotations=[], logprobs=[]), {"type": "refusal", "refusal": "No."}]
    )
    req = decode(body(input=[msg("user", "x"), history]))
    assert req.messages[1] == Message("assistant", [TextPart("Sure."), TextPart("No.")])


def test_consecutive_function_calls_join_one_assistant_message_after_its_text() -> None:
    req = decode(
        body(
            tools=[WEATHER],
            input=[
                msg("user", "weather in Paris and Rome?"),
                {"type": "message", "role": "assistant", "content": [output_text("Checking.")]},
                call("call_1", arguments='{"city":"Paris"}'),
                call("call_2", arguments='{"city":"Rome"}'),
                result("call_1", "sunny"),
                result("call_2", [input_text("rain"), input_text("cold")]),
                call("call_3"),
            ],
        )
    )
    assert req.messages == [
        Message("user", "weather in Paris and Rome?"),
        Message(
            "assistant",
            "Checking.",
            tool_calls=[
                ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                ToolCall("call_2", "get_weather", '{"city":"Rome"}'),
            ],
        ),
        Message("tool", "sunny", tool_call_id="call_1"),
        Message("tool", [TextPart("rain"), TextPart("cold")], tool_call_id="call_2"),
        Message("assistant", None, tool_calls=[ToolCall("call_3", "get_weather", "{}")]),
    ]


def test_a_previous_responses_output_items_decode_when_sent_back_as_input() -> None:
    usage = Usage(10, 5)
    first = orjson.loads(
        RESPONSES.encode_response(
            META,
            CanonicalResponse("Checking.", [ToolCall("c1", "f", "{}")], "tool_calls", usage),
            CanonicalRequest(messages=[]),
        )
    )
    req = decode(body(input=[msg("user", "x"), *first["output"], result("c1", "ok")]))
    assert req.messages[1] == Message("assistant", "Checking.", tool_calls=[ToolCall("c1", "f", "{}")])
    assert req.messages[2] == Message("tool", "ok", tool_call_id="c1")


def test_function_tools_map_to_canonical_definitions_and_strict_passes_as_given() -> None:
    loose = {"type": "function", "name": "f", "parameters": None}
    req = decode(body(tools=[WEATHER, loose], tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False))
    assert req.tools == [
        ToolDefinition("get_weather", "Weather.", WEATHER["parameters"], True),  # type: ignore[arg-type]
        ToolDefinition("f", None, None, None),
    ]
    assert req.tool_choice == ToolChoice("function", "f") and req.parallel_tool_calls is False


@pytest.mark.parametrize("mode", ["auto", "none", "required"])
def test_tool_choice_modes_map_to_canonical_choices(mode: str) -> None:
    assert decode(body(tools=[WEATHER], tool_choice=mode)).tool_choice == ToolChoice(mode)  # type: ignore[arg-type]


def test_tools_need_the_tools_capability() -> None:
    err = refused(body(tools=[WEATHER]), plan(capabilities={"streaming"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "tools"


@pytest.mark.parametrize("kind", sorted(BUILT_IN_TOOLS))
def test_built_in_tools_are_refused_naming_their_type(kind: str) -> None:
    err = refused(body(tools=[WEATHER, {"type": kind}]))
    assert isinstance(err, UnsupportedParameter) and err.param == "tools[1].type"
    assert "Built-in tool" in err.message and "not served by this gateway yet" in err.message


def test_a_built_in_tool_is_named_even_when_the_alias_has_no_tools() -> None:
    err = refused(body(tools=[{"type": "web_search"}]), plan(capabilities=set()))
    assert err.param == "tools[0].type"


def test_output_limits_and_sampling_are_checked_against_the_alias() -> None:
    req = decode(body(max_output_tokens=4096, temperature=2, top_p=0.5))
    assert (req.max_output_tokens, req.temperature, req.top_p) == (4096, 2.0, 0.5)
    assert refused(body(max_output_tokens=4097)).param == "max_output_tokens"
    assert refused(body(max_output_tokens=0)).param == "max_output_tokens"
    assert refused(body(temperature=2.5)).param == "temperature"
    assert refused(body(top_p=True)).param == "top_p"


def test_text_formats_map_to_canonical_response_formats() -> None:
    assert decode(body(text={"format": {"type": "text"}})).response_format is None
    assert decode(body(text={"format": {"type": "json_object"}})).response_format == ResponseFormat("json_object")


def test_a_json_schema_format_reaches_providers_in_the_same_shape_as_chat_completions() -> None:
    spec = {"name": "city", "description": "A city.", "schema": {"type": "object"}, "strict": True}
    ours = decode(body(text={"format": {"type": "json_schema", **spec}})).response_format
    chat_body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}
    chat = chat_to_canonical(
        parse_chat(orjson.dumps({**chat_body, "response_format": {"type": "json_schema", "json_schema": spec}})), plan()
    )
    assert ours == chat.response_format == ResponseFormat("json_schema", spec)
    bare = decode(body(text={"format": {"type": "json_schema", "name": "n", "schema": {}}})).response_format
    assert bare == ResponseFormat("json_schema", {"name": "n", "schema": {}})


@pytest.mark.parametrize(
    ("fmt", "capability"),
    [({"type": "json_object"}, "json_object"), ({"type": "json_schema", "name": "n", "schema": {}}, "json_schema")],
)
def test_json_formats_need_their_capability(fmt: dict[str, Any], capability: str) -> None:
    err = refused(body(text={"format": fmt}), plan(capabilities=ALL - {capability}))
    assert isinstance(err, UnsupportedParameter) and err.param == "text.format"


def test_metadata_and_user_pass_through() -> None:
    req = decode(body(metadata={"team": "a"}, user="u-1"))
    assert req.metadata == {"team": "a"} and req.user == "u-1"
    assert refused(body(metadata={str(i): "v" for i in range(17)})).param == "metadata"


@pytest.mark.parametrize(
    "patch",
    [
        {"store": False},
        {"background": False},
        {"include": []},
        {"truncation": "disabled"},
        {"service_tier": "auto"},
        {"service_tier": "default"},
        {"reasoning": None},
        {"previous_response_id": None},
        {"stream": True, "stream_options": {"include_obfuscation": False}},
    ],
    ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()),
)
def test_values_that_ask_for_nothing_are_served(patch: dict[str, Any]) -> None:
    assert decode(body(**patch)).messages == [Message("user", "hi")]


NOT_YET = [
    ("store", {"store": True}, "store"),
    ("previous-response", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("background", {"background": True}, "background"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("prompt", {"prompt": {"id": "pmpt_1"}}, "prompt"),
    ("include", {"include": ["reasoning.encrypted_content"]}, "include"),
    ("reasoning", {"reasoning": {"effort": "low"}}, "reasoning"),
    ("truncation", {"truncation": "auto"}, "truncation"),
    ("max-tool-calls", {"max_tool_calls": 3}, "max_tool_calls"),
    ("top-logprobs", {"top_logprobs": 2}, "top_logprobs"),
    ("service-tier", {"service_tier": "flex"}, "service_tier"),
    ("prompt-cache-key", {"prompt_cache_key": "k"}, "prompt_cache_key"),
    (
        "obfuscation",
        {"stream": True, "stream_options": {"include_obfuscation": True}},
        "stream_options.include_obfuscation",
    ),
    ("verbosity", {"text": {"verbosity": "low"}}, "text.verbosity"),
    ("phase", {"input": [msg("assistant", "x", phase="commentary")]}, "input[0].phase"),
    ("item-reference", {"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ("reasoning-item", {"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ("input-file", {"input": [msg("user", [{"type": "input_file", "file_id": "f"}])]}, "input[0].content[0].type"),
    (
        "image-file-id",
        {"input": [msg("user", [{"type": "input_image", "file_id": "f"}])]},
        "input[0].content[0].file_id",
    ),
    ("image-original", {"input": [msg("user", [image(detail="original")])]}, "input[0].content[0].detail"),
    (
        "cache-breakpoint",
        {"input": [msg("user", [input_text("x", prompt_cache_breakpoint={"mode": "explicit"})])]},
        "input[0].content[0].prompt_cache_breakpoint",
    ),
    (
        "annotations",
        {"input": [msg("assistant", [output_text("x", annotations=[{"type": "url_citation"}])])]},
        "input[0].content[0].annotations",
    ),
    ("output-image", {"input": [result("c", [image()])]}, "input[0].output[0].type"),
    ("custom-tool", {"tools": [{"type": "custom", "name": "x"}]}, "tools[0].type"),
    ("allowed-tools", {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice.type"),
]


@pytest.mark.parametrize(("patch", "param"), [r[1:] for r in NOT_YET], ids=[r[0] for r in NOT_YET])
def test_features_not_served_yet_are_refused_by_name(patch: dict[str, Any], param: str) -> None:
    err = refused(body(**patch))
    assert type(err) is UnsupportedParameter and err.status == 400 and err.param == param
    assert "not supported yet" in err.message or "not served by this gateway yet" in err.message


INVALID = [
    ("no-input", {"input": None}, "input"),
    ("empty-input", {"input": []}, "input"),
    ("input-type", {"input": 3}, "input"),
    ("item-not-object", {"input": ["x"]}, "input[0]"),
    ("role", {"input": [msg("tool", "x")]}, "input[0].role"),
    ("empty-content", {"input": [msg("user", [])]}, "input[0].content"),
    ("output-text-in-user", {"input": [msg("user", [output_text("x")])]}, "input[0].content[0].type"),
    ("input-text-in-assistant", {"input": [msg("assistant", [input_text("x")])]}, "input[0].content[0].type"),
    ("image-in-system", {"input": [msg("system", [image()])]}, "input[0].content[0].type"),
    ("call-id", {"input": [call("")]}, "input[0].call_id"),
    ("call-arguments", {"input": [{**call("c"), "arguments": {}}]}, "input[0].arguments"),
    ("output-call-id", {"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ("output-type", {"input": [result("c", 3)]}, "input[0].output"),
    ("instructions", {"instructions": ["x"]}, "instructions"),
    ("tool-name", {"tools": [{**WEATHER, "name": ""}]}, "tools[0].name"),
    ("tool-params", {"tools": [{**WEATHER, "parameters": "{}"}]}, "tools[0].parameters"),
    ("tool-strict", {"tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict"),
    ("choice-without-tools", {"tool_choice": "auto"}, "tool_choice"),
    ("choice-undefined", {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ("choice-shape", {"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
    ("parallel", {"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("text", {"text": "json"}, "text"),
    ("format-type", {"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ("schema-missing", {"text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ("schema-name", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ("stream-options-without-stream", {"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ("store-type", {"store": "no"}, "store"),
    ("user", {"user": 7}, "user"),
]


@pytest.mark.parametrize(("patch", "param"), [r[1:] for r in INVALID], ids=[r[0] for r in INVALID])
def test_malformed_bodies_are_invalid_requests_naming_the_field(patch: dict[str, Any], param: str) -> None:
    doc = {k: v for k, v in {**body(), **patch}.items() if v is not None}
    err = refused(doc)
    assert err.status == 400 and err.param == param


def test_store_true_says_the_gateway_does_not_store_responses() -> None:
    assert "responses are not stored" in refused(body(store=True)).message


def test_unknown_fields_are_refused_even_when_the_alias_allowlists_them() -> None:
    err = refused(body(logit_bias={"1": 2}), plan(allowed={"logit_bias"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "logit_bias"


SECRET = "SECRET-VALUE"


@pytest.mark.parametrize(
    "doc",
    [
        body(input=[msg("user", [{"type": SECRET * 20}])]),
        body(**{SECRET * 20: 1}),
        body(tools=[{"type": SECRET * 20}]),
        body(input=[{"type": SECRET * 20}]),
        body(input=[msg("user", "x", **{SECRET * 20: 1})]),
    ],
    ids=["part-type", "top-level-key", "tool-type", "item-type", "item-key"],
)
def test_a_client_chosen_name_in_an_error_is_bounded(doc: dict[str, Any]) -> None:
    err = refused(doc)
    assert SECRET in err.message and SECRET * 6 not in err.message
    assert err.param is None or SECRET * 6 not in err.param


@pytest.mark.parametrize(
    "doc",
    [
        body(input=[msg("user", [image(f"http://{SECRET}.example/a.png")])]),
        body(user=SECRET * 30),
        body(tools=[WEATHER], tool_choice={"type": "function", "name": SECRET}),
        body(metadata={"k": SECRET * 100}),
    ],
    ids=["image-url", "user", "tool-choice-name", "metadata"],
)
def test_errors_never_echo_request_values(doc: dict[str, Any]) -> None:
    assert SECRET not in refused(doc).message


def test_envelope_errors_are_client_errors_before_resolve() -> None:
    resolver = Resolver(plan())
    for raw, param in [
        (b"{nope", None),
        (b"[1]", None),
        (b'{"input": "x"}', "model"),
        (b'{"model": "m", "stream": 1}', "stream"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            RESPONSES.decode(raw, resolver)
        assert info.value.param == param
    assert resolver.calls == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
_type_names = st.sampled_from(
    ["message", "function_call", "function_call_output", "input_text", "input_image", "output_text", "refusal"]
)
_parts = st.lists(
    st.dictionaries(
        st.sampled_from(["type", "text", "image_url", "detail", "refusal", "annotations"]), _json | _type_names
    ),
    max_size=3,
)
_items = st.lists(
    st.dictionaries(
        st.sampled_from(["type", "role", "content", "call_id", "name", "arguments", "output", "id", "status"]),
        _json | _type_names | st.sampled_from(["user", "assistant", "system"]) | _parts,
        max_size=6,
    ),
    max_size=4,
)
_bodies = (
    st.dictionaries(
        st.sampled_from(
            [
                "input",
                "instructions",
                "stream",
                "stream_options",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "max_output_tokens",
                "temperature",
                "top_p",
                "text",
                "metadata",
                "user",
                "store",
                "include",
                "truncation",
                "service_tier",
            ]
        ),
        _json,
        max_size=6,
    ).map(lambda extra: {"model": ALIAS, "input": "hi", **extra})
    | st.fixed_dictionaries({"model": st.just(ALIAS), "input": _items | _json})
    | st.fixed_dictionaries(
        {
            "model": st.just(ALIAS),
            "input": st.just("hi"),
            "tools": st.just([WEATHER]) | st.lists(st.dictionaries(st.sampled_from(list(WEATHER)), _json)) | _json,
            "tool_choice": _json | st.fixed_dictionaries({"type": _json, "name": _json}),
            "text": _json
            | st.fixed_dictionaries(
                {
                    "format": _json
                    | st.dictionaries(
                        st.sampled_from(["type", "name", "schema", "strict"]),
                        _json | st.sampled_from(["json_schema", "json_object", "text"]),
                    )
                }
            ),
        }
    )
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies)
def test_any_body_decodes_or_is_a_client_error(doc: dict[str, Any]) -> None:
    try:
        req = decode(doc)
    except GatewayError as err:
        assert 400 <= err.status < 500
    else:
        assert isinstance(req, CanonicalRequest)


# Buffered answers.


def render(resp: CanonicalResponse, req: CanonicalRequest | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(RESPONSES.encode_response(META, resp, req or CanonicalRequest(messages=[])))
    Response.model_validate(doc)
    return doc


def test_a_buffered_response_echoes_the_requests_settings() -> None:
    req = decode(body(tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}], temperature=0.5))
    doc = render(CanonicalResponse("ok", None, "stop", Usage(1, 1)), req)
    assert [t["name"] for t in doc["tools"]] == ["f"]
    assert doc["temperature"] == 0.5


def test_a_text_answer_renders_as_a_completed_response_with_usage() -> None:
    usage = Usage(prompt_tokens=100, completion_tokens=7, cached_prompt_tokens=30, cache_creation_tokens=20)
    doc = render(CanonicalResponse("Bonjour.", None, "stop", usage))
    assert doc == {
        "id": f"resp_{HEX}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": ALIAS,
        "output": [
            {
                "id": f"msg_{HEX}_0",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Bonjour.", "annotations": []}],
            }
        ],
        "previous_response_id": None,
        "reasoning": None,
        "truncation": "disabled",
        **request_settings(CanonicalRequest(messages=[])),
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 20},
            "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 107,
        },
    }
    assert Response.model_validate(doc).output_text == "Bonjour."


def test_a_buffered_answer_to_a_request_without_settings_carries_the_defaults() -> None:
    doc = render(CanonicalResponse("x", None, "stop", Usage(1, 1)))
    assert (doc["tools"], doc["tool_choice"], doc["parallel_tool_calls"]) == ([], "auto", True)
    assert doc["instructions"] is None and doc["temperature"] is None


def test_tool_calls_render_as_function_call_items_after_the_message() -> None:
    calls = [ToolCall("call_1", "get_weather", '{"city": "Tōkyō"}'), ToolCall("call_2", "get_time", "")]
    doc = render(CanonicalResponse("Checking.", calls, "tool_calls", Usage(10, 5)))
    assert doc["status"] == "completed"
    assert [item["type"] for item in doc["output"]] == ["message", "function_call", "function_call"]
    assert doc["output"][1:] == [
        {
            "id": f"fc_{HEX}_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Tōkyō"}',
        },
        {
            "id": f"fc_{HEX}_2",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_2",
            "name": "get_time",
            "arguments": "",
        },
    ]
    only_calls = render(CanonicalResponse(None, calls[:1], "tool_calls", Usage(1, 1)))
    assert [item["id"] for item in only_calls["output"]] == [f"fc_{HEX}_0"]


@pytest.mark.parametrize(
    ("finish", "status", "reason"),
    [
        ("stop", "completed", None),
        ("tool_calls", "completed", None),
        ("length", "incomplete", "max_output_tokens"),
        ("content_filter", "incomplete", "content_filter"),
    ],
)
def test_finish_reasons_map_to_status_and_incomplete_details(
    finish: FinishReason, status: str, reason: str | None
) -> None:
    doc = render(CanonicalResponse("x", [ToolCall("c", "f", '{"a')], finish, Usage(1, 1)))
    assert doc["status"] == status
    assert doc["incomplete_details"] == ({"reason": reason} if reason else None)
    assert [item["status"] for item in doc["output"]] == ["completed", "incomplete" if reason else "completed"]


def test_a_refusal_is_a_refusal_part_and_missing_usage_is_null() -> None:
    doc = render(CanonicalResponse(None, None, "content_filter", None, refusal="I can't help with that."))
    assert doc["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]
    assert doc["usage"] is None


def test_an_empty_answer_has_no_output_items() -> None:
    assert render(CanonicalResponse("", None, "stop", Usage(1, 0)))["output"] == []


# Errors.


@pytest.mark.parametrize(
    "err", [InvalidRequest("bad", param="input"), RateLimited(retry_after=2.5), ModelUnavailable()]
)
def test_errors_render_in_the_openai_envelope(err: GatewayError) -> None:
    reply = RESPONSES.encode_error(err)
    assert reply.status == err.status
    assert orjson.loads(reply.body) == {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }
    assert reply.headers == ({"retry-after": "3"} if err.retry_after else {})


# Streams.


def payloads(data: bytes) -> list[dict[str, Any]]:
    """Each event's JSON, checked against the SDK's event union; names repeat types and sequence
    numbers count up by one."""
    out = []
    for ev in SseParser().feed(data):
        doc = orjson.loads(ev.data)
        assert doc["type"] == ev.event, "each event's name repeats its type"
        EVENT.validate_python(doc)
        out.append(doc)
    numbers = [d["sequence_number"] for d in out]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if numbers else True
    return out


def encoder(req: CanonicalRequest | None = None) -> ResponseStream:
    return RESPONSES.encode_stream(META, req or CanonicalRequest(messages=[Message("user", "hi")], stream=True))


def run(events: list[StreamEvent], usage: Usage | None = None, req: CanonicalRequest | None = None) -> bytes:
    enc = encoder(req)
    return b"".join(enc.event(ev) for ev in events) + enc.end(usage or Usage(12, 5))


def accumulate(data: bytes) -> Response:
    """The final response as the official SDK's stream helper builds it from these events."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    final = None
    for doc in payloads(data):
        for ev in state.handle_event(cast(Any, EVENT.validate_python(doc))):
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert final is not None
    return final


def test_a_text_stream_is_framed_as_the_responses_event_sequence() -> None:
    data = run([StreamStart("up-1"), TextDelta("Bon"), TextDelta("jour"), StreamFinish("stop"), StreamUsage(Usage(1))])
    docs = payloads(data)
    assert [(d["type"], d["sequence_number"]) for d in docs] == [
        ("response.created", 0),
        ("response.in_progress", 1),
        ("response.output_item.added", 2),
        ("response.content_part.added", 3),
        ("response.output_text.delta", 4),
        ("response.output_text.delta", 5),
        ("response.output_text.done", 6),
        ("response.content_part.done", 7),
        ("response.output_item.done", 8),
        ("response.completed", 9),
    ]
    created = docs[0]["response"]
    assert created["id"] == f"resp_{HEX}" and created["status"] == "in_progress" and created["output"] == []
    assert created["usage"] is None and created["model"] == ALIAS
    item_id = f"msg_{HEX}_0"
    assert docs[2]["item"] == {
        "id": item_id,
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert docs[5] == {
        "type": "response.output_text.delta",
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        "delta": "jour",
        "logprobs": [],
        "sequence_number": 5,
    }
    assert docs[6]["text"] == "Bonjour" and docs[7]["part"]["text"] == "Bonjour"
    completed = docs[-1]["response"]
    assert completed["status"] == "completed" and completed["output"] == [docs[8]["item"]]
    assert completed["usage"]["input_tokens"] == 12 and completed["usage"]["output_tokens"] == 5
    final = accumulate(data)
    assert final.output_text == "Bonjour" and final.status == "completed"


def test_the_stream_repeats_the_requests_settings() -> None:
    req = CanonicalRequest(
        messages=[Message("user", "hi")],
        max_output_tokens=64,
        temperature=0.3,
        stream=True,
        tools=[ToolDefinition("f", "F.", {"type": "object"}, True)],
        tool_choice=ToolChoice("function", "f"),
        parallel_tool_calls=False,
        response_format=ResponseFormat("json_schema", {"name": "n", "schema": {"type": "object"}, "strict": True}),
        metadata={"team": "a"},
        user="u-1",
    )
    response = payloads(run([TextDelta("{}")], req=req))[0]["response"]
    assert response["tools"] == [
        {"type": "function", "name": "f", "description": "F.", "parameters": {"type": "object"}, "strict": True}
    ]
    assert response["tool_choice"] == {"type": "function", "name": "f"} and response["parallel_tool_calls"] is False
    assert response["text"] == {
        "format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    }
    assert (response["max_output_tokens"], response["temperature"], response["top_p"]) == (64, 0.3, None)
    assert response["metadata"] == {"team": "a"} and response["user"] == "u-1"
    plain = payloads(run([TextDelta("x")]))[0]["response"]
    assert plain["text"] == {"format": {"type": "text"}} and plain["tool_choice"] == "auto" and plain["tools"] == []


def test_tool_calls_stream_as_function_call_items_with_argument_deltas() -> None:
    data = run(
        [
            ToolCallDelta(0, "call_1", "get_weather", ""),
            ToolCallDelta(0, arguments='{"city": '),
            ToolCallDelta(0, arguments='"Tōkyō"}'),
            ToolCallDelta(1, "call_2", "get_time", "{}"),
            StreamFinish("tool_calls"),
        ]
    )
    docs = payloads(data)
    assert [(d["type"], d.get("output_index")) for d in docs[2:]] == [
        ("response.output_item.added", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.completed", None),
    ]
    assert docs[2]["item"] == {
        "id": f"fc_{HEX}_0",
        "type": "function_call",
        "status": "in_progress",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": "",
    }
    assert docs[3] == {
        "type": "response.function_call_arguments.delta",
        "item_id": f"fc_{HEX}_0",
        "output_index": 0,
        "delta": '{"city": ',
        "sequence_number": 3,
    }
    assert docs[5]["arguments"] == '{"city": "Tōkyō"}'
    assert docs[6]["item"] == {**docs[2]["item"], "status": "completed", "arguments": '{"city": "Tōkyō"}'}
    final = accumulate(data)
    assert final.status == "completed"
    assert [(o.type, o.call_id, o.name, o.arguments) for o in final.output] == [  # type: ignore[union-attr]
        ("function_call", "call_1", "get_weather", '{"city": "Tōkyō"}'),
        ("function_call", "call_2", "get_time", "{}"),
    ]


def test_text_then_a_tool_call_then_text_opens_a_new_message_item() -> None:
    data = run([TextDelta("Let me check."), ToolCallDelta(0, "c1", "f", '{"a": 1}'), TextDelta("Done.")])
    docs = payloads(data)
    added = [(d["output_index"], d["item"]["type"]) for d in docs if d["type"] == "response.output_item.added"]
    done = [d["output_index"] for d in docs if d["type"] == "response.output_item.done"]
    assert added == [(0, "message"), (1, "function_call"), (2, "message")] and done == [0, 1, 2]
    final = accumulate(data)
    assert [o.id for o in final.output] == [f"msg_{HEX}_0", f"fc_{HEX}_1", f"msg_{HEX}_2"]
    assert final.output_text == "Let me check.Done."


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_an_incomplete_stream_ends_with_response_incomplete_and_its_last_item_incomplete(
    finish: FinishReason, reason: str
) -> None:
    data = run([TextDelta("Once upon"), StreamFinish(finish)])
    docs = payloads(data)
    assert [d["type"] for d in docs[-2:]] == ["response.output_item.done", "response.incomplete"]
    assert docs[-2]["item"]["status"] == "incomplete"
    response = docs[-1]["response"]
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": reason}
    final = accumulate(data)
    assert final.status == "incomplete" and final.output_text == "Once upon"


def test_the_finish_is_held_until_the_end_with_the_final_usage() -> None:
    enc = encoder()
    assert enc.event(TextDelta("x"))
    assert enc.event(StreamFinish("stop")) == b""
    assert enc.event(StreamUsage(Usage(3, 4))) == b""
    docs = payloads(enc.end(Usage(prompt_tokens=9, completion_tokens=4, cached_prompt_tokens=2)))
    assert [d["type"] for d in docs] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert docs[-1]["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 2, "cache_write_tokens": 0}
    assert docs[-1]["response"]["usage"]["total_tokens"] == 13


def test_a_stream_without_output_still_opens_and_completes_the_response() -> None:
    docs = payloads(run([StreamFinish("stop")]))
    assert [d["type"] for d in docs] == ["response.created", "response.in_progress", "response.completed"]
    assert docs[-1]["response"]["output"] == []


def test_an_error_mid_stream_is_one_error_event_numbered_next_and_changes_nothing() -> None:
    enc = encoder()
    lifetime = enc.error(DeadlineExceeded("The stream exceeded its maximum lifetime."))
    assert payloads(lifetime)[0]["sequence_number"] == 0
    first = enc.event(TextDelta("Déjà"))
    assert [d["type"] for d in payloads(first)][:2] == ["response.created", "response.in_progress"]
    docs = payloads(enc.error(StreamCut()))
    assert docs == [
        {
            "type": "error",
            "code": "upstream_stream_cut",
            "message": StreamCut().message,
            "param": None,
            "sequence_number": 5,
        }
    ]
    assert payloads(enc.error(ModelUnavailable()))[0]["sequence_number"] == 5, "error() must not change state"
    assert payloads(enc.event(TextDelta(" vu")))[0]["sequence_number"] == 5


def test_an_argument_fragment_for_a_closed_call_still_reaches_the_final_response() -> None:
    data = run(
        [
            ToolCallDelta(0, "c1", "f", '{"a":'),
            ToolCallDelta(1, "c2", "g", "{}"),
            ToolCallDelta(0, arguments="1}"),
            StreamFinish("tool_calls"),
        ]
    )
    late = payloads(data)[-2]
    assert late["type"] == "response.output_item.done" and late["output_index"] == 1
    final = accumulate(data)
    assert [o.arguments for o in final.output] == ['{"a":1}', "{}"]  # type: ignore[union-attr]


def test_calls_the_provider_gave_no_id_get_distinct_call_ids() -> None:
    final = accumulate(run([ToolCallDelta(0, None, "f", "{}"), ToolCallDelta(1, None, "f", "{}")]))
    assert [o.call_id for o in final.output] == [f"call_{HEX}_0", f"call_{HEX}_1"]  # type: ignore[union-attr]


_events = st.lists(
    st.one_of(
        st.builds(TextDelta, st.text(max_size=12)),
        st.integers(0, 2).flatmap(
            lambda i: st.builds(  # a provider's call ids are distinct, as Responses clients key calls by them
                ToolCallDelta,
                st.just(i),
                st.one_of(st.none(), st.just(f"call_{i}")),
                st.one_of(st.none(), st.just("tool")),
                st.text(max_size=8),
            )
        ),
        st.builds(StreamFinish, st.sampled_from(["stop", "length", "tool_calls", "content_filter"])),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(_events, st.booleans())
def test_any_encoded_stream_reparses_to_the_same_events_split_at_every_byte(
    events: list[StreamEvent], fail: bool
) -> None:
    enc = ResponseStream(f"req_{HEX}", 1, ALIAS, request_settings(None))
    data = b"".join(enc.event(ev) for ev in events)
    data += enc.error(StreamCut()) if fail else enc.end(Usage(3, 2))
    whole = SseParser().feed(data)
    assert all(ev.event is not None for ev in whole)
    for i in range(len(data) + 1):
        parser = SseParser()
        assert parser.feed(data[:i]) + parser.feed(data[i:]) == whole
    docs = payloads(data)
    if fail:
        assert docs[-1]["type"] == "error"
        return
    assert docs[0]["sequence_number"] == 0 and docs[-1]["type"] in ("response.completed", "response.incomplete")
    added = [d["output_index"] for d in docs if d["type"] == "response.output_item.added"]
    done = [d["output_index"] for d in docs if d["type"] == "response.output_item.done"]
    assert added == done == list(range(len(added)))
    final = accumulate(data)
    assert len(final.output) == len(added)
    texts = [ev.text for ev in events if isinstance(ev, TextDelta)]
    assert final.output_text == "".join(texts)


def test_encoders_share_no_state() -> None:
    one = encoder()
    one.event(TextDelta("a"))
    two = encoder()
    assert payloads(two.event(TextDelta("b")))[0]["type"] == "response.created"


def test_prompt_cache_key_and_safety_identifier_pass_when_the_alias_allowlists_them() -> None:
    allowed = plan(allowed={"prompt_cache_key", "safety_identifier"})
    req = decode(body(prompt_cache_key="codex-session-1", safety_identifier="u-42"), allowed)
    assert req.extensions == {"prompt_cache_key": "codex-session-1", "safety_identifier": "u-42"}
    assert refused(body(prompt_cache_key="k")).param == "prompt_cache_key"  # not allowlisted: refused
    assert refused(body(prompt_cache_key=7), allowed).param == "prompt_cache_key"
