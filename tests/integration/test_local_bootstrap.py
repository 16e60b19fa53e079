"""The bootstrap against a real local cloud: it creates exactly the spec, and converges idempotently."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tollway.cloud.bootstrap import BootstrapError, Clients, bootstrap, describe, expected_state
from tollway.cloud.local import LocalCloud, free_port
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

SECRET_VALUE = "sk-mock-provider-value-that-must-never-be-printed"


def client(cloud: LocalCloud, service: str) -> Any:
    """The bootstrap's own client: path-style S3, and each service where the environment routes it."""
    return Clients(cloud.endpoint, cloud.region, cloud.env()).client(service)


def account(cloud: LocalCloud) -> str:
    return str(client(cloud, "sts").get_caller_identity()["Account"])


def test_bootstrap_creates_exactly_the_spec(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    report = bootstrap(
        topo, endpoint=cloud.endpoint, region=cloud.region, secrets={"openai": SECRET_VALUE}, env=cloud.env()
    )

    assert report.account == account(cloud)
    created = {(c.kind, c.key): c.action for c in report.changes}
    assert created == {
        **{("queue", q.key): "created" for q in topo.queues},
        **{("dlq", q.key): "created" for q in topo.queues},
        **{("table", t.key): "created" for t in topo.tables},
        **{("bucket", b.key): "created" for b in topo.buckets},
        **{("key", k.key): "created" for k in topo.keys},
        ("secret", "openai"): "created",
        ("secret", "anthropic"): "absent",
    }
    assert report.missing_secrets == ("anthropic",)

    state = describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    assert state == expected_state(topo, account=report.account, region=cloud.region, secrets={"openai"})
    # The shape carries the spec's numbers, not defaults the emulator happens to share.
    audit = state["queues"]["audit"]
    assert audit == {
        "name": f"{prefix}-audit-events",
        "visibility_timeout_s": 120,
        "retention_s": 4 * 86_400,
        "max_receive_count": 5,
        "dlq_name": f"{prefix}-audit-events-dlq",
        "dlq_retention_s": 14 * 86_400,
    }
    table = state["tables"]["audit"]
    assert table["billing_mode"] == "PAY_PER_REQUEST"
    assert table["attribute_types"] == {"pk": "S", "sk": "S", "principalId": "S", "ts": "S"}
    assert table["indexes"] == [
        {"name": "by-principal", "partition_key": "principalId", "sort_key": "ts", "projection": "ALL"}
    ]
    assert table["ttl_attribute"] == "expiresAt"
    assert state["tables"]["idempotency"]["point_in_time_recovery"] is False
    assert state["tables"]["quota-leases"]["sort_key"] is None
    content = state["buckets"]["content"]
    assert content["name"] == f"{prefix}-content-{report.account}-{cloud.region}"
    assert (content["expire_after_days"], content["versioned"]) == (30, False)
    assert state["buckets"]["config"]["versioned"] is True
    assert all(b["encryption"] == "AES256" and b["public_access_blocked"] for b in state["buckets"].values())
    assert state["secrets"] == {"openai": {"name": f"{prefix}/providers/openai"}, "anthropic": None}
    assert state["tables"]["pii-vault"]["sort_key"] is None
    assert state["tables"]["pii-vault"]["ttl_attribute"] == "expiresAt"
    vault_key = state["keys"]["pii-vault"]
    assert vault_key["alias"] == f"alias/{prefix}-pii-vault"
    assert (vault_key["key_usage"], vault_key["key_spec"]) == ("ENCRYPT_DECRYPT", "SYMMETRIC_DEFAULT")
    assert vault_key["enabled"] and vault_key["rotation"]

    stored = client(cloud, "secretsmanager").get_secret_value(SecretId=f"{prefix}/providers/openai")
    assert stored["SecretString"] == SECRET_VALUE
    assert SECRET_VALUE not in report.summary()


def test_second_bootstrap_changes_nothing(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    secrets = {"openai": SECRET_VALUE, "anthropic": SECRET_VALUE + "-2"}
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, secrets=secrets, env=cloud.env())
    before = describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    sqs = client(cloud, "sqs")
    url = sqs.get_queue_url(QueueName=topo.queue("audit").name)["QueueUrl"]
    modified = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["LastModifiedTimestamp"])["Attributes"]
    versions = client(cloud, "secretsmanager").list_secret_version_ids(SecretId=topo.secret("openai").name)["Versions"]

    again = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, secrets=secrets, env=cloud.env())

    assert not again.changed
    assert {c.action for c in again.changes} == {"unchanged"}
    assert describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env()) == before
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["LastModifiedTimestamp"])["Attributes"] == modified
    after = client(cloud, "secretsmanager").list_secret_version_ids(SecretId=topo.secret("openai").name)["Versions"]
    assert len(after) == len(versions)


def test_bootstrap_converges_drifted_resources(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    first = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    sqs, ddb, s3 = client(cloud, "sqs"), client(cloud, "dynamodb"), client(cloud, "s3")
    url = sqs.get_queue_url(QueueName=topo.queue("usage").name)["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "7"})
    ddb.update_time_to_live(
        TableName=topo.table("audit").name, TimeToLiveSpecification={"Enabled": False, "AttributeName": "expiresAt"}
    )
    bucket = topo.bucket("content").name(first.account, cloud.region)
    s3.delete_public_access_block(Bucket=bucket)
    s3.delete_bucket_lifecycle(Bucket=bucket)
    kms = client(cloud, "kms")
    vault_key = kms.describe_key(KeyId=topo.kms_key("pii-vault").alias)["KeyMetadata"]["KeyId"]
    kms.disable_key_rotation(KeyId=vault_key)
    kms.disable_key(KeyId=vault_key)

    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())

    updated = {(c.kind, c.key): c.notes for c in report.changes if c.action == "updated"}
    assert updated == {
        ("queue", "usage"): ("VisibilityTimeout",),
        ("table", "audit"): ("ttl",),
        ("bucket", "content"): ("public access block", "lifecycle"),
        ("key", "pii-vault"): ("enabled", "rotation"),
    }
    state = describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    assert state == expected_state(topo, account=first.account, region=cloud.region)


def test_secret_values_given_later_are_stored_and_updated(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    created = bootstrap(
        topo, endpoint=cloud.endpoint, region=cloud.region, secrets={"anthropic": "v1"}, env=cloud.env()
    )
    rotated = bootstrap(
        topo, endpoint=cloud.endpoint, region=cloud.region, secrets={"anthropic": "v2"}, env=cloud.env()
    )

    assert [c.action for c in created.changes if c.kind == "secret"] == ["absent", "created"]
    assert [(c.action, c.notes) for c in rotated.changes if c.key == "anthropic" and c.kind == "secret"] == [
        ("updated", ("value",))
    ]
    value = client(cloud, "secretsmanager").get_secret_value(SecretId=topo.secret("anthropic").name)["SecretString"]
    assert value == "v2"


def test_errors_name_the_resource_and_endpoint_never_the_secret(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    with pytest.raises(BootstrapError) as unknown:
        bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, secrets={"nope": SECRET_VALUE}, env=cloud.env())
    assert "nope" in str(unknown.value)
    assert SECRET_VALUE not in str(unknown.value)

    # A table that exists with another key schema cannot be converged: the error says which and where.
    client(cloud, "dynamodb").create_table(
        TableName=topo.table("usage-ledger").name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
    )
    with pytest.raises(BootstrapError) as conflict:
        bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, secrets={"openai": SECRET_VALUE}, env=cloud.env())
    message = str(conflict.value)
    assert topo.table("usage-ledger").name in message
    assert cloud.endpoint in message
    assert SECRET_VALUE not in message
    assert conflict.value.__cause__ is None and conflict.value.__suppress_context__


def test_a_key_pending_deletion_is_reported_never_replaced(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    kms = client(cloud, "kms")
    alias = topo.kms_key("pii-vault").alias
    key = kms.describe_key(KeyId=alias)["KeyMetadata"]["KeyId"]
    kms.schedule_key_deletion(KeyId=key, PendingWindowInDays=7)

    with pytest.raises(BootstrapError, match="pending deletion") as err:
        bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())

    assert alias in str(err.value)
    assert kms.describe_key(KeyId=alias)["KeyMetadata"]["KeyId"] == key, "the alias still names the old key"
    assert describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())["keys"]["pii-vault"] is None


def test_unreachable_endpoint_is_named(prefix: str) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BootstrapError) as err:
        bootstrap(topology(prefix), endpoint=endpoint, region="us-east-1")
    assert endpoint in str(err.value)


def test_describe_reports_missing_resources_as_none(cloud: LocalCloud, prefix: str) -> None:
    topo = topology(prefix)
    state = describe(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    assert set(state) == {"queues", "tables", "buckets", "lifecycle", "keys", "secrets"}
    for kind in state.values():
        assert kind and all(value is None for value in kind.values())
    assert json.loads(json.dumps(state)) == state  # the CLI prints it as JSON


def test_the_emulators_queue_counts_hold_across_sends_and_receives(cloud: LocalCloud, prefix: str) -> None:
    """The embedded moto skips the backlog counts while sending (``tollway.cloud.moto_server``); a
    GetQueueAttributes still counts every message."""
    sqs = client(cloud, "sqs")
    url = sqs.create_queue(QueueName=f"{prefix}-counts")["QueueUrl"]
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]

    def counts() -> tuple[int, int]:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return int(attributes[names[0]]), int(attributes[names[1]])

    for b in range(5):
        entries = [{"Id": str(i), "MessageBody": json.dumps({"b": b, "i": i})} for i in range(10)]
        assert not sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")
    assert counts() == (50, 0)
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    assert counts() == (41, len(received))
