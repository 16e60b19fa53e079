"""The opt-in conformance function: absent by default, and with ``conformanceSchedule`` a scheduled
worker that carries the gateway's config, reads the provider secrets and may only put objects
under ``conformance/`` of the config bucket."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from infra.app import AppContext, new_app
from infra.constructs import observability as obs
from tests.infra.synth import Synth, assert_grants, bucket_id, function, function_role, synthesize
from tests.infra.template_tools import as_list, role_statements
from tollway.cloud.resources import CONFORMANCE_PREFIX, topology

STAGE = "assert-conformance"
SCHEDULE = "rate(1 day)"


@pytest.fixture(scope="module")
def conformance_synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    yield synthesize(tmp_path_factory.mktemp("conformance"), STAGE, topology(STAGE, conformance_schedule=SCHEDULE))


def test_a_stage_has_no_conformance_function_unless_a_schedule_is_configured(synth: Synth) -> None:
    assert all(f.key != "conformance" for f in synth.topology.functions)
    assert not [p for p in synth.resources("AWS::Lambda::Function").values() if "conformance" in str(p["Properties"])]


def test_the_conformance_schedule_context_key_opts_the_stage_in() -> None:
    app = new_app({"conformanceSchedule": SCHEDULE})
    context = AppContext.from_app(app)
    assert context.conformance_schedule == SCHEDULE
    assert AppContext.from_app(new_app()).conformance_schedule is None


def test_the_function_runs_its_handler_on_the_schedule_with_the_bundled_config(conformance_synth: Synth) -> None:
    spec = conformance_synth.topology.function("conformance")
    function_id, props = function(conformance_synth, spec.name)
    assert props["Handler"] == spec.handler == "functions.conformance.handler.handler"
    assert props["Timeout"] == spec.timeout_s
    env = props["Environment"]["Variables"]
    assert env["TOLLWAY_CONFIG"] == "/var/task/llm-router.yml"
    assert "TOLLWAY_BUCKET_CONFIG" in env
    _, rule = conformance_synth.one("AWS::Events::Rule", Name=f"{spec.name}-conformance")
    assert rule["Properties"]["ScheduleExpression"] == SCHEDULE
    assert rule["Properties"].get("State", "ENABLED") == "ENABLED"
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}


def test_the_function_may_put_results_under_the_conformance_prefix_of_the_config_bucket_only(
    conformance_synth: Synth,
) -> None:
    spec = conformance_synth.topology.function("conformance")
    assert_grants(conformance_synth, spec.name, spec.grants)
    config = bucket_id(conformance_synth, conformance_synth.topology.bucket("config"))
    stmts = role_statements(conformance_synth.json, function_role(conformance_synth, spec.name))
    on_config: list[dict[str, Any]] = [s for s in stmts if config in str(s.get("Resource"))]
    assert on_config
    for statement in on_config:
        assert not {a for a in as_list(statement["Action"]) if a.startswith("s3:GetObject") or "Delete" in a}
        objects = {"Fn::Join": ["", [{"Fn::GetAtt": [config, "Arn"]}, f"/{CONFORMANCE_PREFIX}*"]]}
        assert as_list(statement["Resource"]) == [objects], statement["Resource"]


def test_a_failed_conformance_run_alarms(conformance_synth: Synth) -> None:
    name = f"{conformance_synth.topology.function(obs.CONFORMANCE_FUNCTION).name}-failed"
    _, alarm = conformance_synth.one("AWS::CloudWatch::Alarm", AlarmName=name)
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Properties"]["Metrics"] if "MetricStat" in m}
    assert obs.CONFORMANCE_FAILED in names
