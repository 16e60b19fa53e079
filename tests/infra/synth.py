"""The synthesized stacks the infra tests read, and the lookups they share.

Synthesis starts the jsii runtime and runs CDK's template validation (several seconds), so
``conftest.py`` synthesizes each stack once per session; every lookup here goes through
:class:`Synth`, and every expected value comes from the stack's topology.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Template

from infra.app import AppContext, build_stack, new_app
from tests.infra.synthetic import placeholder_layers
from tests.infra.template_tools import ACCOUNT, REGION, actions_on, as_list, refs, resolve, role_statements
from tollway.cloud.resources import BucketSpec, Grant, Topology, topology

STAGE = "assert-stage"
"""Not the default prefix, so a name that ignored the ``stage`` context would show."""
WORKER_STAGE = "assert-worker"


@dataclass(frozen=True)
class Synth:
    topology: Topology
    template: Template
    json: dict[str, Any]

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == kind}

    def one(self, kind: str, **props: Any) -> tuple[str, dict[str, Any]]:
        """The single resource of ``kind`` whose properties include ``props``."""
        found = [
            (k, v)
            for k, v in self.resources(kind).items()
            if all(v.get("Properties", {}).get(p) == want for p, want in props.items())
        ]
        assert len(found) == 1, f"expected one {kind} with {props}, found {[k for k, _ in found]}"
        return found[0]


def synthesize(root: Path, stage: str, topo: Topology | None = None) -> Synth:
    layers = placeholder_layers(root / "layers")
    app = new_app({"layersDir": str(layers), "stage": stage})
    stack = build_stack(app, AppContext.from_app(app), root / "staging", topo)
    template = Template.from_stack(stack)
    return Synth(topo or topology(stage), template, dict(template.to_json()))


def queue_id(synth: Synth, name: str) -> str:
    return synth.one("AWS::SQS::Queue", QueueName=name)[0]


def table_id(synth: Synth, name: str) -> str:
    return synth.one("AWS::DynamoDB::Table", TableName=name)[0]


def key_id(synth: Synth, alias: str) -> str:
    """The logical id of the KMS key that ``alias`` names."""
    _, found = synth.one("AWS::KMS::Alias", AliasName=alias)
    (target,) = refs(found["Properties"]["TargetKeyId"])
    assert synth.json["Resources"][target]["Type"] == "AWS::KMS::Key"
    return target


def bucket_id(synth: Synth, spec: BucketSpec) -> str:
    want = spec.name(ACCOUNT, REGION)
    found = [k for k, v in synth.resources("AWS::S3::Bucket").items() if resolve(v["Properties"]["BucketName"]) == want]
    assert len(found) == 1, f"bucket {want}: {found}"
    return found[0]


def lifecycle(bucket_props: dict[str, Any]) -> list[dict[str, Any]]:
    """A template bucket's enabled lifecycle rules in ``tollway.cloud.bootstrap.describe``'s shape."""
    rules = (bucket_props.get("LifecycleConfiguration") or {}).get("Rules", [])
    shaped = [
        {
            "prefix": r.get("Prefix", ""),
            "expire_after_days": r.get("ExpirationInDays"),
            "noncurrent_expire_after_days": (r.get("NoncurrentVersionExpiration") or {}).get("NoncurrentDays"),
        }
        for r in rules
        if r["Status"] == "Enabled"
    ]
    return sorted(shaped, key=lambda r: str(r["prefix"]))


def function(synth: Synth, name: str) -> tuple[str, dict[str, Any]]:
    logical_id, resource = synth.one("AWS::Lambda::Function", FunctionName=name)
    return logical_id, resource["Properties"]


def function_role(synth: Synth, name: str) -> str:
    (role,) = refs(function(synth, name)[1]["Role"])
    return role


EXPECTED_ACTIONS: dict[tuple[str, str], tuple[set[str], set[str]]] = {
    ("queue", "send"): ({"sqs:SendMessage"}, {"sqs:ReceiveMessage", "sqs:DeleteMessage"}),
    ("queue", "consume"): ({"sqs:ReceiveMessage", "sqs:DeleteMessage"}, {"sqs:SendMessage"}),
    ("table", "read"): ({"dynamodb:GetItem", "dynamodb:Query"}, {"dynamodb:PutItem", "dynamodb:DeleteItem"}),
    ("table", "write"): ({"dynamodb:PutItem", "dynamodb:UpdateItem"}, {"dynamodb:GetItem", "dynamodb:Query"}),
    ("table", "read-write"): ({"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}, set()),
    ("table", "item-read-write"): (
        {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
        {"dynamodb:Query", "dynamodb:Scan", "dynamodb:BatchGetItem", "dynamodb:DeleteItem", "dynamodb:*"},
    ),
    ("key", "envelope"): ({"kms:GenerateDataKey", "kms:Decrypt"}, {"kms:Encrypt", "kms:ReEncrypt*", "kms:*"}),
    ("key", "encrypt"): ({"kms:GenerateDataKey"}, {"kms:Decrypt", "kms:Encrypt", "kms:ReEncrypt*", "kms:*"}),
    ("key", "decrypt"): ({"kms:Decrypt"}, {"kms:GenerateDataKey", "kms:Encrypt", "kms:ReEncrypt*", "kms:*"}),
    ("bucket", "read"): ({"s3:GetObject*"}, {"s3:PutObject", "s3:DeleteObject", "s3:DeleteObject*"}),
    ("bucket", "write"): ({"s3:PutObject"}, {"s3:GetObject*", "s3:DeleteObject", "s3:DeleteObject*"}),
    ("bucket", "delete"): (
        {"s3:DeleteObject"},
        {"s3:GetObject*", "s3:PutObject", "s3:DeleteObject*", "s3:DeleteObjectVersion", "s3:*"},
    ),
    ("bucket", "read-write"): ({"s3:GetObject*", "s3:PutObject"}, set()),
    ("secret", "read"): ({"secretsmanager:GetSecretValue"}, set()),
    ("bedrock", "invoke"): (
        {"bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"},
        {"bedrock:*", "bedrock:CreateModelCustomizationJob", "bedrock:GetFoundationModel"},
    ),
}
"""(must have, must not have) per grant: enough to tell each access from the others. Two grants on
one resource (read and write) allow what either must have, and nothing either must not have
that the other must have."""


def resource_id(synth: Synth, grant: Grant) -> str:
    topo = synth.topology
    if grant.kind == "queue":
        return queue_id(synth, topo.queue(grant.key).name)
    if grant.kind == "table":
        return table_id(synth, topo.table(grant.key).name)
    if grant.kind == "key":
        return key_id(synth, topo.kms_key(grant.key).alias)
    return bucket_id(synth, topo.bucket(grant.key))


def secret_actions(stmts: list[dict[str, Any]], secret_name: str) -> set[str]:
    marker = f":secret:{secret_name}-??????"
    return {a for s in stmts if marker in json.dumps(s.get("Resource")) for a in s["Action"]}


def bedrock_actions(stmts: list[dict[str, Any]]) -> set[str]:
    """The actions allowed on Bedrock's models (a grant on resources the stack does not create)."""
    return {a for s in stmts if ":foundation-model/" in json.dumps(s.get("Resource")) for a in as_list(s["Action"])}


def named_role(synth: Synth, role_name: str) -> str:
    """The logical id of the IAM role named ``role_name`` (a :class:`RoleSpec`'s)."""
    return synth.one("AWS::IAM::Role", RoleName=role_name)[0]


def assert_grants(synth: Synth, function_name: str, grants: tuple[Grant, ...]) -> None:
    """The function's role allows exactly its grants: each with its actions, nothing on the rest."""
    assert_role_grants(synth, function_role(synth, function_name), grants, function_name)


def assert_role_grants(synth: Synth, role_id: str, grants: tuple[Grant, ...], label: str) -> None:
    """The role allows exactly ``grants``: each with its actions, nothing on the rest."""
    stmts = role_statements(synth.json, role_id)
    by_resource: dict[tuple[str, str], list[Grant]] = {}
    for grant in grants:
        by_resource.setdefault((grant.kind, grant.key), []).append(grant)
    granted: set[str] = set()
    for (kind, key), same in by_resource.items():
        must = set().union(*(EXPECTED_ACTIONS[(g.kind, g.access)][0] for g in same))
        must_not = set().union(*(EXPECTED_ACTIONS[(g.kind, g.access)][1] for g in same)) - must
        if kind == "secret":
            actions = secret_actions(stmts, synth.topology.secret(key).name)
        elif kind == "bedrock":
            actions = bedrock_actions(stmts)
        else:
            target = resource_id(synth, same[0])
            granted.add(target)
            actions = actions_on(stmts, target)
        assert must <= actions, (label, same, actions)
        assert not must_not & actions, (label, same, actions)
    data = ("AWS::SQS::Queue", "AWS::DynamoDB::Table", "AWS::S3::Bucket", "AWS::KMS::Key")
    for kind in data:
        for logical_id in synth.resources(kind):
            if logical_id not in granted:
                assert actions_on(stmts, logical_id) == set(), (label, logical_id)
    if not any(g.kind == "bedrock" for g in grants):
        assert bedrock_actions(stmts) == set(), (label, "bedrock")
    granted_secrets = {synth.topology.secret(g.key).name for g in grants if g.kind == "secret"}
    for spec in synth.topology.secrets:
        if spec.name not in granted_secrets:
            assert secret_actions(stmts, spec.name) == set(), (label, spec.name)
