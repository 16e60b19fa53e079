"""The stage's alarms, dashboard and metric environment, read from the session's synthesized stacks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.constructs import observability as obs
from tests.infra.synth import Synth, function, queue_id
from tests.infra.synthetic import WORKER_KEY
from tollway.telemetry.emf import DEFAULT_ROLLUPS, ENVIRONMENT_VARIABLE, NAMESPACE
from tollway.telemetry.metrics import GatewayMetrics


def _function_names(synth: Synth) -> list[str]:
    gateway = synth.topology.gateway.name
    return [gateway, f"{gateway}-buffered", *(f.name for f in synth.topology.functions)]


def _alarms(synth: Synth) -> dict[str, dict[str, Any]]:
    """Alarm name -> properties."""
    return {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()}


def _metric_stats(props: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A metric-math alarm's metrics by id: each ``MetricStat`` flattened with its dimensions as a dict."""
    found = {}
    for m in props["Metrics"]:
        if "MetricStat" in m:
            stat = m["MetricStat"]
            metric = stat["Metric"]
            found[m["Id"]] = {
                "namespace": metric["Namespace"],
                "name": metric["MetricName"],
                "dimensions": {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])},
                "period": stat["Period"],
                "stat": stat["Stat"],
            }
    return found


def _dashboard_text(synth: Synth) -> str:
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    return "".join(p if isinstance(p, str) else json.dumps(p) for p in parts)


def test_the_stage_has_exactly_the_expected_alarms(synth: Synth) -> None:
    topo = synth.topology
    expected = {
        f"{topo.prefix}-gateway-5xx-rate",
        f"{topo.prefix}-audit-events-lag",
        f"{topo.function(obs.PRICING_FUNCTION).name}-failed",
        *(f"{q.dlq_name}-not-empty" for q in topo.queues),
        *(f"{name}-throttled" for name in _function_names(synth)),
    }
    assert set(_alarms(synth)) == expected
    assert len(synth.resources("AWS::CloudWatch::Alarm")) == 3 + len(topo.queues) + 2 + len(topo.functions) == 12
    for props in _alarms(synth).values():
        assert props["TreatMissingData"] == "notBreaching"
        assert props["EvaluationPeriods"] == 1


def test_the_gateway_alarm_is_the_5xx_share_of_the_emf_requests(synth: Synth) -> None:
    props = _alarms(synth)[f"{synth.topology.prefix}-gateway-5xx-rate"]
    (expression,) = [m for m in props["Metrics"] if "Expression" in m]
    assert expression["Expression"] == f"IF(requests >= {obs.MIN_REQUESTS}, 100 * FILL(errors, 0) / requests, 0)"
    assert expression["ReturnData"] is True
    env = {"environment": synth.topology.prefix}
    assert _metric_stats(props) == {
        "requests": {
            "namespace": NAMESPACE,
            "name": "tollway_requests_total",
            "dimensions": env,
            "period": 300,
            "stat": "Sum",
        },
        "errors": {
            "namespace": NAMESPACE,
            "name": "tollway_requests_total",
            "dimensions": {**env, "status_class": "5xx"},
            "period": 300,
            "stat": "Sum",
        },
    }
    assert props["ComparisonOperator"] == "GreaterThanThreshold"
    assert props["Threshold"] == {"Ref": "GatewayErrorRateThresholdPercent"}
    assert synth.json["Parameters"]["GatewayErrorRateThresholdPercent"]["Default"] == obs.DEFAULT_ERROR_RATE_PERCENT


def test_the_gateway_emf_roll_ups_are_the_dimension_sets_the_stack_reads() -> None:
    """The alarm's two metrics exist only because every EMF document names these roll-ups."""
    assert ("environment",) in DEFAULT_ROLLUPS["*"]
    assert ("environment", "status_class") in DEFAULT_ROLLUPS["tollway_requests"]
    assert ("environment", "kind") in DEFAULT_ROLLUPS["tollway_cost_usd"]
    assert ("environment", "type") in DEFAULT_ROLLUPS["tollway_tokens"]


def test_every_dead_letter_queue_alarms_on_one_visible_message(synth: Synth) -> None:
    alarms = _alarms(synth)
    for spec in synth.topology.queues:
        props = alarms[f"{spec.dlq_name}-not-empty"]
        assert props["Namespace"] == "AWS/SQS"
        assert props["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert props["Dimensions"] == [
            {"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id(synth, spec.dlq_name), "QueueName"]}}
        ]
        assert (props["Statistic"], props["Threshold"], props["ComparisonOperator"]) == (
            "Maximum",
            0,
            "GreaterThanThreshold",
        )


def test_every_function_alarms_on_a_throttle(synth: Synth) -> None:
    alarms = _alarms(synth)
    for name in _function_names(synth):
        function_id, _ = function(synth, name)
        props = alarms[f"{name}-throttled"]
        assert (props["Namespace"], props["MetricName"], props["Statistic"]) == ("AWS/Lambda", "Throttles", "Sum")
        assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function_id}}]
        assert (props["Threshold"], props["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_the_pricing_refresh_alarms_on_a_failed_run_over_its_schedule_period(synth: Synth) -> None:
    spec = synth.topology.function(obs.PRICING_FUNCTION)
    assert spec.schedules[0].expression == "rate(15 minutes)"
    props = _alarms(synth)[f"{spec.name}-failed"]
    (expression,) = [m for m in props["Metrics"] if "Expression" in m]
    assert expression["Expression"] == "FILL(failed, 0) + FILL(errors, 0)"
    function_id, _ = function(synth, spec.name)
    stats = _metric_stats(props)
    assert stats["failed"] == {
        "namespace": NAMESPACE,
        "name": obs.PRICING_REFRESH_FAILED,
        "dimensions": {"environment": synth.topology.prefix},
        "period": 900,
        "stat": "Sum",
    }
    assert (stats["errors"]["namespace"], stats["errors"]["name"], stats["errors"]["period"]) == (
        "AWS/Lambda",
        "Errors",
        900,
    )
    (errors_stat,) = [m for m in props["Metrics"] if m["Id"] == "errors"]
    assert errors_stat["MetricStat"]["Metric"]["Dimensions"] == [
        {"Name": "FunctionName", "Value": {"Ref": function_id}}
    ]
    assert (props["Threshold"], props["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


def test_the_audit_lag_alarm_reads_the_parameterised_threshold(synth: Synth) -> None:
    spec = synth.topology.queue(obs.AUDIT_QUEUE)
    props = _alarms(synth)[f"{spec.name}-lag"]
    assert (props["Namespace"], props["MetricName"], props["Statistic"]) == (
        "AWS/SQS",
        "ApproximateAgeOfOldestMessage",
        "Maximum",
    )
    assert props["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id(synth, spec.name), "QueueName"]}}
    ]
    assert (props["Threshold"], props["ComparisonOperator"]) == (
        {"Ref": "AuditLagThresholdSeconds"},
        "GreaterThanThreshold",
    )
    parameter = synth.json["Parameters"]["AuditLagThresholdSeconds"]
    assert (parameter["Type"], parameter["Default"]) == ("Number", 300)


def test_alarm_actions_go_to_the_topic_parameter_only_when_it_is_set(synth: Synth) -> None:
    parameter = synth.json["Parameters"]["AlarmTopicArn"]
    assert (parameter["Type"], parameter["Default"]) == ("String", "")
    assert synth.json["Conditions"]["AlarmTopicArnIsSet"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]
    }
    actions = {"Fn::If": ["AlarmTopicArnIsSet", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for props in _alarms(synth).values():
        assert props["AlarmActions"] == actions
        assert props["OKActions"] == actions
    assert synth.resources("AWS::SNS::Topic") == {}


def test_one_dashboard_named_after_the_stage_shows_the_key_metrics(synth: Synth) -> None:
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == synth.topology.prefix
    text = _dashboard_text(synth)
    for name in (
        obs.GATEWAY_REQUESTS,
        obs.GATEWAY_OVERHEAD,
        obs.GATEWAY_DURATION,
        obs.GATEWAY_TTFT,
        obs.GATEWAY_TOKENS,
        obs.ESTIMATED_COST,
        obs.RECONCILED_COST,
        obs.AUDIT_EVENTS_WRITTEN,
        obs.USAGE_RECORDS_RECONCILED,
        obs.PRICING_REFRESH_FAILED,
        "ApproximateNumberOfMessagesVisible",
        "ApproximateAgeOfOldestMessage",
        "Errors",
        "Throttles",
        "Duration",
    ):
        assert f'"{name}"' in text, name
    for percentile in ("p50", "p90", "p99"):
        assert f'"stat":"{percentile}"' in text
    assert f'"environment","{synth.topology.prefix}"' in text
    for name in _alarms(synth):
        assert f":alarm:{name}" in text, "the alarm status widget lists every alarm"
    for alarm_id in synth.resources("AWS::CloudWatch::Alarm"):
        assert alarm_id not in text, "alarms by name: an emulator that skips alarms still creates the dashboard"


def test_the_dashboard_reads_metric_names_the_gateway_records() -> None:
    metrics = GatewayMetrics(environment="test")
    families = {f.name: f.type for f in metrics.registry.collect()}
    for counter in (obs.GATEWAY_REQUESTS, obs.GATEWAY_TOKENS, obs.ESTIMATED_COST):
        assert families[counter.removesuffix("_total")] == "counter", counter
    for histogram in (obs.GATEWAY_OVERHEAD, obs.GATEWAY_DURATION, obs.GATEWAY_TTFT):
        assert families[histogram] == "histogram", histogram


def test_every_function_gets_the_stage_as_its_metrics_environment(synth: Synth) -> None:
    for name in _function_names(synth):
        _, props = function(synth, name)
        assert props["Environment"]["Variables"][ENVIRONMENT_VARIABLE] == synth.topology.prefix, name


def test_a_topology_without_the_pricing_refresh_skips_its_alarm(worker_synth: Synth) -> None:
    alarms = _alarms(worker_synth)
    worker = worker_synth.topology.function(WORKER_KEY)
    assert f"{worker.name}-throttled" in alarms
    assert not any(name.endswith("-failed") for name in alarms)
    assert len(alarms) == 1 + 1 + len(worker_synth.topology.queues) + 2 + 1


@pytest.mark.parametrize(
    ("expression", "minutes"),
    [
        ("rate(15 minutes)", 15),
        ("rate(1 hour)", 60),
        ("rate(1 day)", 1440),
        ("rate(7 days)", 1440),
        ("cron(0 3 * * ? *)", 1440),
        ("cron(0/10 * * * ? *)", 10),
    ],
)
def test_an_alarm_period_follows_the_schedule(expression: str, minutes: int) -> None:
    assert obs.schedule_period(expression).to_minutes() == minutes
