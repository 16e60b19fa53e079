"""The CDK stack and the local-cloud bootstrap build the same resources from the one spec.

The synthesized template is rendered into the shape ``tollway.cloud.bootstrap.describe`` reads
back from a live endpoint; the bootstrap then runs on a real local cloud and the two are compared
field by field: queue names, timeouts, retention and redrive; table names, keys, attribute types,
indexes, TTL and point-in-time recovery; bucket names, encryption, public access block,
versioning and expiry; KMS key aliases, descriptions, usage, spec and rotation. Secrets are left
out on purpose: the stack only references them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.infra.synth import Synth, synthesize
from tests.infra.template_tools import ACCOUNT, REGION, resolve
from tollway.cloud.bootstrap import bootstrap, describe
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

SQS_DEFAULT_VISIBILITY_S = 30
SQS_DEFAULT_RETENTION_S = 4 * 86_400


def _queue(res: dict[str, Any], logical_id: str) -> dict[str, Any]:
    props = res[logical_id]["Properties"]
    redrive = props.get("RedrivePolicy")
    out = {
        "name": props["QueueName"],
        "visibility_timeout_s": props.get("VisibilityTimeout", SQS_DEFAULT_VISIBILITY_S),
        "retention_s": props.get("MessageRetentionPeriod", SQS_DEFAULT_RETENTION_S),
        "max_receive_count": None,
        "dlq_name": None,
        "dlq_retention_s": None,
    }
    if redrive:
        dlq = res[redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]]["Properties"]
        out.update(
            max_receive_count=redrive["maxReceiveCount"],
            dlq_name=dlq["QueueName"],
            dlq_retention_s=dlq.get("MessageRetentionPeriod", SQS_DEFAULT_RETENTION_S),
        )
    return out


def _key(schema: list[dict[str, str]], kind: str) -> str | None:
    return next((k["AttributeName"] for k in schema if k["KeyType"] == kind), None)


def _table(props: dict[str, Any]) -> dict[str, Any]:
    ttl = props.get("TimeToLiveSpecification") or {}
    pitr = props.get("PointInTimeRecoverySpecification") or {}
    return {
        "name": props["TableName"],
        "billing_mode": props.get("BillingMode", "PROVISIONED"),
        "partition_key": _key(props["KeySchema"], "HASH"),
        "sort_key": _key(props["KeySchema"], "RANGE"),
        "attribute_types": {a["AttributeName"]: a["AttributeType"] for a in props["AttributeDefinitions"]},
        "indexes": sorted(
            (
                {
                    "name": g["IndexName"],
                    "partition_key": _key(g["KeySchema"], "HASH"),
                    "sort_key": _key(g["KeySchema"], "RANGE"),
                    "projection": g["Projection"]["ProjectionType"],
                }
                for g in props.get("GlobalSecondaryIndexes", [])
            ),
            key=lambda i: str(i["name"]),
        ),
        "ttl_attribute": ttl.get("AttributeName") if ttl.get("Enabled") else None,
        "point_in_time_recovery": bool(pitr.get("PointInTimeRecoveryEnabled", False)),
    }


def _bucket(props: dict[str, Any], region: str, account: str) -> dict[str, Any]:
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    block = props.get("PublicAccessBlockConfiguration") or {}
    rules = (props.get("LifecycleConfiguration") or {}).get("Rules", [])
    expiry = [r["ExpirationInDays"] for r in rules if r.get("Status") == "Enabled" and "ExpirationInDays" in r]
    name = resolve(props["BucketName"])
    assert isinstance(name, str), props["BucketName"]
    return {
        "name": name.replace(REGION, region).replace(ACCOUNT, account),  # resolved for another region and account
        "encryption": sse["SSEAlgorithm"],
        "public_access_blocked": all(
            block.get(k) for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
        ),
        "versioned": (props.get("VersioningConfiguration") or {}).get("Status") == "Enabled",
        "expire_after_days": expiry[0] if expiry else None,
    }


def _kms_key(res: dict[str, Any], alias: str) -> dict[str, Any] | None:
    aliases = [v["Properties"] for v in res.values() if v["Type"] == "AWS::KMS::Alias"]
    found = [a for a in aliases if a["AliasName"] == alias]
    if not found:
        return None
    props = res[found[0]["TargetKeyId"]["Fn::GetAtt"][0]]["Properties"]
    return {
        "alias": alias,
        "description": props.get("Description", ""),
        "key_usage": props.get("KeyUsage", "ENCRYPT_DECRYPT"),
        "key_spec": props.get("KeySpec", "SYMMETRIC_DEFAULT"),
        "enabled": props.get("Enabled", True),
        "rotation": props.get("EnableKeyRotation", False),
    }


def template_state(synth: Synth, region: str, account: str) -> dict[str, Any]:
    """The template's queues, tables, buckets and keys in ``describe``'s shape, keyed by spec key."""
    res = synth.json["Resources"]
    topo = synth.topology

    def one(kind: str, prop: str, value: str) -> str:
        found = [k for k, v in res.items() if v["Type"] == kind and v["Properties"].get(prop) == value]
        assert len(found) == 1, (kind, value, found)
        return found[0]

    buckets = [v["Properties"] for v in res.values() if v["Type"] == "AWS::S3::Bucket"]
    by_name = {_bucket(p, region, account)["name"]: _bucket(p, region, account) for p in buckets}
    return {
        "queues": {q.key: _queue(res, one("AWS::SQS::Queue", "QueueName", q.name)) for q in topo.queues},
        "tables": {
            t.key: _table(res[one("AWS::DynamoDB::Table", "TableName", t.name)]["Properties"]) for t in topo.tables
        },
        "buckets": {b.key: by_name.get(b.name(account, region)) for b in topo.buckets},
        "keys": {k.key: _kms_key(res, k.alias) for k in topo.keys},
    }


def test_the_stack_and_the_bootstrap_agree_on_every_queue_table_bucket_and_key(
    cloud: LocalCloud, tmp_path: Path
) -> None:
    stage = "agree-" + tmp_path.name[-6:].lower().replace("_", "-").strip("-")
    synth = synthesize(tmp_path / "synth", stage)
    assert synth.topology == topology(stage)
    report = bootstrap(synth.topology, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    actual = describe(synth.topology, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    rendered = template_state(synth, cloud.region, report.account)
    for key, table in actual["tables"].items():
        if table is not None and table["point_in_time_recovery"] is None:  # the emulator has no PITR
            rendered["tables"][key]["point_in_time_recovery"] = None
    assert rendered["queues"] == actual["queues"]
    assert rendered["tables"] == actual["tables"]
    assert rendered["buckets"] == actual["buckets"]
    assert rendered["keys"] == actual["keys"]
    assert all(v is not None for section in rendered.values() for v in section.values())
