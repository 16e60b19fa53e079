"""Every shipped profile and payload loads; a malformed profile fails with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profiles import PAYLOAD_DIR, PROFILE_DIR, Profile, load_payload, load_profile
from bench.servers import gateway_config

NAMES = sorted(p.stem for p in PROFILE_DIR.glob("*.yml"))


def test_the_issue_profiles_are_all_shipped() -> None:
    assert {"smoke", "fixed-500", "sse-200", "sweep", "overload", "payloads"} <= set(NAMES)


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
