"""The embedded cloud's moto fixes, applied in-process (and undone after each test).

An SQS send must not walk the queue's backlog, and the queue's approximate counts must stay
right. The server-side counterpart, against a running ``tollway.cloud.moto_server``, is in
``tests/integration/test_local_bootstrap.py``. A KMS key that CloudFormation created must stay
usable (its server-side counterpart is ``tests/integration/test_deploy_local.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import backends, mock_aws
from moto.dynamodb.models import DynamoDBBackend
from moto.kms.models import Key
from moto.sqs.models import Message, Queue, SQSBackend

from tollway.cloud import moto_server

REGION = "us-east-1"


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``patch_moto()``, with every class attribute it replaces restored afterwards."""
    for name in moto_server._APPROXIMATE_COUNTS:
        monkeypatch.setattr(Queue, name, Queue.__dict__[name])
    for name in ("send_message", "send_message_batch"):
        monkeypatch.setattr(SQSBackend, name, SQSBackend.__dict__[name])
    for name in moto_server._WRITES:
        monkeypatch.setattr(DynamoDBBackend, name, DynamoDBBackend.__dict__[name])
    monkeypatch.setattr(backends, "list_of_moto_modules", backends.list_of_moto_modules)
    monkeypatch.setattr(Key, "create_from_cloudformation_json", Key.__dict__["create_from_cloudformation_json"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    moto_server.patch_moto()
    yield


@pytest.fixture
def visibility_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of ``Message.visible`` evaluations: one per message each time the backlog is walked."""
    calls = [0]
    original = Message.__dict__["visible"].fget

    def counted(message: Any) -> bool:
        calls[0] += 1
        return bool(original(message))

    monkeypatch.setattr(Message, "visible", property(counted))
    return calls


def _send_batches(sqs: Any, url: str, batches: int) -> None:
    for b in range(batches):
        entries = [{"Id": str(i), "MessageBody": f'{{"b":{b},"i":{i}}}'} for i in range(10)]
        assert not sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")


def _counts(sqs: Any, url: str) -> dict[str, int]:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return {name: int(attributes[name]) for name in names}


@mock_aws
def test_a_send_does_not_walk_the_backlog(patched: None, visibility_checks: list[int]) -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="backlog")["QueueUrl"]
    _send_batches(sqs, url, 20)  # a backlog of 200 messages
    before = visibility_checks[0]

    _send_batches(sqs, url, 1)
    sqs.send_message(QueueUrl=url, MessageBody="one more")

    # Unpatched moto evaluates every queued message's visibility at least once per message sent.
    assert visibility_checks[0] == before


@mock_aws
def test_the_counts_stay_right(patched: None) -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="counted")["QueueUrl"]
    _send_batches(sqs, url, 3)
    assert _counts(sqs, url) == {"ApproximateNumberOfMessages": 30, "ApproximateNumberOfMessagesNotVisible": 0}

    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    assert len(received) == 10
    sqs.send_message(QueueUrl=url, MessageBody="after the receive")
    assert _counts(sqs, url) == {"ApproximateNumberOfMessages": 21, "ApproximateNumberOfMessagesNotVisible": 10}


@mock_aws
def test_fifo_deduplication_still_reads_the_queue_attribute(patched: None) -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    url = sqs.create_queue(QueueName="dedup.fifo", Attributes=attributes)["QueueUrl"]
    for _ in range(3):
        sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g")
    assert _counts(sqs, url)["ApproximateNumberOfMessages"] == 1


def test_the_service_list_is_read_once_and_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's dispatcher lists its package directory for every request; the patched list is
    the same services, read from the disk once."""
    monkeypatch.setattr(backends, "list_of_moto_modules", backends.list_of_moto_modules)
    unpatched = list(backends.list_of_moto_modules())
    listings = [0]
    real_listdir = os.listdir

    def counted(path: Any) -> list[str]:
        listings[0] += 1
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", counted)
    moto_server._list_services_once()
    assert listings[0] == 1
    for _ in range(3):
        services = backends.list_of_moto_modules()
        assert "sqs" in services and "dynamodb" in services
        assert list(services) == unpatched
    assert listings[0] == 1


KEY_TEMPLATE = {
    "Resources": {
        "VaultKey": {
            "Type": "AWS::KMS::Key",
            "Properties": {
                "Description": "wraps data keys",
                "EnableKeyRotation": True,
                "KeyPolicy": {  # an object, as CDK writes it, not JSON text
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                            "Action": "kms:*",
                            "Resource": "*",
                        }
                    ],
                },
            },
        },
        "VaultKeyAlias": {
            "Type": "AWS::KMS::Alias",
            "Properties": {"AliasName": "alias/t-pii-vault", "TargetKeyId": {"Fn::GetAtt": ["VaultKey", "Arn"]}},
        },
    }
}


@mock_aws
def test_a_kms_key_from_cloudformation_can_be_described_and_used(patched: None) -> None:
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="keys", TemplateBody=json.dumps(KEY_TEMPLATE)
    )
    kms = boto3.client("kms", region_name=REGION)
    meta = kms.describe_key(KeyId="alias/t-pii-vault")["KeyMetadata"]
    assert (meta["Description"], meta["Enabled"]) == ("wraps data keys", True)
    assert kms.get_key_rotation_status(KeyId=meta["KeyId"])["KeyRotationEnabled"] is True
    data = kms.generate_data_key(KeyId="alias/t-pii-vault", KeySpec="AES_256")
    assert kms.decrypt(CiphertextBlob=data["CiphertextBlob"], KeyId=meta["Arn"])["Plaintext"] == data["Plaintext"]
    assert (
        json.loads(kms.get_key_policy(KeyId=meta["KeyId"], PolicyName="default")["Policy"])
        == (
            KEY_TEMPLATE["Resources"]["VaultKey"]["Properties"]["KeyPolicy"]  # type: ignore[index]
        )
    )
