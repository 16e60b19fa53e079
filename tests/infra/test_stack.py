"""The synthesized stack agrees with ``topology(stage)``: every expected value is read from the spec."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match

from infra import emulator
from infra.assets import CONFIG_NAME
from infra.constructs.function import ARCHITECTURE, ENVELOPE_ACTIONS, ITEM_ACTIONS, RUNTIME
from infra.constructs.gateway import ADAPTER_ENVIRONMENT, BUFFERED_HANDLER, DEFAULT_ADAPTER_LAYER_ARN
from infra.stacks.tollway import AUDIT_ENVIRONMENT
from layers.build import TARGET
from tests.infra.synth import (
    STAGE,
    Synth,
    assert_grants,
    bucket_id,
    function,
    function_role,
    key_id,
    lifecycle,
    named_role,
    queue_id,
    table_id,
)
from tests.infra.template_tools import (
    ACCOUNT,
    REGION,
    actions_on,
    as_list,
    refs,
    resolve,
    role_statements,
    statements,
    wildcard_statements,
)
from tollway.cloud.bootstrap import expected_state
from tollway.cloud.resources import Grant


def test_stack_uses_the_stage_from_context(synth: Synth) -> None:
    assert synth.topology.prefix == STAGE
    assert function(synth, f"{STAGE}-gateway")


def test_each_queue_has_its_dead_letter_queue_redrive_and_settings(synth: Synth) -> None:
    assert len(synth.resources("AWS::SQS::Queue")) == 2 * len(synth.topology.queues)
    for spec in synth.topology.queues:
        dlq_id, dlq = synth.one("AWS::SQS::Queue", QueueName=spec.dlq_name)
        _, queue = synth.one("AWS::SQS::Queue", QueueName=spec.name)
        props = queue["Properties"]
        assert props["VisibilityTimeout"] == spec.visibility_timeout_s
        assert props["MessageRetentionPeriod"] == spec.retention_s
        assert props["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
            "maxReceiveCount": spec.max_receive_count,
        }
        assert dlq["Properties"]["MessageRetentionPeriod"] == spec.dlq_retention_s
        for p in (props, dlq["Properties"]):
            assert p["SqsManagedSseEnabled"] is True


def _denies_plain_http(synth: Synth, policy_type: str, target_key: str, logical_id: str) -> bool:
    for policy in synth.resources(policy_type).values():
        props = policy["Properties"]
        if logical_id not in refs(props[target_key]):
            continue
        for s in props["PolicyDocument"]["Statement"]:
            if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}:
                return True
    return False


def test_queues_and_buckets_refuse_plain_http(synth: Synth) -> None:
    for spec in synth.topology.queues:
        for name in (spec.name, spec.dlq_name):
            assert _denies_plain_http(synth, "AWS::SQS::QueuePolicy", "Queues", queue_id(synth, name)), name
    for bucket in synth.topology.buckets:
        assert _denies_plain_http(synth, "AWS::S3::BucketPolicy", "Bucket", bucket_id(synth, bucket)), bucket.key


def test_each_table_has_its_keys_ttl_indexes_and_protection(synth: Synth) -> None:
    assert len(synth.resources("AWS::DynamoDB::Table")) == len(synth.topology.tables)
    for spec in synth.topology.tables:
        _, table = synth.one("AWS::DynamoDB::Table", TableName=spec.name)
        props = table["Properties"]
        expected_keys = [{"AttributeName": spec.partition_key, "KeyType": "HASH"}]
        if spec.sort_key:
            expected_keys.append({"AttributeName": spec.sort_key, "KeyType": "RANGE"})
        assert props["KeySchema"] == expected_keys
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert all(a["AttributeType"] == "S" for a in props["AttributeDefinitions"])
        if spec.ttl_attribute:
            assert props["TimeToLiveSpecification"] == {"AttributeName": spec.ttl_attribute, "Enabled": True}
        else:
            assert "TimeToLiveSpecification" not in props
        pitr = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled", False)
        assert pitr is spec.point_in_time_recovery
        assert props["SSESpecification"]["SSEEnabled"] is True
        assert props.get("SSESpecification", {}).get("KMSMasterKeyId") is None, "AWS-managed key expected"
        indexes = {i["IndexName"]: i for i in props.get("GlobalSecondaryIndexes", [])}
        assert set(indexes) == {i.name for i in spec.indexes}
        for index in spec.indexes:
            schema = [{"AttributeName": index.partition_key, "KeyType": "HASH"}]
            if index.sort_key:
                schema.append({"AttributeName": index.sort_key, "KeyType": "RANGE"})
            assert indexes[index.name]["KeySchema"] == schema
        assert table["DeletionPolicy"] == "Retain"
        assert table["UpdateReplacePolicy"] == "Retain"


def test_each_bucket_is_named_encrypted_private_and_retained(synth: Synth) -> None:
    assert len(synth.resources("AWS::S3::Bucket")) == len(synth.topology.buckets)
    expected = expected_state(synth.topology, account=ACCOUNT, region=REGION)
    for spec in synth.topology.buckets:
        bucket = synth.json["Resources"][bucket_id(synth, spec)]
        props = bucket["Properties"]
        (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        versioning = props.get("VersioningConfiguration", {}).get("Status")
        assert versioning == ("Enabled" if spec.versioned else None)
        assert lifecycle(props) == expected["lifecycle"][spec.key], spec.key
        assert bucket["DeletionPolicy"] == "Retain"
    kinds = {r["Type"] for r in synth.json["Resources"].values()}
    assert "Custom::S3AutoDeleteObjects" not in kinds


def test_secrets_are_referenced_never_created(synth: Synth) -> None:
    assert synth.resources("AWS::SecretsManager::Secret") == {}
    text = json.dumps(synth.json)
    for spec in synth.topology.secrets:
        assert f":secret:{spec.name}-??????" in text, spec.name


def test_streaming_gateway_runs_run_sh_under_the_web_adapter(synth: Synth) -> None:
    gateway = synth.topology.gateway
    _, props = function(synth, gateway.name)
    assert props["Handler"] == gateway.handler == "functions/gateway/run.sh"
    assert props["Runtime"] == "python3.13"
    assert props["Architectures"] == ["x86_64"]
    env = {k: resolve(v) for k, v in props["Environment"]["Variables"].items()}
    for key, value in ADAPTER_ENVIRONMENT.items():
        assert env[key] == value
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert env["TOLLWAY_CONFIG"] == f"/var/task/{CONFIG_NAME}"
    assert synth.topology.environment(ACCOUNT, REGION).items() <= env.items()
    assert AUDIT_ENVIRONMENT.items() <= env.items()
    deps, core, extension, adapter = props["Layers"]
    for layer in (deps, core, extension):
        assert synth.json["Resources"][layer["Ref"]]["Type"] == "AWS::Lambda::LayerVersion"
    assert synth.json["Resources"][extension["Ref"]]["Properties"]["LayerName"] == f"{STAGE}-wal-shipper"
    assert adapter == {
        "Fn::If": [
            "LambdaAdapterLayerArnIsDefault",
            {"Fn::Sub": DEFAULT_ADAPTER_LAYER_ARN},
            {"Ref": "LambdaAdapterLayerArn"},
        ]
    }


def test_adapter_layer_is_a_parameter_defaulting_to_the_public_layer_of_the_region(synth: Synth) -> None:
    parameter = synth.json["Parameters"]["LambdaAdapterLayerArn"]
    assert parameter["Type"] == "String"
    assert parameter["Default"] == "arn:aws:lambda:${AWS::Region}:753240598075:layer:LambdaAdapterLayerX86:25"
    assert synth.json["Conditions"]["LambdaAdapterLayerArnIsDefault"] == {
        "Fn::Equals": [{"Ref": "LambdaAdapterLayerArn"}, parameter["Default"]]
    }


def test_buffered_gateway_runs_mangum_without_the_adapter(synth: Synth) -> None:
    gateway = synth.topology.gateway
    _, props = function(synth, f"{gateway.name}-buffered")
    assert props["Handler"] == BUFFERED_HANDLER == "functions.gateway.handler.handler"
    env = {k: resolve(v) for k, v in props["Environment"]["Variables"].items()}
    assert not set(ADAPTER_ENVIRONMENT) & set(env)
    assert env["TOLLWAY_CONFIG"] == f"/var/task/{CONFIG_NAME}"
    assert synth.topology.environment(ACCOUNT, REGION).items() <= env.items()
    assert AUDIT_ENVIRONMENT.items() <= env.items()
    _, streaming = function(synth, gateway.name)
    assert props["Layers"] == streaming["Layers"][:3], "deps, core and the WAL-shipper extension; no adapter"
    assert props["Code"] == streaming["Code"], "one code asset serves both deployments"


@pytest.mark.parametrize(("suffix", "mode"), [("", "RESPONSE_STREAM"), ("-buffered", "BUFFERED")])
def test_function_urls_stream_or_buffer_and_leave_auth_to_tollway_keys(synth: Synth, suffix: str, mode: str) -> None:
    function_id, _ = function(synth, synth.topology.gateway.name + suffix)
    urls = [u for u in synth.resources("AWS::Lambda::Url").values() if function_id in refs(u["Properties"])]
    assert len(urls) == 1
    assert urls[0]["Properties"]["InvokeMode"] == mode
    assert urls[0]["Properties"]["AuthType"] == "NONE"
    synth.template.has_resource_properties(
        "AWS::Lambda::Permission",
        {
            "Action": "lambda:InvokeFunctionUrl",
            "FunctionUrlAuthType": "NONE",
            "Principal": "*",
            "FunctionName": {"Fn::GetAtt": [function_id, "Arn"]},
        },
    )


def test_memory_timeout_and_concurrency_are_parameters_defaulting_to_the_spec(synth: Synth) -> None:
    gateway = synth.topology.gateway
    params = synth.json["Parameters"]
    assert params["GatewayMemorySize"]["Default"] == gateway.memory_mb
    assert params["GatewayTimeout"]["Default"] == gateway.timeout_s
    assert params["GatewayReservedConcurrency"]["Default"] == 100
    assert params["GatewayBufferedReservedConcurrency"]["Default"] == 0
    for name, reserved in (
        (gateway.name, "GatewayReservedConcurrency"),
        (f"{gateway.name}-buffered", "GatewayBufferedReservedConcurrency"),
    ):
        _, props = function(synth, name)
        assert props["MemorySize"] == {"Ref": "GatewayMemorySize"}
        assert props["Timeout"] == {"Ref": "GatewayTimeout"}
        condition = f"{reserved}IsSet"
        assert props["ReservedConcurrentExecutions"] == {
            "Fn::If": [condition, {"Ref": reserved}, {"Ref": "AWS::NoValue"}]
        }
        unreserved = [{"Fn::Equals": [{"Ref": reserved}, v]} for v in ("0", "-1")]
        assert synth.json["Conditions"][condition] == {"Fn::Not": [{"Fn::Or": unreserved}]}


def _all_functions(synth: Synth) -> list[str]:
    gateway = synth.topology.gateway.name
    return [gateway, f"{gateway}-buffered", *(f.name for f in synth.topology.functions)]


def test_each_function_logs_to_its_own_group_with_the_topology_retention(synth: Synth) -> None:
    names = _all_functions(synth)
    assert len(synth.resources("AWS::Logs::LogGroup")) == len(names)
    for name in names:
        group_id, group = synth.one("AWS::Logs::LogGroup", LogGroupName=f"/aws/lambda/{name}")
        assert group["Properties"]["RetentionInDays"] == synth.topology.log_retention_days
        _, props = function(synth, name)
        assert props["LoggingConfig"] == {"LogGroup": {"Ref": group_id}}
        assert actions_on(role_statements(synth.json, function_role(synth, name)), group_id) == {
            "logs:CreateLogStream",
            "logs:PutLogEvents",
        }
    kinds = {r["Type"] for r in synth.json["Resources"].values()}
    assert "Custom::LogRetention" not in kinds


def test_roles_have_no_managed_policies(synth: Synth) -> None:
    roles = synth.resources("AWS::IAM::Role")
    assert roles
    for logical_id, role in roles.items():
        assert "ManagedPolicyArns" not in role["Properties"], logical_id


def test_no_policy_statement_allows_every_action_on_every_resource(synth: Synth) -> None:
    walked = {logical_id for logical_id, _ in statements(synth.json)}
    assert set(synth.resources("AWS::IAM::Policy")) <= walked, "the walk must see every IAM policy"
    assert wildcard_statements(synth.json) == []


def test_the_wildcard_check_catches_a_star_statement() -> None:
    bad = {
        "Resources": {
            "P": {
                "Type": "AWS::IAM::Policy",
                "Properties": {
                    "PolicyDocument": {
                        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "*"], "Resource": "*"}]
                    }
                },
            },
            "Q": {"Type": "AWS::IAM::Policy", "Properties": {"PolicyDocument": {"Statement": [{"Action": "*"}]}}},
        }
    }
    assert [logical_id for logical_id, _ in wildcard_statements(bad)] == ["P"]


def test_gateway_roles_hold_exactly_the_grants_of_the_spec(synth: Synth) -> None:
    gateway = synth.topology.gateway
    assert gateway.grants
    for name in (gateway.name, f"{gateway.name}-buffered"):
        assert_grants(synth, name, gateway.grants)


def test_the_gateway_may_invoke_bedrock_models_and_inference_profiles_and_nothing_else_of_bedrock(
    synth: Synth,
) -> None:
    stmts = role_statements(synth.json, function_role(synth, synth.topology.gateway.name))
    (bedrock,) = [s for s in stmts if any(a.startswith("bedrock:") for a in as_list(s["Action"]))]
    assert sorted(as_list(bedrock["Action"])) == ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
    arns = [json.dumps(r) for r in as_list(bedrock["Resource"])]
    assert len(arns) == 3
    assert ":bedrock:*::foundation-model/*" in arns[0]
    assert ":inference-profile/*" in arns[1] and "AWS::AccountId" in arns[1]
    assert ":application-inference-profile/*" in arns[2] and "AWS::AccountId" in arns[2]


def test_every_worker_role_holds_exactly_its_grants_and_trigger_queues(synth: Synth) -> None:
    for spec in synth.topology.functions:
        consumes = tuple(Grant("queue", t.queue, "consume") for t in spec.triggers)
        assert_grants(synth, spec.name, tuple(dict.fromkeys(spec.grants + consumes)))


def test_every_queue_trigger_and_schedule_of_the_topology_is_wired(synth: Synth) -> None:
    triggers = [t for f in synth.topology.functions for t in f.triggers]
    schedules = [s for f in synth.topology.functions for s in f.schedules]
    assert len(synth.resources("AWS::Lambda::EventSourceMapping")) == len(triggers)
    assert len(synth.resources("AWS::Events::Rule")) == len(schedules)
    for spec in synth.topology.functions:
        function_id, props = function(synth, spec.name)
        for trigger in spec.triggers:
            queue = synth.topology.queue(trigger.queue)
            synth.one(
                "AWS::Lambda::EventSourceMapping",
                FunctionName={"Ref": function_id},
                EventSourceArn={"Fn::GetAtt": [queue_id(synth, queue.name), "Arn"]},
                FunctionResponseTypes=["ReportBatchItemFailures"],
                BatchSize=trigger.batch_size,
            )
            assert queue.visibility_timeout_s >= props["Timeout"], "SQS triggers need visibility >= timeout"


def test_outputs_name_both_urls_and_every_queue_table_bucket_key_and_role(synth: Synth) -> None:
    outputs = synth.json["Outputs"]
    streaming_id, _ = function(synth, synth.topology.gateway.name)
    buffered_id, _ = function(synth, f"{synth.topology.gateway.name}-buffered")
    url_of = {
        next(iter(refs(u["Properties"]["TargetFunctionArn"]))): k
        for k, u in synth.resources("AWS::Lambda::Url").items()
    }
    assert outputs["GatewayStreamingUrl"]["Value"] == {"Fn::GetAtt": [url_of[streaming_id], "FunctionUrl"]}
    assert outputs["GatewayBufferedUrl"]["Value"] == {"Fn::GetAtt": [url_of[buffered_id], "FunctionUrl"]}
    values = [o["Value"] for o in outputs.values()]
    for spec in synth.topology.queues:
        assert {"Ref": queue_id(synth, spec.name)} in values
        assert {"Ref": queue_id(synth, spec.dlq_name)} in values
    for table in synth.topology.tables:
        assert {"Ref": table_id(synth, table.name)} in values
    for bucket in synth.topology.buckets:
        assert {"Ref": bucket_id(synth, bucket)} in values
    for key in synth.topology.keys:
        assert {"Fn::GetAtt": [key_id(synth, key.alias), "Arn"]} in values
    for role in synth.topology.roles:
        assert {"Fn::GetAtt": [named_role(synth, role.name), "Arn"]} in values


def test_layers_are_python_313_x86_assets_named_by_stage(synth: Synth) -> None:
    layers = synth.resources("AWS::Lambda::LayerVersion")
    assert {v["Properties"]["LayerName"] for v in layers.values()} == {
        f"{STAGE}-deps",
        f"{STAGE}-core",
        f"{STAGE}-wal-shipper",
    }
    synth.template.has_resource_properties(
        "AWS::Lambda::LayerVersion",
        {"CompatibleRuntimes": ["python3.13"], "CompatibleArchitectures": ["x86_64"], "Content": Match.any_value()},
    )


def test_the_runtime_is_the_one_the_layers_and_the_local_placeholder_are_built_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert RUNTIME.name == f"python{TARGET['python-version']}"
    assert TARGET["platform"].endswith(f"_{ARCHITECTURE.name}")
    published: dict[str, Any] = {}

    class FakeLambda:
        def publish_layer_version(self, **kwargs: Any) -> dict[str, str]:
            published.update(kwargs)
            return {"LayerVersionArn": "arn:aws:lambda:us-east-1:000000000000:layer:placeholder:1"}

    monkeypatch.setattr(emulator, "_client", lambda service: FakeLambda())
    emulator.publish_adapter_placeholder(STAGE)
    assert published["CompatibleRuntimes"] == [RUNTIME.name]


def test_each_kms_key_is_symmetric_rotated_aliased_and_retained(synth: Synth) -> None:
    assert synth.topology.keys
    assert len(synth.resources("AWS::KMS::Key")) == len(synth.topology.keys)
    for spec in synth.topology.keys:
        key = synth.json["Resources"][key_id(synth, spec.alias)]
        props = key["Properties"]
        assert props["EnableKeyRotation"] is spec.rotation is True
        assert props["KeySpec"] == "SYMMETRIC_DEFAULT"
        assert props["KeyUsage"] == "ENCRYPT_DECRYPT"
        assert props["Description"] == spec.description
        assert props["PendingWindowInDays"] == 30
        assert key["DeletionPolicy"] == "Retain"
        assert key["UpdateReplacePolicy"] == "Retain"


def test_the_pii_vault_table_is_one_item_per_token_with_ttl_recovery_and_encryption(synth: Synth) -> None:
    spec = synth.topology.table("pii-vault")
    _, table = synth.one("AWS::DynamoDB::Table", TableName=spec.name)
    props = table["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expiresAt", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True
    assert "GlobalSecondaryIndexes" not in props, "nothing may look entries up but by their token"
    assert "StreamSpecification" not in props, "a stream would be a second way to read every write"
    assert table["DeletionPolicy"] == "Retain"


def _vault_statements(stmts: list[dict[str, Any]], *logical_ids: str) -> list[dict[str, Any]]:
    """Statements that reach one of ``logical_ids``, or every resource."""
    return [s for s in stmts if set(logical_ids) & refs(s.get("Resource")) or "*" in as_list(s.get("Resource", []))]


@pytest.mark.parametrize("suffix", ["", "-buffered"])
def test_the_gateway_reads_and_writes_vault_items_one_by_one_and_can_neither_scan_query_nor_export(
    synth: Synth, suffix: str
) -> None:
    vault = table_id(synth, synth.topology.table("pii-vault").name)
    key = key_id(synth, synth.topology.kms_key("pii-vault").alias)
    stmts = role_statements(synth.json, function_role(synth, synth.topology.gateway.name + suffix))
    assert (
        actions_on(stmts, vault)
        == set(ITEM_ACTIONS)
        == {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        }
    )
    assert actions_on(stmts, key) == set(ENVELOPE_ACTIONS) == {"kms:GenerateDataKey", "kms:Decrypt"}
    for statement in _vault_statements(stmts, vault, key):
        actions = set(as_list(statement["Action"]))
        assert not actions & {"dynamodb:Scan", "dynamodb:Query", "dynamodb:BatchGetItem", "dynamodb:DeleteItem"}
        assert not {a for a in actions if a.startswith(("dynamodb:Export", "dynamodb:PartiQL"))}
        assert not {a for a in actions if a.endswith("*")}, statement
        resources = json.dumps(statement.get("Resource"))
        assert "/index/" not in resources and "/stream/" not in resources, statement


def test_no_worker_can_touch_the_vault_or_its_key(synth: Synth, worker_synth: Synth) -> None:
    for built in (synth, worker_synth):
        vault = table_id(built, built.topology.table("pii-vault").name)
        key = key_id(built, built.topology.kms_key("pii-vault").alias)
        for spec in built.topology.functions:
            stmts = role_statements(built.json, function_role(built, spec.name))
            assert actions_on(stmts, vault) == set(), spec.name
            assert actions_on(stmts, key) == set(), spec.name


def test_the_gateway_finds_the_vault_table_and_key_in_its_environment(synth: Synth) -> None:
    prefix = synth.topology.prefix
    for suffix in ("", "-buffered"):
        _, props = function(synth, synth.topology.gateway.name + suffix)
        env = {k: resolve(v) for k, v in props["Environment"]["Variables"].items()}
        assert env["TOLLWAY_TABLE_PII_VAULT"] == f"{prefix}-pii-vault"
        assert env["TOLLWAY_PII_KMS_KEY_ID"] == f"alias/{prefix}-pii-vault"
    outputs = [o["Value"] for o in synth.json["Outputs"].values()]
    assert {"Fn::GetAtt": [key_id(synth, f"alias/{prefix}-pii-vault"), "Arn"]} in outputs
