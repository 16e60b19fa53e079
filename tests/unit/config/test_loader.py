"""Loading ``llm-router.yml``: interpolation, YAML errors, shape errors as YAML paths, and the full pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tollway.config import RouterConfig, interpolate, load_config, load_yaml, parse_config
from tollway.exceptions import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "llm-router.yml"
SECRET = "sk-test-D0-N0T-PR1NT-ME"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llm-router.yml"
    path.write_text(text, encoding="utf-8")
    return path


def issue_pairs(exc: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in exc.value.issues]


# interpolation


def test_interpolate_replaces_set_variables() -> None:
    assert interpolate("a: ${A}\nb: ${B:x}", {"A": "1", "B": "2"}) == "a: 1\nb: 2"


def test_interpolate_uses_default_when_unset() -> None:
    assert interpolate("url: ${URL:https://api.openai.com/v1}", {}) == "url: https://api.openai.com/v1"


def test_interpolate_allows_an_empty_default() -> None:
    assert interpolate("ref: ${REF:}", {}) == "ref: "


def test_interpolate_prefers_env_over_default_even_when_empty() -> None:
    assert interpolate("x: ${X:fallback}", {"X": ""}) == "x: "


def test_interpolate_accepts_dotted_and_hyphenated_names_from_the_seed() -> None:
    env = {"llm-router.requestTimeoutMs": "5000"}
    assert interpolate("t: ${llm-router.requestTimeoutMs:120000}", env) == "t: 5000"


def test_double_dollar_escapes_a_literal_placeholder() -> None:
    assert interpolate("x: $${NOT_A_VAR} and $${Y:z}", {}) == "x: ${NOT_A_VAR} and ${Y:z}"


def test_substituted_values_are_not_expanded_again() -> None:
    assert interpolate("x: ${A}", {"A": "${B}"}) == "x: ${B}"


def test_unset_variable_without_default_names_the_variable_and_its_position() -> None:
    with pytest.raises(ConfigError) as exc:
        interpolate("a: 1\nkey:  ${TOLLWAY_MISSING}\n", {"OTHER": SECRET})
    assert issue_pairs(exc) == [
        ("line 2, column 7", "environment variable 'TOLLWAY_MISSING' is not set and has no default")
    ]


def test_every_unset_variable_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as exc:
        interpolate("a: ${A}\nb: ${B}\nc: ${C:ok}\n", {})
    assert [p for p, _ in issue_pairs(exc)] == ["line 1, column 4", "line 2, column 4"]


def test_malformed_placeholder_is_rejected() -> None:
    with pytest.raises(ConfigError) as exc:
        interpolate("a: ${9LIVES}\nb: ${UNTERMINATED\n", {})
    pairs = issue_pairs(exc)
    assert [p for p, _ in pairs] == ["line 1, column 4", "line 2, column 4"]
    assert all("malformed placeholder" in m for _, m in pairs)


def test_value_with_line_break_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as exc:
        interpolate("a: ${A}\n", {"A": f"{SECRET}\nextra: injected"})
    assert issue_pairs(exc) == [("line 1, column 4", "environment variable 'A' contains a line break")]
    assert SECRET not in str(exc.value)


def test_whole_line_comments_are_not_interpolated() -> None:
    text = "# baseUrl: ${OLD_URL}\n  # ${\na: ${A} # trailing ${A}\n"
    assert interpolate(text, {"A": "1"}) == "# baseUrl: ${OLD_URL}\n  # ${\na: 1 # trailing 1\n"


def test_lone_dollar_signs_are_left_alone() -> None:
    assert interpolate("a: $HOME $$ $5", {}) == "a: $HOME $$ $5"


# load_yaml


def test_load_yaml_interpolates_before_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, "requestTimeoutMs: ${T:1000}\nenabled: ${E:false}\n")
    assert load_yaml(path, {"T": "2500"}) == {"requestTimeoutMs": 2500, "enabled": False}


def test_load_yaml_reads_the_process_environment_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOLLWAY_TEST_PREFIX", "/llm")
    path = write(tmp_path, "pathPrefix: ${TOLLWAY_TEST_PREFIX}\n")
    assert load_yaml(path) == {"pathPrefix": "/llm"}


def test_yaml_syntax_error_reports_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nmodels:\n  - name: x\n   bad: [\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path, {})
    [(where, _message)] = issue_pairs(exc)
    assert where.startswith("line 4, column ")


def test_duplicate_mapping_key_is_rejected_with_its_position(tmp_path: Path) -> None:
    path = write(tmp_path, "providers:\n  p:\n    type: openai\n  p:\n    type: anthropic\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path, {})
    assert issue_pairs(exc) == [("line 4, column 3", "duplicate key 'p'")]


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    path = write(tmp_path, "base: &b {x: 1, y: 2}\nchild:\n  <<: *b\n  y: 3\n")
    assert load_yaml(path, {})["child"] == {"x": 1, "y": 3}


@pytest.mark.parametrize("text", ["", "# nothing\n", "- a\n- b\n", "just a string\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_yaml(write(tmp_path, text), {})
    assert issue_pairs(exc) == [("", "the top level must be a mapping of configuration keys")]


def test_unsafe_yaml_tags_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path, {})
    [(where, _message)] = issue_pairs(exc)
    assert where == "line 1, column 4"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_yaml(tmp_path / "absent.yml", {})
    [(_where, message)] = issue_pairs(exc)
    assert "cannot read config file" in message


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "llm-router.yml"
    path.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path, {})
    assert "not valid UTF-8" in str(exc.value)


# parse_config


def minimal_route(**overrides: Any) -> dict[str, Any]:
    route = {"id": "r", "provider": "p", "model": "m", "providerFormat": "openai-chat-completions"}
    route.update(overrides)
    return route


def parse_errors(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return issue_pairs(exc)


def test_unknown_key_is_reported_at_its_path() -> None:
    data = {"models": [{"name": "a", "routes": [minimal_route(), minimal_route(id="s", foo=1)]}]}
    assert parse_errors(data) == [("models[0].routes[1].foo", "unknown key 'foo'")]


def test_missing_field_is_reported_as_field_required() -> None:
    route = minimal_route()
    del route["providerFormat"]
    assert parse_errors({"models": [{"name": "a", "routes": [route]}]}) == [
        ("models[0].routes[0].providerFormat", "field required")
    ]


def test_non_integer_is_reported_as_must_be_an_integer() -> None:
    data = {"models": [{"name": "a", "routes": [minimal_route(), minimal_route(priority="high")]}]}
    assert parse_errors(data) == [("models[0].routes[1].priority", "must be an integer")]


@pytest.mark.parametrize("value", [True, 1.5, 2.0, "3000"])
def test_integers_are_strict(value: Any) -> None:
    assert parse_errors({"requestTimeoutMs": value}) == [("requestTimeoutMs", "must be an integer")]


def test_provider_paths_use_the_provider_name() -> None:
    data = {"providers": {"openai-primary": {"type": "openai"}}}
    assert parse_errors(data) == [("providers.openai-primary.baseUrl", "field required")]


def test_literal_choices_are_listed() -> None:
    data = {"providers": {"p": {"type": "cohere", "baseUrl": "https://x"}}}
    expected = "must be 'openai', 'anthropic', 'openai-compatible', 'gemini', 'vertex' or 'bedrock'"
    assert parse_errors(data) == [("providers.p.type", expected)]


def test_the_ship_priority_is_idle_or_low() -> None:
    assert parse_errors({"audit": {"sink": {"shipPriority": "high"}}}) == [
        ("audit.sink.shipPriority", "must be 'idle' or 'low'")
    ]
    assert parse_config({"audit": {"sink": {"shipPriority": "low"}}}).audit.sink.shipPriority == "low"
    assert parse_config({}).audit.sink.shipPriority == "idle"


def test_every_shape_issue_is_reported_at_once() -> None:
    data = {"bogus": 1, "enabled": "yes", "admission": {"overloadStatus": 500}, "principals": "nobody"}
    assert parse_errors(data) == [
        ("enabled", "must be true or false"),
        ("admission.overloadStatus", "must be 429 or 503"),
        ("principals", "must be a list"),
        ("bogus", "unknown key 'bogus'"),
    ]


def test_empty_secret_ref_from_empty_default_is_reported() -> None:
    data = {
        "providers": {"p": {"type": "openai", "baseUrl": "https://x", "credentials": [{"id": "c", "secretRef": ""}]}}
    }
    assert parse_errors(data) == [("providers.p.credentials[0].secretRef", "must not be empty")]


def test_shape_errors_never_echo_the_offending_value() -> None:
    data: dict[str, Any] = {
        "providers": {"p": {"type": "openai", "baseUrl": "https://x", "credentials": [{"id": "c", "secretRef": 7}]}}
    }
    data["principals"] = [{"id": "p", "tenant": "t", "keys": [{"id": "k", "sha256": [SECRET]}]}]
    data["maxRequestBodyBytes"] = SECRET
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert SECRET not in str(exc.value)
    assert len(exc.value.issues) == 3


# load_config


def test_fixture_config_loads_with_defaults_from_placeholders() -> None:
    cfg = load_config(FIXTURE, {"TOLLWAY_OPENAI_BASE_URL": "http://127.0.0.1:9001/v1"})
    assert isinstance(cfg, RouterConfig)
    assert cfg.providers["openai-primary"].baseUrl == "http://127.0.0.1:9001/v1"
    assert cfg.providers["openai-primary"].credentials[0].secretRef == "env:TOLLWAY_OPENAI_API_KEY"
    assert cfg.enabled is True
    assert [r.id for r in cfg.models[0].routes] == ["openai-fast-primary", "anthropic-fast-fallback"]


def test_load_config_reports_every_semantic_issue(tmp_path: Path) -> None:
    text = FIXTURE.read_text(encoding="utf-8")
    path = write(tmp_path, text)
    env = {
        "llm-router.pathPrefix": "/v1/",
        "llm-router.admission.maxQueuedRequests": "5",
        "TOLLWAY_ANTHROPIC_BASE_URL": "http://169.254.169.254",
    }
    with pytest.raises(ConfigError) as exc:
        load_config(path, env)
    assert [p for p, _ in issue_pairs(exc)] == [
        "pathPrefix",
        "admission.maxQueueWaitMs",
        "providers.anthropic-primary.baseUrl",
    ]


def test_load_config_stops_at_shape_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "pathPrefix: v1\nmodels:\n  - name: a\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, {})
    assert issue_pairs(exc) == [("models[0].routes", "field required")]


def test_secret_from_env_never_reaches_any_message(tmp_path: Path) -> None:
    path = write(tmp_path, FIXTURE.read_text(encoding="utf-8"))
    env = {
        "TOLLWAY_OPENAI_SECRET_REF": SECRET,
        "TOLLWAY_OPENAI_BASE_URL": f"https://svc:{SECRET}@api.openai.com/v1",
        "TOLLWAY_OPENAI_API_KEY": SECRET,
    }
    with pytest.raises(ConfigError) as exc:
        load_config(path, env)
    assert [p for p, _ in issue_pairs(exc)] == [
        "providers.openai-primary.baseUrl",
        "providers.openai-primary.credentials[0].secretRef",
    ]
    assert SECRET not in str(exc.value)
    assert all(SECRET not in m for _, m in issue_pairs(exc))
