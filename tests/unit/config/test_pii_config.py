"""``pii:`` validation: every rule the seed sets for profiles, scopes and references."""

from __future__ import annotations

from typing import Any

import pytest

from tollway.config.loader import parse_config
from tollway.config.validate import validate


def doc(profile: dict[str, Any] | None = None, *, pii: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    return {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "a",
                "quotaGroupId": "q",
                "credentials": [{"id": "c", "secretRef": "env:KEY"}],
            }
        },
        "models": [
            {
                "name": "m",
                "piiProfileId": "prof",
                **model,
                "routes": [{"id": "r", "provider": "p", "model": "x", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [{"id": "u", "tenant": "t", "allowedModels": ["m"], "keys": [{"id": "k", "sha256": "a" * 64}]}],
        "pii": {"keySecretRef": "env:PII_KEY", "profiles": [{"id": "prof", **(profile or {})}], **(pii or {})},
    }


def issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in validate(parse_config(data))]


def test_a_request_scoped_profile_is_valid() -> None:
    assert issues(doc()) == []


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (
            doc({"unresolvedTokenPolicy": "reject-buffered"}),
            "pii.profiles[0].unresolvedTokenPolicy",
            "streaming: false",
        ),
        (doc({"scope": "session"}), "pii.profiles[0].scope", "durable vault"),
        (doc({"scope": "session"}, pii={"vault": {"type": "memory"}}), "pii.profiles[0].scope", "durable vault"),
        (doc({"scope": "host"}, pii={"vault": {"type": "dynamodb"}}), "pii.profiles[0].scope", "allowHostScope"),
        (doc({"detectors": ["email", "passport"]}), "pii.profiles[0].detectors", "unknown detector 'passport'"),
        (doc({"detectors": []}), "pii.profiles[0].detectors", "must detect something"),
        (doc({"customPatterns": [{"name": "proj", "pattern": "a("}]}), "pii.profiles[0].customPatterns", ""),
        (doc(pii={"keySecretRef": None}), "pii.keySecretRef", "required"),
        (doc(pii={"keySecretRef": "plain-secret-value"}), "pii.keySecretRef", "literal secret"),
        (
            doc({"dataClassifications": ["internal"]}, dataClassifications=["internal", "restricted"]),
            "models[0].dataClassifications",
            "does not cover 'restricted'",
        ),
    ],
)
def test_what_the_seed_refuses_is_refused_with_its_path(data: dict[str, Any], path: str, fragment: str) -> None:
    found = issues(data)
    assert [p for p, _ in found] == [path], found
    assert fragment in found[0][1]


def test_a_profile_no_alias_uses_is_refused() -> None:
    data = doc()
    data["pii"]["profiles"].append({"id": "spare"})
    assert issues(data) == [("pii.profiles[1].id", "PII profile 'spare' is used by no alias")]


def test_durable_scopes_with_a_dynamodb_vault_are_valid() -> None:
    assert issues(doc({"scope": "session"}, pii={"vault": {"type": "dynamodb"}})) == []
    assert issues(doc({"scope": "host", "allowHostScope": True}, pii={"vault": {"type": "dynamodb"}})) == []
    assert issues(doc({"unresolvedTokenPolicy": "reject-buffered", "streaming": False})) == []


def test_an_alias_naming_a_missing_profile_is_refused() -> None:
    found = issues(doc(piiProfileId="nope"))
    assert ("models[0].piiProfileId", "unknown PII profile 'nope'; it must be an id in pii.profiles") in found
