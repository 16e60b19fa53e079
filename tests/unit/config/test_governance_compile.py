"""The governance and pricing sub-snapshots: precedence compiled at publication, pricing-only updates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tollway.config.loader import parse_config
from tollway.config.root import Publisher
from tollway.config.validate import validate
from tollway.governance.leases import Window
from tollway.pricing import ModelPrice, PricingSnapshot, Rates
from tollway.secrets import SecretResolver


def doc(**governance: Any) -> dict[str, Any]:
    provider = {
        "type": "openai-compatible",
        "pricingProvider": "openai",
        "baseUrl": "http://127.0.0.1:9/v1",
        "providerAccountId": "acct",
        "quotaGroupId": "group",
        "credentials": [{"id": "c", "secretRef": "env:KEY"}],
    }
    route = {"provider": "p", "providerFormat": "openai-chat-completions"}
    return {
        "providers": {"p": provider},
        "models": [
            {"name": "cheap", "routes": [{"id": "r-cheap", "model": "small", **route}]},
            {
                "name": "mixed",
                "routes": [
                    {"id": "r-small", "model": "small", **route},
                    {"id": "r-big", "model": "big", **route, "priority": 1},
                ],
            },
        ],
        "principals": [
            {
                "id": "alice",
                "tenant": "acme",
                "team": "eng",
                "allowedModels": ["cheap", "mixed"],
                "keys": [{"id": "alice-key", "sha256": "a" * 64}],
            }
        ],
        "governance": governance,
    }


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[Publisher]:
    catalog = {
        "openai": {
            "models": {"small": {"cost": {"input": 1, "output": 2}}, "big": {"cost": {"input": 5, "output": 15}}}
        }
    }
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    yield Publisher(resolver=SecretResolver(env={"KEY": "sk"}), config_dir=tmp_path)


def publish(pub: Publisher, data: dict[str, Any]) -> Any:
    cfg = parse_config(data)
    assert validate(cfg) == []
    return pub.publish(cfg)


def test_every_enclosing_scope_applies_and_the_smallest_cap_wins(publisher: Publisher) -> None:
    root = publish(
        publisher,
        doc(
            policies=[
                {"scope": "tenant:acme", "limits": {"rpm": 100, "maxOutputTokens": 500}},
                {"scope": "team:acme/eng", "budgets": [{"window": "day", "usd": 2.5}]},
                {"scope": "key:alice-key", "alias": "mixed", "limits": {"tpm": 1000, "maxOutputTokens": 200}},
            ]
        ),
    )
    cheap = root.governance.policy("alice-key", "cheap")
    mixed = root.governance.policy("alice-key", "mixed")
    assert [lim.scope for lim in cheap.requests] == ["tenant:acme"]
    assert [(lim.scope, lim.window, lim.limit) for lim in cheap.cost] == [("team:acme/eng", Window.DAY, 2_500_000)]
    assert cheap.tokens == ()
    assert cheap.max_output_tokens == 500
    assert [lim.scope for lim in mixed.tokens] == ["key:alice-key/alias:mixed"]
    assert mixed.max_output_tokens == 200


def test_without_policies_nothing_is_compiled(publisher: Publisher) -> None:
    root = publish(publisher, doc())
    assert not root.governance.enabled
    assert root.governance.policy("alice-key", "cheap").empty


def test_an_alias_reserves_at_its_most_expensive_route(publisher: Publisher) -> None:
    root = publish(publisher, doc(pricing={"catalogFile": "catalog.json"}))
    mixed = root.pricing.aliases["mixed"]
    assert (mixed.input_per_mtok, mixed.output_per_mtok) == (5_000_000, 15_000_000)
    assert mixed.reservation(1000, 100) == 1000 * 5 + 100 * 15
    assert root.pricing.aliases["cheap"].reservation(1000, 100) == 1000 * 1 + 100 * 2


def test_a_pricing_only_update_shares_every_other_sub_snapshot(publisher: Publisher) -> None:
    root = publish(
        publisher,
        doc(pricing={"catalogFile": "catalog.json"}, policies=[{"scope": "tenant:acme", "limits": {"rpm": 5}}]),
    )
    prices = [
        ModelPrice("openai", "small", Rates(2_000_000, 4_000_000, 2_000_000, 2_000_000, 4_000_000)),
        ModelPrice("openai", "big", Rates(10_000_000, 30_000_000, 10_000_000, 10_000_000, 30_000_000)),
    ]
    snapshot = PricingSnapshot.build(prices, effective_from=datetime.now(UTC))
    new = publisher.with_pricing(root, snapshot)
    assert new.generation > root.generation
    assert new.pricing is not root.pricing
    assert new.pricing.version == snapshot.version != root.pricing.version
    for name in ("aliases", "keys", "deployments", "governance", "limits"):
        assert getattr(new, name) is getattr(root, name), name
    assert new.pricing.aliases["cheap"].reservation(1000, 0) == 2000
    # A config reload keeps the published snapshot rather than going back to the files.
    again = publish(publisher, doc(pricing={"catalogFile": "catalog.json"}))
    assert again.pricing.version == snapshot.version


@pytest.mark.parametrize(
    ("governance", "path", "message"),
    [
        ({"policies": [{"scope": "tenant:nobody"}]}, "governance.policies[0].scope", "matches no configured"),
        ({"policies": [{"scope": "org:acme"}]}, "governance.policies[0].scope", "must be one of"),
        (
            {"policies": [{"scope": "tenant:acme", "alias": "nope"}]},
            "governance.policies[0].alias",
            "unknown model alias",
        ),
        ({"policies": [{"scope": "tenant:acme"}, {"scope": "tenant:acme"}]}, "governance.policies[1]", "second policy"),
        ({"quotaGroups": {"other": {"rpm": 5}}}, "governance.quotaGroups.other", "no provider declares"),
        (
            {
                "policies": [
                    {"scope": "tenant:acme", "budgets": [{"window": "day", "usd": 1}, {"window": "day", "usd": 2}]}
                ]
            },
            "governance.policies[0].budgets",
            "one budget per window",
        ),
        ({"pricing": {"bucket": "b", "catalogFile": "c.json"}}, "governance.pricing", "not both"),
    ],
)
def test_bad_governance_is_rejected_with_its_path(governance: dict[str, Any], path: str, message: str) -> None:
    issues = validate(parse_config(doc(**governance)))
    assert any(i.path == path and message in i.message for i in issues), issues


def test_one_quota_group_cannot_span_two_accounts() -> None:
    data = doc()
    data["providers"]["q"] = {**data["providers"]["p"], "providerAccountId": "other-acct"}
    issues = validate(parse_config(data))
    assert any(i.path == "providers.q.quotaGroupId" and "one account's capacity" in i.message for i in issues)
