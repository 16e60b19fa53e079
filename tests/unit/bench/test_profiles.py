"""Every shipped profile and payload loads; a malformed profile fails with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.profiles import PAYLOAD_DIR, PROFILE_DIR, Profile, load_payload, load_profile
from bench.servers import (
    ALIASES,
    BEDROCK_ENV,
    PII_KEY_ENV,
    PROVIDER_KEY_ENV,
    PROVIDER_MODELS,
    gateway_config,
    pii_vault_config,
)
from tollway.config.loader import load_config
from tollway.config.schema import RouterConfig
from tollway.pii.detectors import BUILTIN_KINDS, build_detector

NAMES = sorted(p.stem for p in PROFILE_DIR.glob("*.yml"))


def test_the_issue_profiles_are_all_shipped() -> None:
    assert {"smoke", "fixed-500", "sse-200", "sweep", "overload", "payloads"} <= set(NAMES)
    assert {"messages-200-sse", "responses-200-sse", "embeddings-500"} <= set(NAMES)
    assert {"gemini-500", "gemini-200-sse", "bedrock-500", "bedrock-200-sse"} <= set(NAMES)


@pytest.mark.parametrize(
    ("name", "endpoint", "stream"),
    [
        ("messages-200-sse", "messages", True),
        ("responses-200-sse", "responses", True),
        ("embeddings-500", "embeddings", False),
    ],
)
def test_the_endpoint_profiles_keep_their_chat_twins_load(name: str, endpoint: str, stream: bool) -> None:
    profile, _, _ = load_profile(name)
    twin, _, _ = load_profile("sse-200" if stream else "fixed-500")
    (step,) = profile.steps
    assert (step.endpoint, step.stream, step.rate) == (endpoint, stream, twin.steps[0].rate)
    assert profile.targets == ["direct", "gateway"]
    assert (profile.mock, profile.gateway, profile.load, profile.repeat) == (
        twin.mock,
        twin.gateway,
        twin.load,
        twin.repeat,
    )


@pytest.mark.parametrize(
    ("name", "provider_format", "stream"),
    [
        ("gemini-500", "gemini", False),
        ("gemini-200-sse", "gemini", True),
        ("bedrock-500", "bedrock-converse", False),
        ("bedrock-200-sse", "bedrock-converse", True),
    ],
)
def test_the_provider_format_profiles_are_their_chat_twins_routed_in_that_format(
    name: str, provider_format: str, stream: bool
) -> None:
    profile, _, _ = load_profile(name)
    twin, _, _ = load_profile("sse-200" if stream else "fixed-500")
    (step,) = profile.steps
    (twin_step,) = twin.steps
    assert profile.gateway.provider_format == provider_format
    assert profile.gateway.model_copy(update={"provider_format": "openai-chat-completions"}) == twin.gateway
    assert (profile.targets, profile.mock, profile.load, profile.repeat) == (
        twin.targets,
        twin.mock,
        twin.load,
        twin.repeat,
    )
    assert step.model_copy(update={"name": twin_step.name}) == twin_step


@pytest.mark.parametrize("name", NAMES)
def test_a_shipped_profile_validates(name: str) -> None:
    profile, path, sha = load_profile(name)
    assert profile.name == name
    assert path == PROFILE_DIR / f"{name}.yml"
    assert len(sha) == 64


def test_the_payload_corpus_has_small_10kib_and_tool_heavy_bodies() -> None:
    sizes = {p.stem: len(p.read_bytes()) for p in PAYLOAD_DIR.glob("*.json")}
    assert set(sizes) >= {"small", "10kib", "tools"}
    body, _ = load_payload("tools")
    assert len(body["tools"]) >= 10
    assert "model" not in body and "stream" not in body
    tenk, _ = load_payload("10kib")
    assert 9 * 1024 <= sum(len(m["content"]) for m in tenk["messages"]) <= 11 * 1024


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        ({"name": "x", "rate": 1, "rates": [1]}, "exactly one of"),
        ({"name": "x"}, "exactly one of"),
        ({"name": "x", "rate": 1, "payload": "nope"}, "no payload"),
        ({"name": "x", "rate": 1, "typo": 1}, "Extra inputs"),
        ({"name": "x", "rates": [1], "follows_previous": True}, "cannot follow"),
        ({"name": "x", "rate": 1, "endpoint": "completions"}, "endpoint"),
        ({"name": "x", "rate": 1, "endpoint": "embeddings", "payload": "embed-batch", "stream": True}, "not stream"),
        ({"name": "x", "rate": 1, "endpoint": "embeddings"}, "payload small: the embeddings endpoint has no place"),
        ({"name": "x", "rate": 1, "endpoint": "messages", "payload": "tools"}, "payload tools: the messages"),
        ({"name": "x", "rate": 1, "endpoint": "gemini"}, "endpoint"),
        ({"name": "x", "rate": 1, "endpoint": "bedrock"}, "endpoint"),
    ],
)
def test_a_malformed_step_is_rejected(step: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Profile.model_validate({"name": "bad", "steps": [step]})


def test_only_a_fixed_rate_step_can_be_followed() -> None:
    with pytest.raises(ValueError, match="no previous step"):
        Profile.model_validate({"name": "bad", "steps": [{"name": "a", "rate": 1, "follows_previous": True}]})
    sweep_then = [{"name": "a", "rates": [1]}, {"name": "b", "rate": 1, "follows_previous": True}]
    with pytest.raises(ValueError, match="single fixed-rate step"):
        Profile.model_validate({"name": "bad", "steps": sweep_then})


def test_a_profile_path_outside_the_profile_directory_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.yml"
    path.write_text("name: mine\nsteps:\n  - name: one\n    rate: 5\n")
    profile, _, _ = load_profile(str(path))
    assert profile.steps[0].rate == 5


def test_gateway_overrides_merge_into_the_generated_config() -> None:
    config = gateway_config("http://127.0.0.1:9", "latency_ms=60", "ab" * 32, {"admission": {"overloadStatus": 429}})
    assert config["providers"]["mock-openai"]["baseUrl"] == "http://127.0.0.1:9/_fault/latency_ms=60/v1"
    assert config["admission"] == {"overloadStatus": 429}
    assert config["principals"][0]["keys"][0]["sha256"] == "ab" * 32


def test_peers_are_measured_on_chat_only() -> None:
    step = {"name": "x", "rate": 1, "endpoint": "messages"}
    with pytest.raises(ValueError, match="chat endpoint only"):
        Profile.model_validate({"name": "bad", "targets": ["direct", "gateway", "portkey"], "steps": [step]})


def test_a_provider_format_is_refused_with_peers_and_with_a_payload_it_cannot_carry() -> None:
    gateway = {"provider_format": "gemini"}
    step = {"name": "x", "rate": 1}
    with pytest.raises(ValueError, match="Chat Completions only"):
        Profile.model_validate(
            {"name": "bad", "targets": ["direct", "gateway", "litellm"], "gateway": gateway, "steps": [step]}
        )
    with pytest.raises(ValueError, match="payload tools: the gemini endpoint has no place"):
        Profile.model_validate({"name": "bad", "gateway": gateway, "steps": [{**step, "payload": "tools"}]})
    with pytest.raises(ValueError, match="provider_format"):
        Profile.model_validate({"name": "bad", "gateway": {"provider_format": "cohere"}, "steps": [step]})


@pytest.mark.parametrize(
    ("provider_format", "provider_type", "kind"),
    [("gemini", "gemini", "gemini"), ("bedrock-converse", "bedrock", "bedrock")],
)
def test_the_chat_alias_routes_to_the_mocks_provider_api_in_the_profiles_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider_format: str, provider_type: str, kind: str
) -> None:
    config = gateway_config(
        "http://127.0.0.1:9", "chunks=10", "ab" * 32, {}, {"chat", "messages"}, provider_format=provider_format
    )
    chat = config["models"][0]
    assert chat["name"] == ALIASES["chat"]
    (route,) = chat["routes"]
    assert (route["providerFormat"], route["model"]) == (provider_format, PROVIDER_MODELS[kind])
    provider = config["providers"][route["provider"]]
    assert (provider["type"], provider["baseUrl"]) == (provider_type, "http://127.0.0.1:9/_fault/chunks=10")
    assert ("credentials" in provider) is (provider_type == "gemini"), "Bedrock signs with AWS credentials instead"
    (messages,) = [m for m in config["models"] if m["name"] == ALIASES["messages"]]
    assert messages["routes"][0]["providerFormat"] == "anthropic-messages", "other aliases keep their format"
    for name, value in BEDROCK_ENV.items():
        monkeypatch.setenv(name, value)
    loaded = _loaded(tmp_path, config)
    assert {m.name: [r.providerFormat for r in m.routes] for m in loaded.models} == {
        ALIASES["chat"]: [provider_format],
        ALIASES["messages"]: ["anthropic-messages"],
    }


def test_a_chat_profile_config_has_only_the_chat_alias() -> None:
    config = gateway_config("http://127.0.0.1:9", "", "ab" * 32, {})
    assert list(config["providers"]) == ["mock-openai"]
    assert [m["name"] for m in config["models"]] == ["bench-v1"]
    assert config["principals"][0]["allowedModels"] == ["bench-v1"]


def test_the_messages_alias_routes_to_the_mocks_anthropic_endpoint_in_its_format(tmp_path: Path) -> None:
    config = gateway_config("http://127.0.0.1:9", "chunks=10", "ab" * 32, {}, {"chat", "messages", "responses"})
    provider = config["providers"]["mock-anthropic"]
    assert (provider["type"], provider["baseUrl"]) == ("anthropic", "http://127.0.0.1:9/_fault/chunks=10")
    (alias,) = [m for m in config["models"] if m["name"] == ALIASES["messages"]]
    (route,) = alias["routes"]
    assert (route["provider"], route["providerFormat"]) == ("mock-anthropic", "anthropic-messages")
    assert route["model"] == PROVIDER_MODELS["messages"]
    assert set(config["principals"][0]["allowedModels"]) == {ALIASES["chat"], ALIASES["messages"]}
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, {PROVIDER_KEY_ENV: "k"})
    assert {m.name for m in loaded.models} == {ALIASES["chat"], ALIASES["messages"]}


def test_the_embeddings_alias_serves_embeddings_only(tmp_path: Path) -> None:
    config = gateway_config("http://127.0.0.1:9", "", "ab" * 32, {}, {"embeddings"})
    (alias,) = [m for m in config["models"] if m["name"] == ALIASES["embeddings"]]
    assert (alias["operations"], alias["clientFormats"]) == (["embeddings"], ["openai-embeddings"])
    (route,) = alias["routes"]
    assert (route["provider"], route["providerFormat"]) == ("mock-openai", "openai-chat-completions")
    assert ALIASES["embeddings"] in config["principals"][0]["allowedModels"]
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, {PROVIDER_KEY_ENV: "k"})
    assert {m.name: m.operations for m in loaded.models} == {
        ALIASES["chat"]: ["chat"],
        ALIASES["embeddings"]: ["embeddings"],
    }


def _loaded(tmp_path: Path, config: dict[str, object]) -> RouterConfig:
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(config))
    return load_config(path, {PROVIDER_KEY_ENV: "k", PII_KEY_ENV: "p" * 43})


@pytest.mark.parametrize(("name", "scope"), [("pii-request", "request"), ("pii-session", "session")])
def test_the_pii_profiles_config_loads_with_a_pii_alias_beside_the_plain_one(
    tmp_path: Path, name: str, scope: str
) -> None:
    profile, _, _ = load_profile(name)
    overrides = dict(profile.gateway.config)
    if profile.gateway.pii_vault:  # what bench/run.py adds once the local cloud is up
        overrides["pii"] = {**overrides["pii"], "vault": pii_vault_config()}
    config = gateway_config(
        "http://127.0.0.1:9", profile.mock.faults, "ab" * 32, overrides, {"chat"}, profile.gateway.extra_models
    )
    loaded = _loaded(tmp_path, config)
    assert {m.name: m.piiProfileId for m in loaded.models} == {ALIASES["chat"]: None, "bench-pii-v1": "bench-pii"}
    assert [p.scope for p in loaded.pii.profiles] == [scope]
    assert config["pii"]["keySecretRef"] == f"env:{PII_KEY_ENV}"
    steps = {s.name: s for s in profile.steps}
    for mode in ("buffered", "sse"):
        plain, pii = steps[f"{mode}-plain"], steps[f"{mode}-pii"]
        assert (plain.model, pii.model) == (None, "bench-pii-v1")
        assert plain.payload == pii.payload == "pii-2k"
        assert (plain.rate, plain.stream) == (pii.rate, pii.stream) == (pii.rate, mode == "sse")
    if scope == "session":
        assert steps["sse-pii"].headers == steps["buffered-pii"].headers == {"X-Tollway-Session-Id": "bench-session-1"}


def test_the_pii_payload_holds_five_values_in_2_kb_of_prose() -> None:
    body, _ = load_payload("pii-2k")
    (user,) = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert 1900 <= len(user) <= 2200
    found = build_detector(BUILTIN_KINDS).find(user)
    assert sorted(span.kind for span in found) == ["card", "email", "email", "iban", "phone"]


def test_an_extra_model_copies_the_chat_alias_with_route_ids_of_its_own(tmp_path: Path) -> None:
    extra = {"name": "bench-two-v1", "capabilities": ["streaming"]}
    config = gateway_config("http://127.0.0.1:9", "", "ab" * 32, {}, {"chat"}, [extra])
    plain, two = config["models"]
    assert (two["name"], two["capabilities"]) == ("bench-two-v1", ["streaming"])
    assert two["routes"][0]["id"] == "bench-primary-bench-two-v1"
    assert {**two["routes"][0], "id": "bench-primary"} == plain["routes"][0]
    assert config["principals"][0]["allowedModels"] == ["bench-v1", "bench-two-v1"]
    assert {m.name for m in _loaded(tmp_path, config).models} == {"bench-v1", "bench-two-v1"}


def test_a_step_calls_the_endpoints_alias_with_no_extra_headers_unless_it_says() -> None:
    step = Profile.model_validate({"name": "p", "steps": [{"name": "x", "rate": 1}]}).steps[0]
    assert (step.model, step.headers) == (None, {})
    for name in NAMES:
        profile, _, _ = load_profile(name)
        if not name.startswith(("pii-", "content-")):
            assert not profile.gateway.extra_models and not profile.gateway.pii_vault
            assert all(s.model is None and not s.headers for s in profile.steps)
        if not name.startswith(("gemini-", "bedrock-")):
            assert profile.gateway.provider_format == "openai-chat-completions"
