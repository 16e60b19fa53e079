"""The Anthropic Messages front end: request bodies into canonical requests, canonical answers,
streams and errors back into Anthropic's shapes (checked against the official SDK's models)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import anthropic
import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from tollway.api.anthropic_messages import ANTHROPIC_MESSAGES, count_tokens
from tollway.api.anthropic_response import MessageStream
from tollway.canonical import (
    CacheControl,
    CanonicalRequest,
    CanonicalResponse,
    FinishReason,
    ImagePart,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
    estimate_request_tokens,
)
from tollway.exceptions import (
    AuthenticationFailed,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    ModelUnavailable,
    Overloaded,
    PermissionDenied,
    ProviderFailed,
    RateLimited,
    RequestTooLarge,
    StreamCut,
    UnsupportedParameter,
)
from tollway.pipeline.frontend import FrontEnd, ResponseMeta
from tollway.providers import ProviderFormat, Target, codec_for
from tollway.routing.circuit import CircuitPolicy
from tollway.routing.health import DeploymentHealth
from tollway.routing.plan import AliasPlan, Deployment, RetryPolicy, RouteTarget
from tollway.sse import SseParser
from tollway.wire import SseEvent

ALIAS = "claude-fast-v1"
ANTHROPIC = ProviderFormat.ANTHROPIC_MESSAGES
OPENAI = ProviderFormat.OPENAI_CHAT
META = ResponseMeta("req_0123456789abcdef01234567", 1_700_000_000, ALIAS)
PNG = "iVBORw0KGgo="


def _route(fmt: ProviderFormat) -> RouteTarget:
    deployment = Deployment(f"{fmt.value}-1", fmt, codec_for(fmt), cast(Any, None), "acct", "quota")
    return RouteTarget(f"route-{fmt.value}", deployment, Target("m"), 1, 0, DeploymentHealth(CircuitPolicy()))


def plan(
    capabilities: set[str] | None = None,
    formats: tuple[ProviderFormat, ...] = (ANTHROPIC,),
    allowed: set[str] | None = None,
    image_policy: str = "https-public",
) -> AliasPlan:
    return AliasPlan(
        name=ALIAS,
        capabilities=frozenset(capabilities if capabilities is not None else {"streaming", "tools", "vision"}),
        max_input_tokens=100_000,
        max_output_tokens=4096,
        default_max_output_tokens=256,
        allowed_parameters=frozenset(allowed or set()),
        reject_unknown_parameters=True,
        groups=(tuple(_route(f) for f in formats),),
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
    return {"model": ALIAS, "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}], **extra}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def image_b64(media_type: str = "image/png", **extra: Any) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": PNG}, **extra}


def image_url(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def tool_result(call_id: str, content: Any = None, **extra: Any) -> dict[str, Any]:
    out = {"type": "tool_result", "tool_use_id": call_id, **extra}
    if content is not None:
        out["content"] = content
    return out


WEATHER = {"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object", "properties": {}}}


def decode(doc: dict[str, Any], p: AliasPlan | None = None) -> CanonicalRequest:
    return ANTHROPIC_MESSAGES.decode(orjson.dumps(doc), Resolver(p or plan()))


def refused(doc: dict[str, Any], p: AliasPlan | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        decode(doc, p)
    return info.value


# Decoding.


def test_the_front_end_satisfies_the_pipeline_protocol() -> None:
    front: FrontEnd = ANTHROPIC_MESSAGES
    assert front.name == "anthropic-messages" and front.api_key_header == "x-api-key"


def test_a_minimal_message_decodes_to_one_user_message_and_its_output_limit() -> None:
    req = decode(body())
    assert req.messages == [Message("user", "hi")]
    assert req.max_output_tokens == 256 and req.stream is False and req.extensions == {}


def test_resolve_runs_once_with_model_and_stream_before_the_plan_is_checked() -> None:
    resolver = Resolver(plan(capabilities={"tools"}))
    with pytest.raises(UnsupportedParameter) as info:
        ANTHROPIC_MESSAGES.decode(orjson.dumps(body(stream=True)), resolver)
    assert resolver.calls == [(ALIAS, True)]
    assert info.value.param == "stream"


def test_a_streaming_request_keeps_stream_and_reports_usage() -> None:
    req = decode(body(stream=True))
    assert req.stream is True and req.include_usage is True


def test_a_system_string_becomes_the_leading_system_message() -> None:
    req = decode(body(system="Be brief."))
    assert req.messages[0] == Message("system", "Be brief.")
    assert req.messages[1].role == "user"


def test_system_blocks_stay_separate_text_parts_and_one_block_is_a_string() -> None:
    several = decode(body(system=[text("You are terse."), text("Answer in French.")]))
    assert several.messages[0] == Message("system", [TextPart("You are terse."), TextPart("Answer in French.")])
    assert decode(body(system=[text("One.")])).messages[0] == Message("system", "One.")
    assert decode(body(system="")).messages == [Message("user", "hi")]


def test_user_text_and_image_blocks_become_content_parts_in_order() -> None:
    req = decode(
        body(messages=[user(text("look:"), image_b64("image/webp"), image_url("https://example.com/cat.png"))])
    )
    assert req.messages == [
        Message(
            "user",
            [TextPart("look:"), ImagePart(f"data:image/webp;base64,{PNG}"), ImagePart("https://example.com/cat.png")],
        )
    ]


def test_an_assistant_turn_becomes_text_and_tool_calls_with_serialized_input() -> None:
    req = decode(
        body(
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "weather?"},
                assistant(text("Checking."), tool_use("toolu_1", "get_weather", {"city": "Paris", "days": 2})),
                user(tool_result("toolu_1", "sunny")),
            ],
        )
    )
    call = req.messages[1]
    assert call.role == "assistant" and call.content == "Checking."
    assert call.tool_calls == [ToolCall("toolu_1", "get_weather", '{"city":"Paris","days":2}')]
    assert req.messages[2] == Message("tool", "sunny", tool_call_id="toolu_1")


def test_an_assistant_turn_of_only_tool_use_has_no_content() -> None:
    req = decode(body(messages=[user(text("x")), assistant(tool_use("toolu_1", "f", {}))]))
    assert req.messages[1].content is None and req.messages[1].tool_calls == [ToolCall("toolu_1", "f", "{}")]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("21 C", "21 C"),
        ([text("21 C")], "21 C"),
        ([text("21 C"), text("windy")], [TextPart("21 C"), TextPart("windy")]),
        (None, ""),
        ([], ""),
    ],
    ids=["string", "one-block", "two-blocks", "absent", "empty"],
)
def test_a_tool_result_becomes_a_tool_message_with_its_text(content: Any, expected: Any) -> None:
    req = decode(body(messages=[user(tool_result("toolu_9", content))]))
    assert req.messages == [Message("tool", expected, tool_call_id="toolu_9")]


def test_text_alongside_tool_results_becomes_user_messages_in_order() -> None:
    req = decode(body(messages=[user(tool_result("a", "1"), text("and also"), image_b64(), tool_result("b", "2"))]))
    assert [(m.role, m.tool_call_id) for m in req.messages] == [("tool", "a"), ("user", None), ("tool", "b")]
    assert req.messages[1].content == [TextPart("and also"), ImagePart(f"data:image/png;base64,{PNG}")]


def test_a_failed_tool_result_is_refused_rather_than_passed_on_as_a_success() -> None:
    err = refused(body(messages=[user(tool_result("a", "boom", is_error=True))]))
    assert isinstance(err, UnsupportedParameter) and err.param == "messages[0].content[0].is_error"
    assert decode(body(messages=[user(tool_result("a", "ok", is_error=False))])).messages[0].content == "ok"


def test_an_image_in_a_tool_result_passes_only_when_no_route_is_openai_format() -> None:
    doc = body(messages=[user(tool_result("a", [text("chart:"), image_b64()]))])
    assert decode(doc).messages[0].content == [TextPart("chart:"), ImagePart(f"data:image/png;base64,{PNG}")]
    err = refused(doc, plan(formats=(ANTHROPIC, OPENAI)))
    assert isinstance(err, UnsupportedParameter) and err.param == "messages[0].content[0].content[1]"


def test_images_need_the_vision_capability() -> None:
    err = refused(body(messages=[user(image_b64())]), plan(capabilities={"streaming"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "messages[0].content[0]"


@pytest.mark.parametrize(
    ("policy", "url"),
    [
        ("data-only", "https://example.com/a.png"),
        ("https-public", "http://example.com/a.png"),
        ("https-public", "https://169.254.169.254/latest/meta-data"),
        ("https-public", "https://localhost/a.png"),
    ],
)
def test_image_urls_follow_the_alias_policy(policy: str, url: str) -> None:
    err = refused(body(messages=[user(image_url(url))]), plan(image_policy=policy))
    assert type(err) is InvalidRequest and err.param == "messages[0].content[0].source.url"


def test_a_base64_image_needs_an_image_media_type() -> None:
    err = refused(body(messages=[user(image_b64("text/html"))]))
    assert err.param == "messages[0].content[0].source.media_type"


def test_tools_and_tool_choice_map_to_canonical_definitions() -> None:
    req = decode(body(tools=[WEATHER, {"type": "custom", **WEATHER, "name": "other"}], tool_choice={"type": "auto"}))
    assert req.tools is not None and [t.name for t in req.tools] == ["get_weather", "other"]
    assert req.tools[0].description == "Weather." and req.tools[0].parameters == WEATHER["input_schema"]
    assert req.tool_choice == ToolChoice("auto") and req.parallel_tool_calls is None


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, ToolChoice("auto")),
        ({"type": "any"}, ToolChoice("required")),
        ({"type": "tool", "name": "get_weather"}, ToolChoice("function", "get_weather")),
        ({"type": "none"}, ToolChoice("none")),
    ],
)
def test_each_tool_choice_maps_to_its_canonical_mode(choice: dict[str, Any], expected: ToolChoice) -> None:
    assert decode(body(tools=[WEATHER], tool_choice=choice)).tool_choice == expected


def test_disabling_parallel_tool_use_turns_parallel_tool_calls_off() -> None:
    req = decode(body(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}))
    assert req.tool_choice == ToolChoice("required") and req.parallel_tool_calls is False


def test_sampling_options_stop_sequences_and_user_id_are_carried() -> None:
    req = decode(
        body(temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["END", "\n\nHuman:"], metadata={"user_id": "u-1"})
    )
    assert (req.temperature, req.top_p, req.top_k) == (0.5, 0.9, 40)
    assert req.stop == ["END", "\n\nHuman:"] and req.user == "u-1"


def test_thinking_disabled_and_null_fields_are_accepted_as_absent() -> None:
    req = decode(body(thinking={"type": "disabled"}, service_tier=None, top_k=None, system=None, container=None))
    assert req.top_k is None and req.messages == [Message("user", "hi")] and req.thinking_budget is None
    assert decode(body(thinking={"type": "disabled"}), plan(formats=(ANTHROPIC, OPENAI))).thinking_budget is None


def test_top_k_is_refused_when_a_route_is_openai_format() -> None:
    err = refused(body(top_k=5), plan(formats=(ANTHROPIC, OPENAI)))
    assert isinstance(err, UnsupportedParameter) and err.param == "top_k"
    assert err.message == f"'top_k' is not supported by model '{ALIAS}'."


def test_more_than_four_stop_sequences_are_refused_when_a_route_is_openai_format() -> None:
    stops = ["a", "b", "c", "d", "e"]
    assert decode(body(stop_sequences=stops)).stop == stops
    err = refused(body(stop_sequences=stops), plan(formats=(OPENAI,)))
    assert isinstance(err, UnsupportedParameter) and err.param == "stop_sequences"


def test_an_unknown_field_is_refused_even_when_the_alias_allowlists_it() -> None:
    # allowedParameters name OpenAI fields; forwarding an Anthropic body's field to an OpenAI-format
    # route under that name would send something the client never meant.
    err = refused(body(seed=7), plan(allowed={"seed"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "seed"


# Prompt caching, extended thinking and betas.

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
THINKING = {"type": "enabled", "budget_tokens": 1024}
SIGNED = {"type": "thinking", "thinking": "The user greets me.", "signature": "EqQBCgIYAhIM1gbcDa9G"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}


def mixed(reject: bool = True) -> AliasPlan:
    """An alias with an Anthropic-format route and an OpenAI-format fallback."""
    p = plan(formats=(ANTHROPIC, OPENAI))
    return p if reject else dataclasses.replace(p, reject_unknown_parameters=False)


def test_cache_control_is_kept_where_the_client_put_it() -> None:
    req = decode(
        body(
            system=[text("Policy.", cache_control=EPHEMERAL), text("Today.")],
            tools=[{**WEATHER, "cache_control": HOUR}],
            messages=[
                user(text("weather?"), image_b64(cache_control=EPHEMERAL)),
                assistant(text("Checking."), {**tool_use("toolu_1", "get_weather", {}), "cache_control": EPHEMERAL}),
                user(tool_result("toolu_1", "sunny")),
            ],
        )
    )
    assert req.messages[0] == Message("system", [TextPart("Policy.", CacheControl()), TextPart("Today.")])
    assert req.messages[1].content == [
        TextPart("weather?"),
        ImagePart(f"data:image/png;base64,{PNG}", cache_control=CacheControl()),
    ]
    assert req.messages[2].tool_calls == [ToolCall("toolu_1", "get_weather", "{}", CacheControl())]
    assert req.messages[3] == Message("tool", "sunny", tool_call_id="toolu_1")
    assert req.tools is not None and req.tools[0].cache_control == CacheControl("1h")


def test_a_single_cached_block_stays_a_part_so_its_breakpoint_survives() -> None:
    req = decode(
        body(system=[text("Policy.", cache_control=EPHEMERAL)], messages=[user(text("hi", cache_control=HOUR))])
    )
    assert req.messages == [
        Message("system", [TextPart("Policy.", CacheControl())]),
        Message("user", [TextPart("hi", CacheControl("1h"))]),
    ]


def test_cache_control_on_a_tool_result_and_inside_it_is_kept() -> None:
    req = decode(
        body(
            messages=[
                user(
                    tool_result("a", "sunny", cache_control=EPHEMERAL),
                    tool_result("b", [text("21 C", cache_control=EPHEMERAL)]),
                )
            ]
        )
    )
    assert req.messages == [
        Message("tool", "sunny", tool_call_id="a", cache_control=CacheControl()),
        Message("tool", [TextPart("21 C", CacheControl())], tool_call_id="b"),
    ]


def test_four_breakpoints_are_allowed() -> None:
    req = decode(body(system=[text(str(i), cache_control=EPHEMERAL) for i in range(4)]))
    assert req.messages[0].content == [TextPart(str(i), CacheControl()) for i in range(4)]


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"system": [text("x", cache_control=EPHEMERAL)]}, "system[0].cache_control"),
        ({"tools": [{**WEATHER, "cache_control": EPHEMERAL}]}, "tools[0].cache_control"),
        ({"messages": [user(text("x"), text("y", cache_control=EPHEMERAL))]}, "messages[0].content[1].cache_control"),
        ({"messages": [user(tool_result("a", "x", cache_control=EPHEMERAL))]}, "messages[0].content[0].cache_control"),
    ],
    ids=["system", "tool", "text", "tool-result"],
)
def test_cache_control_on_an_alias_with_an_openai_route_is_refused_under_reject(
    patch: dict[str, Any], param: str
) -> None:
    err = refused(body(**patch), mixed())
    assert type(err) is UnsupportedParameter and err.param == param
    assert err.message == (
        f"'{param}' is not supported by model '{ALIAS}', which may be served by a route that cannot write cache "
        "breakpoints."
    )


def test_cache_control_on_an_alias_with_an_openai_route_is_kept_under_ignore() -> None:
    req = decode(body(system=[text("Policy.", cache_control=EPHEMERAL)]), mixed(reject=False))
    assert req.messages[0] == Message("system", [TextPart("Policy.", CacheControl())])


def test_thinking_enabled_carries_its_budget() -> None:
    assert decode(body(max_tokens=2048, thinking=THINKING)).thinking_budget == 1024


def test_thinking_is_refused_on_an_alias_with_an_openai_route_whatever_the_policy() -> None:
    for p in (mixed(), mixed(reject=False)):
        err = refused(body(max_tokens=2048, thinking=THINKING), p)
        assert type(err) is UnsupportedParameter and err.param == "thinking"
        assert err.message == f"'thinking' is not supported by model '{ALIAS}'."


def test_the_interleaved_thinking_beta_lets_the_budget_exceed_max_tokens() -> None:
    doc = orjson.dumps(body(max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 4096}))
    headers = Headers(anthropic_beta=["interleaved-thinking-2025-05-14"])
    req = ANTHROPIC_MESSAGES.decode(doc, Resolver(plan()), headers)
    assert req.thinking_budget == 4096 and req.anthropic_beta == ("interleaved-thinking-2025-05-14",)
    with pytest.raises(InvalidRequest):
        ANTHROPIC_MESSAGES.decode(doc, Resolver(plan()))  # without the beta, the budget must stay under


def test_thinking_blocks_go_back_unchanged_in_order_before_tool_calls() -> None:
    req = decode(
        body(
            max_tokens=2048,
            thinking=THINKING,
            tools=[WEATHER],
            messages=[
                user(text("weather?")),
                assistant(SIGNED, REDACTED, text("Checking."), tool_use("toolu_1", "get_weather", {})),
                user(tool_result("toolu_1", "sunny")),
            ],
        )
    )
    assert req.messages[1] == Message(
        "assistant",
        [
            ThinkingPart("The user greets me.", "EqQBCgIYAhIM1gbcDa9G"),
            RedactedThinkingPart("EmwKAhgBEgy3va3pzix/LafPsn4a"),
            TextPart("Checking."),
        ],
        tool_calls=[ToolCall("toolu_1", "get_weather", "{}")],
    )


@pytest.mark.parametrize("block", [SIGNED, REDACTED], ids=["thinking", "redacted"])
def test_thinking_blocks_are_refused_on_an_alias_with_an_openai_route(block: dict[str, Any]) -> None:
    err = refused(body(messages=[user(text("x")), assistant(block, text("y"))]), mixed(reject=False))
    assert type(err) is UnsupportedParameter and err.param == "messages[1].content[0]"
    assert err.message == f"A {block['type']} block ('messages[1].content[0]') is not supported by model '{ALIAS}'."


REFUSALS: list[tuple[str, dict[str, Any], type[GatewayError], str]] = [
    ("no-max-tokens", {"max_tokens": None}, InvalidRequest, "max_tokens"),
    ("zero-max-tokens", {"max_tokens": 0}, InvalidRequest, "max_tokens"),
    ("bool-max-tokens", {"max_tokens": True}, InvalidRequest, "max_tokens"),
    ("max-tokens-over-limit", {"max_tokens": 4097}, InvalidRequest, "max_tokens"),
    ("system-role", {"messages": [{"role": "system", "content": "x"}]}, InvalidRequest, "messages[0].role"),
    ("tool-role", {"messages": [{"role": "tool", "content": "x"}]}, InvalidRequest, "messages[0].role"),
    ("empty-messages", {"messages": []}, InvalidRequest, "messages"),
    ("empty-content", {"messages": [{"role": "user", "content": []}]}, InvalidRequest, "messages[0].content"),
    (
        "message-key",
        {"messages": [{"role": "user", "content": "x", "name": "n"}]},
        UnsupportedParameter,
        "messages[0].name",
    ),
    ("temperature", {"temperature": 1.5}, InvalidRequest, "temperature"),
    ("top-p", {"top_p": -0.1}, InvalidRequest, "top_p"),
    ("top-k", {"top_k": 0}, InvalidRequest, "top_k"),
    ("stop-empty-string", {"stop_sequences": [""]}, InvalidRequest, "stop_sequences"),
    ("stop-too-many", {"stop_sequences": [str(i) for i in range(17)]}, InvalidRequest, "stop_sequences"),
    ("metadata-key", {"metadata": {"user_id": "u", "team": "t"}}, UnsupportedParameter, "metadata.team"),
    ("service-tier", {"service_tier": "auto"}, UnsupportedParameter, "service_tier"),
    ("unknown", {"logit_bias": {"1": 2}}, UnsupportedParameter, "logit_bias"),
    ("container", {"container": "c-1"}, UnsupportedParameter, "container"),
    (
        "mcp-servers",
        {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
        UnsupportedParameter,
        "mcp_servers",
    ),
    ("top-level-cache", {"cache_control": EPHEMERAL}, UnsupportedParameter, "cache_control"),
    (
        "server-tool",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        UnsupportedParameter,
        "tools[0].type",
    ),
    (
        "bash-tool",
        {"tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}]},
        UnsupportedParameter,
        "tools[1].type",
    ),
    ("tool-schema", {"tools": [{"name": "f"}]}, InvalidRequest, "tools[0].input_schema"),
    ("choice-without-tools", {"tool_choice": {"type": "auto"}}, InvalidRequest, "tool_choice"),
    (
        "choice-undefined-tool",
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        InvalidRequest,
        "tool_choice.name",
    ),
    ("choice-type", {"tools": [WEATHER], "tool_choice": "auto"}, InvalidRequest, "tool_choice"),
    (
        "citations",
        {"messages": [user(text("x", citations=[{"type": "char_location"}]))]},
        UnsupportedParameter,
        "messages[0].content[0].citations",
    ),
    (
        "document",
        {"messages": [user({"type": "document", "source": {}})]},
        UnsupportedParameter,
        "messages[0].content[0].type",
    ),
    (
        "search-result",
        {"messages": [user({"type": "search_result"})]},
        UnsupportedParameter,
        "messages[0].content[0].type",
    ),
    (
        "file-image",
        {"messages": [user({"type": "image", "source": {"type": "file", "file_id": "f"}})]},
        UnsupportedParameter,
        "messages[0].content[0].source.type",
    ),
    ("tool-use-in-user", {"messages": [user(tool_use("a", "f", {}))]}, InvalidRequest, "messages[0].content[0].type"),
    (
        "tool-result-in-assistant",
        {"messages": [user(text("x")), assistant(tool_result("a", "x"))]},
        InvalidRequest,
        "messages[1].content[0].type",
    ),
    (
        "tool-use-input",
        {"messages": [user(text("x")), assistant({"type": "tool_use", "id": "a", "name": "f", "input": "{}"})]},
        InvalidRequest,
        "messages[1].content[0].input",
    ),
    ("thinking-not-object", {"thinking": "on"}, InvalidRequest, "thinking"),
    ("thinking-adaptive", {"thinking": {"type": "adaptive"}}, UnsupportedParameter, "thinking.type"),
    (
        "thinking-small-budget",
        {"thinking": {"type": "enabled", "budget_tokens": 1023}},
        InvalidRequest,
        "thinking.budget_tokens",
    ),
    ("thinking-no-budget", {"thinking": {"type": "enabled"}}, InvalidRequest, "thinking.budget_tokens"),
    (
        "thinking-budget-not-below-max-tokens",
        {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}},
        InvalidRequest,
        "thinking.budget_tokens",
    ),
    (
        "thinking-key",
        {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1024, "effort": "high"}},
        UnsupportedParameter,
        "thinking.effort",
    ),
    (
        "disabled-thinking-key",
        {"thinking": {"type": "disabled", "budget_tokens": 1024}},
        UnsupportedParameter,
        "thinking.budget_tokens",
    ),
    (
        "thinking-block-in-user",
        {"messages": [user({"type": "thinking", "thinking": "t", "signature": "s"})]},
        InvalidRequest,
        "messages[0].content[0].type",
    ),
    (
        "thinking-block-without-signature",
        {"messages": [user(text("x")), assistant({"type": "thinking", "thinking": "t"})]},
        InvalidRequest,
        "messages[1].content[0].signature",
    ),
    (
        "redacted-thinking-without-data",
        {"messages": [user(text("x")), assistant({"type": "redacted_thinking", "data": ""})]},
        InvalidRequest,
        "messages[1].content[0].data",
    ),
    (
        "thinking-block-cache",
        {
            "messages": [
                user(text("x")),
                assistant({"type": "thinking", "thinking": "t", "signature": "s", "cache_control": EPHEMERAL}),
            ]
        },
        UnsupportedParameter,
        "messages[1].content[0].cache_control",
    ),
    (
        "cache-type",
        {"messages": [user(text("x", cache_control={"type": "persistent"}))]},
        InvalidRequest,
        "messages[0].content[0].cache_control",
    ),
    (
        "cache-ttl",
        {"system": [text("x", cache_control={"type": "ephemeral", "ttl": "2h"})]},
        InvalidRequest,
        "system[0].cache_control.ttl",
    ),
    (
        "cache-key",
        {"tools": [{**WEATHER, "cache_control": {"type": "ephemeral", "scope": "org"}}]},
        UnsupportedParameter,
        "tools[0].cache_control.scope",
    ),
    (
        "five-breakpoints",
        {"system": [text(str(i), cache_control=EPHEMERAL) for i in range(5)]},
        InvalidRequest,
        "system[4].cache_control",
    ),
]


@pytest.mark.parametrize(("patch", "error", "param"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_requests_outside_the_profile_are_refused_naming_the_field(
    patch: dict[str, Any], error: type[GatewayError], param: str
) -> None:
    doc = {k: v for k, v in {**body(), **patch}.items() if v is not None}
    err = refused(doc)
    assert type(err) is error and err.param == param and err.status == 400


def test_null_cache_control_and_empty_citations_carry_nothing_and_pass() -> None:
    req = decode(body(messages=[user(text("a", cache_control=None, citations=[]))]))
    assert req.messages == [Message("user", "a")]


def test_known_unsupported_fields_are_refused_even_when_allowlisted() -> None:
    err = refused(body(container="c"), plan(allowed={"container"}))
    assert err.param == "container" and "not supported yet" in err.message


SECRET = "SECRET-VALUE"


@pytest.mark.parametrize(
    "doc",
    [
        body(messages=[user({"type": SECRET * 20})]),
        body(**{SECRET * 20: 1}),
        body(tools=[{"type": SECRET * 20, "name": "x"}]),
        body(messages=[user(text("x", **{SECRET * 20: 1}))]),
    ],
    ids=["block-type", "top-level-key", "tool-type", "block-key"],
)
def test_a_client_chosen_name_in_an_error_is_bounded(doc: dict[str, Any]) -> None:
    err = refused(doc)
    assert SECRET in err.message and SECRET * 6 not in err.message
    assert err.param is None or SECRET * 6 not in err.param


@pytest.mark.parametrize(
    "doc",
    [
        body(messages=[user(image_b64(SECRET))]),
        body(messages=[user(image_url(f"http://{SECRET}.example/a.png"))]),
        body(metadata={"user_id": SECRET * 30}),
        body(tools=[WEATHER], tool_choice={"type": "tool", "name": SECRET}),
        body(messages=[user(tool_result(SECRET, "x", is_error=True))]),
    ],
    ids=["media-type", "image-url", "user-id", "tool-choice-name", "tool-result"],
)
def test_errors_never_echo_request_values(doc: dict[str, Any]) -> None:
    assert SECRET not in refused(doc).message


def test_tools_need_the_tools_capability() -> None:
    err = refused(body(tools=[]), plan(capabilities={"streaming"}))
    assert isinstance(err, UnsupportedParameter) and err.param == "tools"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
_block_types = st.sampled_from(["text", "image", "tool_use", "tool_result", "document", "thinking"])
_blocks = st.lists(
    st.dictionaries(
        st.sampled_from(["type", "text", "source", "id", "name", "input", "tool_use_id", "content", "is_error"]),
        _json | _block_types,
        max_size=5,
    ),
    max_size=3,
)
_bodies = (
    st.dictionaries(
        st.sampled_from(
            [
                "max_tokens",
                "system",
                "stream",
                "stop_sequences",
                "temperature",
                "top_k",
                "tools",
                "tool_choice",
                "metadata",
            ]
        ),
        _json,
        max_size=5,
    ).map(lambda extra: {"model": ALIAS, "max_tokens": 16, **extra})
    | st.fixed_dictionaries(
        {
            "model": st.just(ALIAS),
            "max_tokens": st.just(16),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant"]) | _json, "content": _blocks | _json}
                ),
                max_size=3,
            ),
        }
    )
    | st.fixed_dictionaries(
        {
            "model": st.just(ALIAS),
            "max_tokens": st.just(16),
            "messages": st.just([{"role": "user", "content": "hi"}]),
            "tools": st.just([WEATHER]) | _json,
            "tool_choice": _json | st.fixed_dictionaries({"type": _json, "name": _json}),
        }
    )
)


@settings(max_examples=300, deadline=None)
@given(_bodies)
def test_any_body_decodes_or_is_a_client_error(doc: dict[str, Any]) -> None:
    try:
        req = decode(doc)
    except GatewayError as err:
        assert 400 <= err.status < 500
    else:
        assert isinstance(req, CanonicalRequest)


def test_envelope_errors_are_client_errors() -> None:
    resolver = Resolver(plan())
    for raw, param in [
        (b"{nope", None),
        (b"[1]", None),
        (b'{"max_tokens": 5}', "model"),
        (b'{"model": "m", "stream": 1}', "stream"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            ANTHROPIC_MESSAGES.decode(raw, resolver)
        assert info.value.param == param
    assert resolver.calls == []


def test_count_tokens_needs_no_max_tokens_and_answers_the_local_estimate() -> None:
    doc = {"model": ALIAS, "system": "Be brief.", "messages": [{"role": "user", "content": "hello " * 50}]}
    resolver = Resolver(plan(capabilities=set()))
    answer = orjson.loads(count_tokens(orjson.dumps({**doc, "stream": True}), resolver))
    expected = estimate_request_tokens(
        CanonicalRequest(messages=[Message("system", "Be brief."), Message("user", "hello " * 50)])
    )
    assert answer == {"input_tokens": expected} and expected > 50
    assert resolver.calls == [(ALIAS, False)]
    anthropic.types.MessageTokensCount.model_validate(answer)


def test_count_tokens_checks_the_body_like_a_message() -> None:
    thinking = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "thinking": THINKING}
    assert orjson.loads(count_tokens(orjson.dumps(thinking), Resolver(plan()))) == {"input_tokens": 2}
    with pytest.raises(UnsupportedParameter) as info:
        count_tokens(orjson.dumps(thinking), Resolver(plan(formats=(ANTHROPIC, OPENAI))))
    assert info.value.param == "thinking"


class Headers:
    def __init__(self, **values: list[str]) -> None:
        self.values = {k.replace("_", "-"): v for k, v in values.items()}

    def get(self, key: str, /) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def getlist(self, key: str) -> list[str]:
        return self.values.get(key, [])


@pytest.mark.parametrize("version", [None, "2023-06-01", "2026-10-21", anthropic._constants.ANTHROPIC_API_VERSION])
def test_anthropic_versions_from_2023_06_01_on_are_accepted(version: str | None) -> None:
    ANTHROPIC_MESSAGES.check_headers(Headers(anthropic_version=[version]) if version else Headers())


@pytest.mark.parametrize("version", ["2023-01-01", "latest", "2023-06-01; drop table", ""])
def test_an_older_or_malformed_anthropic_version_is_refused(version: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        ANTHROPIC_MESSAGES.check_headers(Headers(anthropic_version=[version]))
    assert info.value.param == "anthropic-version"


def decode_with(beta: list[str], doc: dict[str, Any], p: AliasPlan) -> CanonicalRequest:
    headers = Headers(anthropic_beta=beta)
    ANTHROPIC_MESSAGES.check_headers(headers)
    return ANTHROPIC_MESSAGES.decode(orjson.dumps(doc), Resolver(p), headers)


def test_allowlisted_betas_are_carried_in_order_once_each() -> None:
    req = decode_with(
        ["context-1m-2025-08-07, prompt-caching-2024-07-31", " context-1m-2025-08-07 ,,", ""], body(), plan()
    )
    assert req.anthropic_beta == ("context-1m-2025-08-07", "prompt-caching-2024-07-31")
    assert decode(body()).anthropic_beta == ()


@pytest.mark.parametrize("value", ["x-2025", "prompt-caching-2024-07-31,claude-code-20250219"])
def test_an_unknown_anthropic_beta_is_refused_naming_it(value: str) -> None:
    with pytest.raises(UnsupportedParameter) as info:
        ANTHROPIC_MESSAGES.check_headers(Headers(anthropic_beta=[value]))
    name = value.rsplit(",", 1)[-1]
    assert info.value.param == "anthropic-beta"
    assert info.value.message.startswith(f"The anthropic-beta {name!r} is not supported by this gateway; supported: ")
    assert "prompt-caching-2024-07-31" in info.value.message


def test_an_alias_with_an_openai_route_takes_only_betas_that_need_nothing_from_the_provider() -> None:
    neutral = ["prompt-caching-2024-07-31,token-efficient-tools-2025-02-19,fine-grained-tool-streaming-2025-05-14"]
    assert len(decode_with(neutral, body(), mixed()).anthropic_beta) == 3
    with pytest.raises(UnsupportedParameter) as info:
        decode_with(["prompt-caching-2024-07-31", "context-1m-2025-08-07"], body(), mixed())
    assert info.value.param == "anthropic-beta"
    assert info.value.message == f"The anthropic-beta 'context-1m-2025-08-07' is not supported by model '{ALIAS}'."


def test_count_tokens_takes_the_betas_too() -> None:
    headers = Headers(anthropic_beta=["context-1m-2025-08-07"])
    with pytest.raises(UnsupportedParameter):
        count_tokens(orjson.dumps(body()), Resolver(mixed()), headers)
    count_tokens(orjson.dumps(body()), Resolver(mixed()))  # no header, no beta: nothing left over


# Buffered answers.


def render(resp: CanonicalResponse) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(ANTHROPIC_MESSAGES.encode_response(META, resp, CanonicalRequest(messages=[])))
    anthropic.types.Message.model_validate(doc)
    return doc


def test_a_text_answer_renders_as_an_anthropic_message_with_usage_and_cache_tokens() -> None:
    usage = Usage(prompt_tokens=100, completion_tokens=7, cached_prompt_tokens=30, cache_creation_tokens=20)
    doc = render(CanonicalResponse("Bonjour.", None, "stop", usage))
    assert doc == {
        "id": "msg_0123456789abcdef01234567",
        "type": "message",
        "role": "assistant",
        "model": ALIAS,
        "content": [{"type": "text", "text": "Bonjour."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 50,
            "output_tokens": 7,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 30,
        },
    }


def test_tool_calls_render_as_tool_use_blocks_with_parsed_input() -> None:
    calls = [
        ToolCall("call_1", "get_weather", '{"city": "Tōkyō"}'),
        ToolCall("call_2", "get_time", ""),
        ToolCall("call_3", "cut_off", '{"city": "Par'),
        ToolCall("call_4", "listy", "[1, 2]"),
    ]
    doc = render(CanonicalResponse("Checking.", calls, "tool_calls", Usage(10, 5)))
    assert doc["stop_reason"] == "tool_use"
    assert doc["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Tōkyō"}},
        {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
        {"type": "tool_use", "id": "call_3", "name": "cut_off", "input": {"_raw": '{"city": "Par'}},
        {"type": "tool_use", "id": "call_4", "name": "listy", "input": {"_raw": "[1, 2]"}},
    ]


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"), ("content_filter", "refusal")],
)
def test_finish_reasons_map_to_anthropic_stop_reasons(finish: FinishReason, stop_reason: str) -> None:
    assert render(CanonicalResponse("x", None, finish, Usage(1, 1)))["stop_reason"] == stop_reason


def test_thinking_blocks_render_first_with_their_signatures() -> None:
    thinking = [ThinkingPart("Paris, then.", "sig-1"), RedactedThinkingPart("opaque")]
    doc = render(CanonicalResponse("Sunny.", None, "stop", Usage(10, 30), thinking=thinking))
    assert doc["content"] == [
        {"type": "thinking", "thinking": "Paris, then.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Sunny."},
    ]


def test_a_refusal_is_kept_as_text_and_missing_usage_is_zero() -> None:
    doc = render(CanonicalResponse(None, None, "content_filter", None, refusal="I can't help with that."))
    assert doc["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert doc["usage"]["input_tokens"] == 0 and doc["usage"]["output_tokens"] == 0


# Errors.


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (UnsupportedParameter("no"), 400, "invalid_request_error"),
        (AuthenticationFailed(), 401, "authentication_error"),
        (PermissionDenied(), 403, "permission_error"),
        (ModelNotFound(), 404, "not_found_error"),
        (RequestTooLarge(), 413, "request_too_large"),
        (RateLimited(retry_after=2.5), 429, "rate_limit_error"),
        (ProviderFailed(), 502, "api_error"),
        (ModelUnavailable(), 503, "overloaded_error"),
        (Overloaded(status=429), 429, "overloaded_error"),
        (DeadlineExceeded(), 504, "timeout_error"),
        (GatewayError(), 500, "api_error"),
    ],
)
def test_errors_render_in_anthropics_envelope_typed_by_status(err: GatewayError, status: int, kind: str) -> None:
    reply = ANTHROPIC_MESSAGES.encode_error(err)
    assert reply.status == status
    assert orjson.loads(reply.body) == {"type": "error", "error": {"type": kind, "message": err.message}}


def test_an_error_keeps_its_retry_after() -> None:
    assert ANTHROPIC_MESSAGES.encode_error(RateLimited(retry_after=2.5)).headers == {"retry-after": "3"}


# Streams.


def frames(data: bytes) -> list[SseEvent]:
    return SseParser().feed(data)


def run(events: list[StreamEvent], usage: Usage | None = None, req: CanonicalRequest | None = None) -> bytes:
    encoder = ANTHROPIC_MESSAGES.encode_stream(META, req or CanonicalRequest(messages=[Message("user", "hi")]))
    out = b"".join(encoder.event(ev) for ev in events)
    return out + encoder.end(usage or Usage(12, 5))


def payloads(data: bytes) -> list[dict[str, Any]]:
    out = []
    for ev in frames(data):
        doc = orjson.loads(ev.data)
        assert doc["type"] == ev.event, "each event's name repeats its type"
        out.append(doc)
    return out


def accumulate(data: bytes) -> Any:
    """The final message as the official SDK's stream helper builds it from these events."""
    snapshot = None
    bufs: dict[int, bytes] = {}
    for doc in payloads(data):
        if doc["type"] != "ping":
            snapshot = accumulate_event(event=cast(Any, doc), current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


def test_a_text_stream_is_framed_as_anthropics_event_sequence() -> None:
    data = run([StreamStart("up-1"), TextDelta("Bon"), TextDelta("jour"), StreamFinish("stop"), StreamUsage(Usage(1))])
    docs = payloads(data)
    assert [d["type"] for d in docs] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = docs[0]["message"]
    assert start["id"] == "msg_0123456789abcdef01234567" and start["model"] == ALIAS and start["content"] == []
    assert docs[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert docs[4] == {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "jour"}}
    assert docs[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert docs[6]["usage"]["output_tokens"] == 5 and docs[6]["usage"]["input_tokens"] == 12
    final = accumulate(data)
    assert final.content[0].text == "Bonjour" and final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 5)


def test_message_start_carries_the_estimated_input_tokens() -> None:
    req = CanonicalRequest(messages=[Message("user", "x" * 400)])
    docs = payloads(run([TextDelta("a")], req=req))
    assert docs[0]["message"]["usage"] == {"input_tokens": estimate_request_tokens(req), "output_tokens": 0}


def test_tool_calls_stream_as_tool_use_blocks_with_input_json_deltas() -> None:
    data = run(
        [
            ToolCallDelta(0, "toolu_1", "get_weather", ""),
            ToolCallDelta(0, arguments='{"city": '),
            ToolCallDelta(0, arguments='"Tōkyō"}'),
            ToolCallDelta(1, "toolu_2", "get_time", "{}"),
            StreamFinish("tool_calls"),
        ]
    )
    docs = payloads(data)
    assert [(d["type"], d.get("index")) for d in docs[2:]] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert docs[2]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    assert docs[3]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    final = accumulate(data)
    assert final.stop_reason == "tool_use"
    assert [(b.id, b.name, b.input) for b in final.content] == [
        ("toolu_1", "get_weather", {"city": "Tōkyō"}),
        ("toolu_2", "get_time", {}),
    ]


def test_text_then_tools_then_text_number_blocks_across_kinds() -> None:
    data = run(
        [
            TextDelta("Let me check."),
            ToolCallDelta(0, "toolu_1", "f", '{"a": 1}'),
            TextDelta("Done."),
            StreamFinish("stop"),
        ]
    )
    docs = payloads(data)
    starts = [(d["index"], d["content_block"]["type"]) for d in docs if d["type"] == "content_block_start"]
    stops = [d["index"] for d in docs if d["type"] == "content_block_stop"]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "text")] and stops == [0, 1, 2]
    final = accumulate(data)
    assert [b.type for b in final.content] == ["text", "tool_use", "text"]
    assert final.content[1].input == {"a": 1} and final.content[2].text == "Done."


def test_the_finish_is_held_until_the_end_with_the_final_usage() -> None:
    encoder = ANTHROPIC_MESSAGES.encode_stream(META, CanonicalRequest(messages=[]))
    assert encoder.event(TextDelta("x"))
    assert encoder.event(StreamFinish("length")) == b""
    assert encoder.event(StreamUsage(Usage(3, 4))) == b""
    docs = payloads(encoder.end(Usage(prompt_tokens=9, completion_tokens=4, cached_prompt_tokens=2)))
    assert [d["type"] for d in docs] == ["content_block_stop", "message_delta", "message_stop"]
    assert docs[1]["delta"]["stop_reason"] == "max_tokens"
    assert docs[1]["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }


def test_thinking_streams_as_a_thinking_block_with_thinking_and_signature_deltas() -> None:
    data = run(
        [
            ThinkingDelta(0),
            ThinkingDelta(0, thinking="Two cities; "),
            ThinkingDelta(0, thinking="call the tool twice."),
            ThinkingDelta(0, signature="EqQBCgIYAhIM"),
            RedactedThinking(1, "opaque"),
            TextDelta("Checking."),
            ToolCallDelta(0, "toolu_1", "get_weather", '{"city": "Paris"}'),
            StreamFinish("tool_calls"),
        ],
        usage=Usage(prompt_tokens=100, completion_tokens=40, cached_prompt_tokens=60, cache_creation_tokens=30),
    )
    docs = payloads(data)
    assert [(d["type"], d.get("index")) for d in docs[2:]] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert docs[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert docs[3]["delta"] == {"type": "thinking_delta", "thinking": "Two cities; "}
    assert docs[5]["delta"] == {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}
    assert docs[7]["content_block"] == {"type": "redacted_thinking", "data": "opaque"}
    assert docs[-2]["usage"] == {
        "input_tokens": 10,
        "output_tokens": 40,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 60,
    }
    final = accumulate(data)
    assert [b.type for b in final.content] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Two cities; call the tool twice."
    assert final.content[0].signature == "EqQBCgIYAhIM" and final.content[1].data == "opaque"
    assert final.usage.cache_read_input_tokens == 60 and final.usage.cache_creation_input_tokens == 30


def test_chat_and_responses_clients_are_not_shown_thinking() -> None:
    from tollway.api.chat_completions import CHAT_COMPLETIONS
    from tollway.api.responses import RESPONSES

    resp = CanonicalResponse("Sunny.", None, "stop", Usage(10, 30), thinking=[ThinkingPart("secret plan", "sig")])
    req = CanonicalRequest(messages=[Message("user", "hi")], stream=True)
    for front in (CHAT_COMPLETIONS, RESPONSES):
        assert b"secret plan" not in front.encode_response(META, resp, req)
        encoder = front.encode_stream(META, req)
        assert encoder.event(ThinkingDelta(0, "secret plan", "sig")) == b""
        assert encoder.event(RedactedThinking(1, "opaque")) == b""
        assert b"secret plan" not in encoder.event(TextDelta("Sunny.")) + encoder.end(Usage(1, 1))


def test_a_stream_ending_without_output_still_opens_and_closes_the_message() -> None:
    docs = payloads(run([StreamFinish("stop")]))
    assert [d["type"] for d in docs] == ["message_start", "ping", "message_delta", "message_stop"]


def test_an_error_mid_stream_is_one_error_event_and_no_message_stop() -> None:
    encoder = ANTHROPIC_MESSAGES.encode_stream(META, CanonicalRequest(messages=[]))
    lifetime = encoder.error(DeadlineExceeded("The stream exceeded its maximum lifetime."))
    first = encoder.event(TextDelta("Déjà"))
    assert [d["type"] for d in payloads(first)][:2] == ["message_start", "ping"], "error() must not change state"
    docs = payloads(encoder.error(ModelUnavailable()))
    assert docs == [{"type": "error", "error": {"type": "overloaded_error", "message": ModelUnavailable().message}}]
    assert payloads(encoder.error(StreamCut()))[0]["error"]["type"] == "api_error"
    assert payloads(lifetime)[0]["error"]["type"] == "timeout_error"


_events = st.lists(
    st.one_of(
        st.builds(TextDelta, st.text(max_size=12)),
        st.builds(
            ToolCallDelta,
            st.integers(0, 2),
            st.one_of(st.none(), st.just("toolu_x")),
            st.one_of(st.none(), st.just("tool")),
            st.text(max_size=8),
        ),
        st.builds(StreamFinish, st.sampled_from(["stop", "length", "tool_calls", "content_filter"])),
        st.builds(ThinkingDelta, st.integers(0, 2), st.text(max_size=8), st.text(max_size=4)),
        st.builds(RedactedThinking, st.integers(0, 2), st.text(max_size=4)),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(_events, st.booleans())
def test_any_encoded_stream_reparses_to_the_same_events_split_at_every_byte(
    events: list[StreamEvent], fail: bool
) -> None:
    encoder = MessageStream("msg_x", ALIAS, 3)
    data = b"".join(encoder.event(ev) for ev in events)
    data += encoder.error(StreamCut()) if fail else encoder.end(Usage(3, 2))
    whole = frames(data)
    assert all(ev.event is not None for ev in whole)
    for i in range(len(data) + 1):
        parser = SseParser()
        assert parser.feed(data[:i]) + parser.feed(data[i:]) == whole
    if not fail:
        assert [e.event for e in whole][-2:] == ["message_delta", "message_stop"]
        opened = [orjson.loads(e.data)["index"] for e in whole if e.event == "content_block_start"]
        closed = [orjson.loads(e.data)["index"] for e in whole if e.event == "content_block_stop"]
        assert opened == closed == list(range(len(opened)))


def test_encoders_share_no_state() -> None:
    one = ANTHROPIC_MESSAGES.encode_stream(META, CanonicalRequest(messages=[]))
    one.event(TextDelta("a"))
    two = ANTHROPIC_MESSAGES.encode_stream(META, CanonicalRequest(messages=[]))
    assert payloads(two.event(TextDelta("b")))[0]["type"] == "message_start"
