"""Publication admits a PII alias's routes only when measured to keep placeholders (minPreservationRate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tollway.config.loader import parse_config
from tollway.config.root import Publisher
from tollway.config.validate import validate
from tollway.exceptions import ConfigError
from tollway.secrets import SecretResolver

ROUTE = {"provider": "p", "providerFormat": "openai-chat-completions"}


def doc(conformance_file: str = "conformance.json", threshold: float | None = 0.95) -> dict[str, Any]:
    profile: dict[str, Any] = {"id": "strict"}
    if threshold is not None:
        profile["minPreservationRate"] = threshold
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
            {"name": "plain", "routes": [{"id": "r-plain", "model": "x", **ROUTE}]},
            {
                "name": "pii-chat",
                "piiProfileId": "strict",
                "routes": [
                    {"id": "r-good", "model": "good", **ROUTE},
                    {"id": "r-weak", "model": "weak", **ROUTE, "priority": 1},
                ],
            },
        ],
        "principals": [
            {"id": "u", "tenant": "t", "allowedModels": ["pii-chat"], "keys": [{"id": "k", "sha256": "a" * 64}]}
        ],
        "pii": {"keySecretRef": "env:PII_KEY", "conformanceFile": conformance_file, "profiles": [profile]},
    }


def result(alias: str, preserved: float) -> dict[str, Any]:
    rest = (1 - preserved) / 2
    return {
        "alias": alias,
        "cases": 26,
        "values": 55,
        "preserved": preserved,
        "altered": rest,
        "omitted": rest,
        "hallucinated": 0.0,
    }


def write(folder: Path, deployments: dict[str, Any]) -> None:
    data = {"corpus": "preservation-v1", "measuredAt": "2026-12-01T00:00:00Z", "deployments": deployments}
    (folder / "conformance.json").write_bytes(orjson.dumps(data))


@pytest.fixture
def publisher(tmp_path: Path) -> Publisher:
    return Publisher(resolver=SecretResolver(env={"KEY": "sk", "PII_KEY": "k" * 40}), config_dir=tmp_path)


def publish(pub: Publisher, data: dict[str, Any]) -> Any:
    cfg = parse_config(data)
    assert validate(cfg) == []
    return pub.publish(cfg)


def refusals(pub: Publisher, data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        publish(pub, data)
    return [(i.path, i.message) for i in caught.value.issues]


def test_routes_measured_above_the_threshold_are_published(publisher: Publisher, tmp_path: Path) -> None:
    write(tmp_path, {"r-good": result("measure-good", 1.0), "r-weak": result("measure-weak", 0.95)})
    root = publish(publisher, doc())
    assert root.aliases["pii-chat"].pii is not None


def test_a_route_below_the_threshold_is_refused_naming_it_and_why(publisher: Publisher, tmp_path: Path) -> None:
    write(tmp_path, {"r-good": result("measure-good", 0.98), "r-weak": result("measure-weak", 0.7249)})
    assert refusals(publisher, doc()) == [
        (
            "models[1].routes[1]",
            "deployment 'r-weak' preserves 72.4% of placeholders (preservation-v1, measured as 'r-weak' through "
            "'measure-weak'), below PII profile 'strict''s minPreservationRate 95%",
        )
    ]


def test_an_alias_measured_as_a_whole_covers_its_routes(publisher: Publisher, tmp_path: Path) -> None:
    write(tmp_path, {"pii-chat": result("pii-chat", 0.9)})
    found = refusals(publisher, doc())
    assert [p for p, _ in found] == ["models[1].routes[0]", "models[1].routes[1]"]
    assert "preserves 90% of placeholders (preservation-v1, measured as 'pii-chat')" in found[0][1]
    write(tmp_path, {"pii-chat": result("pii-chat", 0.96)})
    assert publish(publisher, doc()).aliases["pii-chat"].pii is not None


def test_a_route_never_measured_is_refused(publisher: Publisher, tmp_path: Path) -> None:
    write(tmp_path, {"r-good": result("measure-good", 1.0)})
    assert refusals(publisher, doc()) == [
        (
            "models[1].routes[1]",
            "deployment 'r-weak' has no conformance result in pii.conformanceFile (preservation-v1; looked up as "
            "'r-weak' and 'pii-chat'), required by PII profile 'strict''s minPreservationRate 95%",
        )
    ]


def test_an_unreadable_or_malformed_results_file_is_refused(publisher: Publisher, tmp_path: Path) -> None:
    found = refusals(publisher, doc("missing.json"))
    assert found == [("pii.conformanceFile", "cannot read 'missing.json' (No such file or directory)")]
    (tmp_path / "conformance.json").write_text("{}")
    [(path, message)] = refusals(publisher, doc())
    assert path == "pii.conformanceFile"
    assert "not a conformance result" in message


def test_without_a_threshold_nothing_is_read(publisher: Publisher) -> None:
    assert publish(publisher, doc("missing.json", threshold=None)).aliases["pii-chat"].pii is not None


def test_validation_asks_for_the_results_file_a_threshold_needs() -> None:
    issues = validate(parse_config(doc("")))
    assert [(i.path, i.message) for i in issues] == [
        (
            "pii.conformanceFile",
            "required: PII profile 'strict' sets minPreservationRate, measured by `tollway pii conformance`",
        )
    ]
    bad = doc()
    bad["pii"]["profiles"][0]["minPreservationRate"] = 1.5
    with pytest.raises(ConfigError, match="minPreservationRate"):
        parse_config(bad)


def test_config_validate_and_the_start_up_check_report_an_ineligible_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tollway import cli

    monkeypatch.setenv("KEY", "sk")
    monkeypatch.setenv("PII_KEY", "k" * 40)
    write(tmp_path, {"pii-chat": result("pii-chat", 0.5)})
    path = tmp_path / "llm-router.yml"
    path.write_bytes(orjson.dumps(doc()))
    assert cli.main(["config", "validate", str(path)]) == 1
    assert "models[1].routes[0]: deployment 'r-good' preserves 50% of placeholders" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.preflight(str(path))
    assert exc.value.code == 2
    assert "tollway: error:" in capsys.readouterr().err
    write(tmp_path, {"pii-chat": result("pii-chat", 0.99)})
    assert cli.main(["config", "validate", str(path)]) == 0
