"""``python -m infra.deploy --target local`` against a real moto server: what the stack creates.

The layers are tiny placeholder zips (``tests/infra/synthetic.py``), not the real ~12 MB
``python -m layers.build`` output: the emulator stores them and runs no code, so the deploy
path is the same. moto skips the Function URLs (it has no CloudFormation support for
``AWS::Lambda::Url``), keeps no outputs for a stack created from a change set, and ignores a
table's TTL and a bucket's versioning in a template (the script converges those afterwards);
all of it is expected here and documented in docs/deploy.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.deploy import is_moto
from tests.infra.synthetic import WORKER_KEY, placeholder_layers, topology_with_worker
from tollway.cloud.local import LOCAL_CREDENTIALS, LocalCloud, local_cloud
from tollway.cloud.resources import Topology, topology

pytestmark = [
    pytest.mark.slow,
    pytest.mark.not_on_localstack(
        "CloudFormation would create the stack's tables in LocalStack's own DynamoDB, which needs DynamoDB Local"
        " (Java, downloaded at run time) and cannot run offline"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
SENTINELS = {"AWS_SECRET_ACCESS_KEY": "sentinel-secret-7f3a", "AWS_SESSION_TOKEN": "sentinel-token-9b1c"}
"""Stand-ins for a developer's real credentials: the script must neither use nor print them."""


@dataclass(frozen=True)
class Deployed:
    cloud: LocalCloud
    topology: Topology
    output: str

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.cloud.endpoint,
            region_name=self.cloud.region,
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )


def run_deploy(cloud: LocalCloud, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **SENTINELS,
        "AWS_ENDPOINT_URL": cloud.endpoint,
        "CDK_DISABLE_VERSION_CHECK": "1",
    }
    command = [sys.executable, "-m", "infra.deploy", "--target", "local", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110, check=False)


def stage_name(tag: str) -> str:
    return f"{tag}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    with local_cloud(port=0, log_path=tmp_path_factory.mktemp("cloud") / "moto.log") as running:
        yield running


@pytest.fixture(scope="module")
def deployed(cloud: LocalCloud, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    work = tmp_path_factory.mktemp("deploy")
    stage = stage_name("dl")
    layers = placeholder_layers(work / "layers")
    result = run_deploy(
        cloud, "--stage", stage, "--no-build", "--layers-dir", str(layers), "--outdir", str(work / "cdk.out")
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return Deployed(cloud, topology(stage), output)


def test_deploy_never_shows_the_callers_credentials(deployed: Deployed) -> None:
    for value in SENTINELS.values():
        assert value not in deployed.output


def test_deploy_creates_each_queue_with_its_redrive(deployed: Deployed) -> None:
    sqs = deployed.client("sqs")
    for spec in deployed.topology.queues:
        dlq_url = sqs.get_queue_url(QueueName=spec.dlq_name)["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        url = sqs.get_queue_url(QueueName=spec.name)["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert json.loads(attrs["RedrivePolicy"]) == {
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": spec.max_receive_count,
        }
        assert int(attrs["VisibilityTimeout"]) == spec.visibility_timeout_s
        assert int(attrs["MessageRetentionPeriod"]) == spec.retention_s


def test_deploy_creates_each_table_with_its_keys_and_ttl(deployed: Deployed) -> None:
    dynamodb = deployed.client("dynamodb")
    stored = deployed.client("cloudformation").get_template(StackName=deployed.topology.prefix)["TemplateBody"]
    template = stored if isinstance(stored, dict) else json.loads(stored)
    ttl_in_template = {
        r["Properties"]["TableName"]: r["Properties"].get("TimeToLiveSpecification", {}).get("AttributeName")
        for r in template["Resources"].values()
        if r["Type"] == "AWS::DynamoDB::Table"
    }
    assert ttl_in_template == {t.name: t.ttl_attribute for t in deployed.topology.tables}
    for spec in deployed.topology.tables:
        table = dynamodb.describe_table(TableName=spec.name)["Table"]
        keys = {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]}
        assert keys == {spec.partition_key: "HASH", **({spec.sort_key: "RANGE"} if spec.sort_key else {})}
        assert {i["IndexName"] for i in table.get("GlobalSecondaryIndexes", [])} == {i.name for i in spec.indexes}
        ttl = dynamodb.describe_time_to_live(TableName=spec.name)["TimeToLiveDescription"]
        if spec.ttl_attribute:
            assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": spec.ttl_attribute}


def test_deploy_creates_each_bucket_named_for_the_account_and_region(deployed: Deployed) -> None:
    account = deployed.client("sts").get_caller_identity()["Account"]
    s3 = deployed.client("s3")
    for spec in deployed.topology.buckets:
        name = spec.name(account, deployed.cloud.region)
        s3.head_bucket(Bucket=name)
        status = s3.get_bucket_versioning(Bucket=name).get("Status")
        assert status == ("Enabled" if spec.versioned else None), name


def test_deploy_creates_each_kms_key_rotated_and_usable_for_data_keys(deployed: Deployed) -> None:
    kms = deployed.client("kms")
    for spec in deployed.topology.keys:
        meta = kms.describe_key(KeyId=spec.alias)["KeyMetadata"]
        assert (meta["Description"], meta["KeyUsage"], meta["Enabled"]) == (spec.description, "ENCRYPT_DECRYPT", True)
        assert kms.get_key_rotation_status(KeyId=meta["KeyId"])["KeyRotationEnabled"] is spec.rotation
        data = kms.generate_data_key(KeyId=spec.alias, KeySpec="AES_256")
        assert kms.decrypt(CiphertextBlob=data["CiphertextBlob"], KeyId=meta["Arn"])["Plaintext"] == data["Plaintext"]
    assert "key    alias/" in deployed.output and "-pii-vault" in deployed.output


def test_deploy_creates_both_gateway_deployments_and_every_worker(deployed: Deployed) -> None:
    aws_lambda = deployed.client("lambda")
    gateway = deployed.topology.gateway
    streaming = aws_lambda.get_function(FunctionName=gateway.name)["Configuration"]
    buffered = aws_lambda.get_function(FunctionName=f"{gateway.name}-buffered")["Configuration"]
    assert streaming["Handler"] == gateway.handler
    assert buffered["Handler"] == "functions.gateway.handler.handler"
    assert streaming["Runtime"] == buffered["Runtime"] == "python3.13"
    assert streaming["MemorySize"] == gateway.memory_mb
    assert streaming["Environment"]["Variables"]["AWS_LWA_INVOKE_MODE"] == "response_stream"
    for spec in deployed.topology.functions:
        worker = aws_lambda.get_function(FunctionName=spec.name)["Configuration"]
        assert worker["Handler"] == spec.handler
        assert worker["Timeout"] == spec.timeout_s
    groups = deployed.client("logs").describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{deployed.topology.prefix}-")
    retention = {g["logGroupName"]: g.get("retentionInDays") for g in groups["logGroups"]}
    names = [gateway.name, f"{gateway.name}-buffered", *(f.name for f in deployed.topology.functions)]
    assert retention == {f"/aws/lambda/{n}": deployed.topology.log_retention_days for n in names}


def assert_mappings(deployed: Deployed, topo: Topology) -> None:
    aws_lambda, sqs = deployed.client("lambda"), deployed.client("sqs")
    for spec in topo.functions:
        mappings = aws_lambda.list_event_source_mappings(FunctionName=spec.name)["EventSourceMappings"]
        assert len(mappings) == len(spec.triggers), spec.name
        by_source = {m["EventSourceArn"]: m for m in mappings}
        for trigger in spec.triggers:
            url = sqs.get_queue_url(QueueName=topo.queue(trigger.queue).name)["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            mapping = by_source[arn]
            assert mapping["BatchSize"] == trigger.batch_size
            assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def assert_schedules(deployed: Deployed, topo: Topology) -> None:
    events, aws_lambda = deployed.client("events"), deployed.client("lambda")
    for spec in topo.functions:
        arn = aws_lambda.get_function(FunctionName=spec.name)["Configuration"]["FunctionArn"]
        for schedule in spec.schedules:
            (rule,) = events.list_rules(NamePrefix=f"{spec.name}-{schedule.name}")["Rules"]
            assert rule["ScheduleExpression"] == schedule.expression
            targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
            assert [t["Arn"] for t in targets] == [arn]


def test_deploy_wires_the_topology_workers(deployed: Deployed) -> None:
    assert_mappings(deployed, deployed.topology)
    assert_schedules(deployed, deployed.topology)


def test_deploy_lists_what_moto_created_since_it_reports_no_outputs(deployed: Deployed) -> None:
    if not is_moto(deployed.cloud.endpoint):
        pytest.skip("not moto: the resource listing stands in for moto's missing outputs only")
    assert "reported no stack outputs" in deployed.output
    for name in (deployed.topology.gateway.name, *(f.name for f in deployed.topology.functions)):
        assert re.search(rf"^ +AWS::Lambda::Function +{re.escape(name)}$", deployed.output, re.MULTILINE), name


def test_a_second_deploy_of_a_stage_to_moto_stops_at_once(deployed: Deployed) -> None:
    if not is_moto(deployed.cloud.endpoint):
        pytest.skip("not moto: the update refusal applies to moto only")
    result = run_deploy(deployed.cloud, "--stage", deployed.topology.prefix, "--no-build")
    assert result.returncode == 1
    assert f"stack {deployed.topology.prefix} already exists on this moto server" in result.stderr


def test_a_synthesized_worker_deploys_its_queue_mapping_and_schedule(deployed: Deployed, tmp_path: Path) -> None:
    """A cloud assembly synthesized beforehand (``--assembly``), from a topology with a scheduled worker."""
    from infra.app import AppContext, build_stack, new_app

    stage = stage_name("dw")
    topo = topology_with_worker(stage)
    assert topo.function(WORKER_KEY).schedules and topo.function(WORKER_KEY).triggers
    assembly = tmp_path / "assembly"
    app = new_app({"layersDir": str(placeholder_layers(tmp_path / "layers")), "stage": stage}, outdir=assembly)
    build_stack(app, AppContext.from_app(app), tmp_path / "staging", topo)
    app.synth()
    result = run_deploy(deployed.cloud, "--stage", stage, "--assembly", str(assembly))
    assert result.returncode == 0, result.stdout + result.stderr
    worker = Deployed(deployed.cloud, topo, result.stdout)
    assert_mappings(worker, topo)
    assert_schedules(worker, topo)
