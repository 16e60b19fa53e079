"""The worker path, proven with a synthetic topology: ``topology()`` lists no worker yet."""

from __future__ import annotations

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager

from infra.constructs.function import Resources
from tests.infra.synth import Synth, assert_grants, function, queue_id
from tests.infra.synthetic import WORKER_KEY
from tests.infra.template_tools import ACCOUNT, REGION, refs, resolve, wildcard_statements
from tollway.cloud.resources import Grant


def test_worker_function_is_built_from_its_spec(worker_synth: Synth) -> None:
    spec = worker_synth.topology.function(WORKER_KEY)
    _, props = function(worker_synth, spec.name)
    assert props["Handler"] == spec.handler
    assert props["MemorySize"] == spec.memory_mb
    assert props["Timeout"] == spec.timeout_s
    assert props["Runtime"] == "python3.13"
    env = {k: resolve(v) for k, v in props["Environment"]["Variables"].items()}
    assert worker_synth.topology.environment(ACCOUNT, REGION).items() <= env.items()
    assert dict(spec.environment).items() <= env.items()
    assert "AWS_LAMBDA_EXEC_WRAPPER" not in env
    assert len(props["Layers"]) == 2
    group_id, group = worker_synth.one("AWS::Logs::LogGroup", LogGroupName=f"/aws/lambda/{spec.name}")
    assert group["Properties"]["RetentionInDays"] == worker_synth.topology.log_retention_days
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": group_id}}


def test_each_queue_trigger_is_a_mapping_that_reports_batch_item_failures(worker_synth: Synth) -> None:
    spec = worker_synth.topology.function(WORKER_KEY)
    function_id, _ = function(worker_synth, spec.name)
    mappings = list(worker_synth.resources("AWS::Lambda::EventSourceMapping").values())
    assert len(mappings) == len(spec.triggers) == 1
    for trigger, mapping in zip(spec.triggers, mappings, strict=True):
        props = mapping["Properties"]
        assert props["FunctionName"] == {"Ref": function_id}
        queue = worker_synth.topology.queue(trigger.queue)
        assert props["EventSourceArn"] == {"Fn::GetAtt": [queue_id(worker_synth, queue.name), "Arn"]}
        assert props["BatchSize"] == trigger.batch_size
        assert props["MaximumBatchingWindowInSeconds"] == trigger.max_batching_window_s
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["ScalingConfig"] == {"MaximumConcurrency": trigger.max_concurrency}


def test_each_schedule_is_a_rule_that_invokes_the_worker(worker_synth: Synth) -> None:
    spec = worker_synth.topology.function(WORKER_KEY)
    function_id, _ = function(worker_synth, spec.name)
    for schedule in spec.schedules:
        rule_id, rule = worker_synth.one("AWS::Events::Rule", Name=f"{spec.name}-{schedule.name}")
        assert rule["Properties"]["ScheduleExpression"] == schedule.expression
        assert rule["Properties"]["State"] == "ENABLED"
        (target,) = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
        worker_synth.template.has_resource_properties(
            "AWS::Lambda::Permission",
            {
                "Action": "lambda:InvokeFunction",
                "Principal": "events.amazonaws.com",
                "SourceArn": {"Fn::GetAtt": [rule_id, "Arn"]},
            },
        )


def test_worker_role_holds_its_grants_and_consumes_only_its_trigger_queue(worker_synth: Synth) -> None:
    spec = worker_synth.topology.function(WORKER_KEY)
    consumes = tuple(Grant("queue", t.queue, "consume") for t in spec.triggers)
    assert_grants(worker_synth, spec.name, spec.grants + consumes)


def test_worker_stack_has_no_wildcard_statement(worker_synth: Synth) -> None:
    assert wildcard_statements(worker_synth.json) == []


def test_the_worker_changes_nothing_of_the_gateway(worker_synth: Synth) -> None:
    gateway = worker_synth.topology.gateway
    _, props = function(worker_synth, gateway.name)
    assert props["Handler"] == gateway.handler
    assert not refs(props) & set(worker_synth.resources("AWS::Lambda::EventSourceMapping"))


def _grant_fixture() -> tuple[Resources, iam.Role]:
    stack = Stack(App(), "GrantErrors")
    secret = secretsmanager.Secret.from_secret_name_v2(stack, "Secret", "tollway/providers/openai")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    return Resources(queues={}, tables={}, buckets={}, secrets={"openai": secret}), role


def test_a_grant_with_no_meaning_fails_synth() -> None:
    resources, role = _grant_fixture()
    with pytest.raises(ValueError, match="unsupported grant: 'write' on secret 'openai'"):
        resources.grant(role, Grant("secret", "openai", "write"))


def test_a_grant_naming_an_unknown_resource_fails_synth() -> None:
    resources, role = _grant_fixture()
    with pytest.raises(ValueError, match="grant names unknown table 'nope'"):
        resources.grant(role, Grant("table", "nope", "read"))
