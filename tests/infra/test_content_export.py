"""Content capture and the dataset export in the stack: the export function and its queue, the
content key, the retention rules of the content and exports buckets, and who may touch them.

The general tests (``test_stack.py``) already hold every role to its spec; these pin the values
and the boundaries that the content design (docs/export.md) depends on, so a change to the spec
that widens them fails here by name.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from infra.constructs.function import DECRYPT_ACTIONS, DELETE_ACTIONS, ENCRYPT_ACTIONS
from tests.infra.synth import (
    Synth,
    bucket_id,
    function,
    function_role,
    key_id,
    lifecycle,
    named_role,
    queue_id,
    table_id,
)
from tests.infra.template_tools import ACCOUNT, REGION, actions_on, as_list, refs, resolve, role_statements

TABLE_READ = {
    "dynamodb:BatchGetItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:Query",
    "dynamodb:Scan",
}
BUCKET_READ = {"s3:GetBucket*", "s3:GetObject*", "s3:List*"}
BUCKET_PUT = {
    "s3:Abort*",
    "s3:PutObject",
    "s3:PutObjectLegalHold",
    "s3:PutObjectRetention",
    "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging",
}
QUEUE_SEND = {"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"}


def _ids(synth: Synth) -> dict[str, str]:
    topo = synth.topology
    return {
        "content": bucket_id(synth, topo.bucket("content")),
        "exports": bucket_id(synth, topo.bucket("exports")),
        "key": key_id(synth, topo.kms_key("content").alias),
        "audit-table": table_id(synth, topo.table("audit").name),
        "audit-queue": queue_id(synth, topo.queue("audit").name),
        "exports-queue": queue_id(synth, topo.queue("exports").name),
    }


def _allows(stmts: list[dict[str, Any]], logical_id: str, action: str) -> bool:
    """Whether an Allow on ``logical_id`` or on ``*`` matches ``action`` (wildcards in the policy count)."""
    for s in stmts:
        if s["Effect"] != "Allow":
            continue
        if logical_id not in refs(s.get("Resource")) and "*" not in as_list(s.get("Resource", [])):
            continue
        if any(fnmatch.fnmatchcase(action, pattern) for pattern in as_list(s["Action"])):
            return True
    return False


def _env(props: dict[str, Any]) -> dict[str, Any]:
    return {k: resolve(v) for k, v in props["Environment"]["Variables"].items()}


def test_the_dataset_export_runs_its_handler_for_up_to_15_minutes_with_1_gb(synth: Synth) -> None:
    spec = synth.topology.function("dataset-export")
    _, props = function(synth, f"{synth.topology.prefix}-dataset-export")
    assert props["Handler"] == spec.handler == "functions.dataset_export.handler.handler"
    assert (props["Timeout"], props["MemorySize"]) == (900, 1024)
    env = _env(props)
    assert synth.topology.environment(ACCOUNT, REGION).items() <= env.items()
    assert env["TOLLWAY_QUEUE_EXPORTS"] == f"{synth.topology.prefix}-export-requests"
    assert env["TOLLWAY_CONTENT_KMS_KEY_ID"] == f"alias/{synth.topology.prefix}-content"
    assert env["TOLLWAY_CONTENT_RETENTION_DAYS"] == "standard=30,restricted=7"


def test_the_dataset_export_takes_one_export_request_at_a_time(synth: Synth) -> None:
    function_id, _ = function(synth, f"{synth.topology.prefix}-dataset-export")
    _, mapping = synth.one(
        "AWS::Lambda::EventSourceMapping",
        FunctionName={"Ref": function_id},
        EventSourceArn={"Fn::GetAtt": [_ids(synth)["exports-queue"], "Arn"]},
    )
    props = mapping["Properties"]
    assert props["BatchSize"] == 1
    assert props.get("MaximumBatchingWindowInSeconds", 0) == 0
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_the_export_queue_outlasts_six_export_timeouts_and_has_a_dead_letter_queue(synth: Synth) -> None:
    prefix = synth.topology.prefix
    dlq_id, dlq = synth.one("AWS::SQS::Queue", QueueName=f"{prefix}-export-requests-dlq")
    _, queue = synth.one("AWS::SQS::Queue", QueueName=f"{prefix}-export-requests")
    assert queue["Properties"]["VisibilityTimeout"] == 5400 == 6 * 900
    assert queue["Properties"]["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq_id, "Arn"]}
    assert dlq["Properties"]["MessageRetentionPeriod"] == 14 * 86_400


def test_the_content_key_is_its_own_rotated_retained_key(synth: Synth) -> None:
    ids = _ids(synth)
    key = synth.json["Resources"][ids["key"]]
    assert key["Properties"]["Description"] == "Wraps the data keys of captured content (docs/export.md)"
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain"
    assert ids["key"] != key_id(synth, synth.topology.kms_key("pii-vault").alias)
    outputs = [o["Value"] for o in synth.json["Outputs"].values()]
    assert {"Fn::GetAtt": [ids["key"], "Arn"]} in outputs


def test_content_expires_per_retention_class_with_a_whole_bucket_backstop(synth: Synth) -> None:
    props = synth.json["Resources"][_ids(synth)["content"]]["Properties"]
    assert "VersioningConfiguration" not in props, "a delete must remove content, not leave a version"
    assert lifecycle(props) == [
        {"prefix": "", "expire_after_days": 30, "noncurrent_expire_after_days": None},
        {"prefix": "content/restricted/", "expire_after_days": 7, "noncurrent_expire_after_days": None},
        {"prefix": "content/standard/", "expire_after_days": 30, "noncurrent_expire_after_days": None},
    ]
    ids = {r["Id"] for r in props["LifecycleConfiguration"]["Rules"]}
    assert ids == {"expire", "expire-content-standard", "expire-content-restricted"}


def test_exports_are_versioned_kept_a_year_and_old_versions_a_month(synth: Synth) -> None:
    props = synth.json["Resources"][_ids(synth)["exports"]]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert lifecycle(props) == [{"prefix": "", "expire_after_days": 365, "noncurrent_expire_after_days": 30}]


@pytest.mark.parametrize("suffix", ["", "-buffered"])
def test_the_gateway_only_puts_content_and_only_generates_content_data_keys(synth: Synth, suffix: str) -> None:
    ids = _ids(synth)
    stmts = role_statements(synth.json, function_role(synth, synth.topology.gateway.name + suffix))
    assert actions_on(stmts, ids["content"]) == BUCKET_PUT
    assert actions_on(stmts, ids["key"]) == set(ENCRYPT_ACTIONS) == {"kms:GenerateDataKey"}
    assert actions_on(stmts, ids["exports"]) == set()
    for bucket in ("content", "exports"):
        for action in ("s3:GetObject", "s3:GetObjectVersion", "s3:ListBucket", "s3:DeleteObject"):
            assert not _allows(stmts, ids[bucket], action), (bucket, action)
    assert not _allows(stmts, ids["key"], "kms:Decrypt")
    assert not _allows(stmts, ids["exports-queue"], "sqs:SendMessage")


def test_the_export_function_reads_content_and_writes_exports_but_deletes_nothing(synth: Synth) -> None:
    ids = _ids(synth)
    stmts = role_statements(synth.json, function_role(synth, f"{synth.topology.prefix}-dataset-export"))
    assert actions_on(stmts, ids["content"]) == BUCKET_READ
    assert actions_on(stmts, ids["key"]) == set(DECRYPT_ACTIONS) == {"kms:Decrypt"}
    assert actions_on(stmts, ids["exports"]) == BUCKET_READ | BUCKET_PUT
    assert actions_on(stmts, ids["audit-table"]) == TABLE_READ
    assert actions_on(stmts, ids["audit-queue"]) == QUEUE_SEND
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= actions_on(stmts, ids["exports-queue"])
    every_action = {a for s in stmts for a in as_list(s["Action"])}
    assert not {a for a in every_action if a.startswith("s3:Delete")}, every_action
    assert not _allows(stmts, ids["key"], "kms:GenerateDataKey")
    assert not _allows(stmts, ids["content"], "s3:PutObject")


def _role_actions(synth: Synth, key: str) -> dict[str, set[str]]:
    """The role's actions per resource of :func:`_ids` it may touch, and every action it has."""
    role = synth.topology.role(key)
    stmts = role_statements(synth.json, named_role(synth, role.name))
    found = {name: actions_on(stmts, logical_id) for name, logical_id in _ids(synth).items()}
    found = {name: actions for name, actions in found.items() if actions}
    found["*"] = {a for s in stmts for a in as_list(s["Action"])}
    return found


def test_the_auditor_reads_the_audit_table_and_the_exports(synth: Synth) -> None:
    assert _role_actions(synth, "auditor") == {
        "audit-table": TABLE_READ,
        "exports": BUCKET_READ,
        "*": TABLE_READ | BUCKET_READ,
    }


def test_the_content_deleter_deletes_content_and_records_it_but_cannot_decrypt_or_write(synth: Synth) -> None:
    assert _role_actions(synth, "content-deleter") == {
        "content": set(DELETE_ACTIONS) | BUCKET_READ,
        "audit-table": TABLE_READ,
        "audit-queue": QUEUE_SEND,
        "*": set(DELETE_ACTIONS) | BUCKET_READ | TABLE_READ | QUEUE_SEND,
    }
    assert DELETE_ACTIONS == ("s3:DeleteObject",)


def test_the_export_requester_sends_requests_and_reads_the_exports(synth: Synth) -> None:
    assert _role_actions(synth, "export-requester") == {
        "exports-queue": QUEUE_SEND,
        "exports": BUCKET_READ,
        "*": QUEUE_SEND | BUCKET_READ,
    }


def test_each_role_is_named_by_its_spec_and_assumable_from_the_account_only(synth: Synth) -> None:
    roles = synth.topology.roles
    assert {r.key for r in roles} == {"auditor", "content-deleter", "export-requester"}
    for spec in roles:
        role_id = named_role(synth, spec.name)
        props = synth.json["Resources"][role_id]["Properties"]
        assert props["Description"] == spec.description
        (statement,) = props["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Action"] == "sts:AssumeRole"
        assert statement["Effect"] == "Allow"
        assert resolve(statement["Principal"]["AWS"]) == f"arn:aws:iam::{ACCOUNT}:root"
        assert "ManagedPolicyArns" not in props
