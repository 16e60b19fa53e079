"""Queues, tables, buckets and KMS keys, each built from its spec in ``tollway.cloud.resources``."""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from tollway.cloud.resources import BucketSpec, KeySpec, QueueSpec, TableSpec, expiry_rule_id

__all__ = [
    "KEY_DELETION_WINDOW_DAYS",
    "QueueWithDlq",
    "bucket",
    "construct_id",
    "kms_key",
    "lifecycle_rules",
    "table",
]

KEY_DELETION_WINDOW_DAYS = 30
"""The longest pending window KMS allows: a scheduled deletion can be cancelled for a month."""


def construct_id(key: str, suffix: str) -> str:
    """``usage-ledger`` + ``Table`` -> ``UsageLedgerTable``: the PascalCase id of a spec's resource."""
    return "".join(part.capitalize() for part in key.split("-")) + suffix


class QueueWithDlq(Construct):
    """A standard queue and its dead-letter queue, redriven after ``max_receive_count`` receives.

    Both are SQS-encrypted and refuse plain HTTP. Queues hold events in flight, not records, so
    they are destroyed with the stack; the records live in the tables.
    """

    def __init__(self, scope: Construct, construct_id: str, *, spec: QueueSpec) -> None:
        super().__init__(scope, construct_id)
        self.spec = spec
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            queue_name=spec.dlq_name,
            retention_period=Duration.seconds(spec.dlq_retention_s),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            queue_name=spec.name,
            visibility_timeout=Duration.seconds(spec.visibility_timeout_s),
            retention_period=Duration.seconds(spec.retention_s),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=spec.max_receive_count, queue=self.dead_letter_queue
            ),
        )


def table(scope: Construct, spec: TableSpec) -> dynamodb.Table:
    """An on-demand table with string keys, AWS-managed encryption, retained when the stack goes."""
    pitr = dynamodb.PointInTimeRecoverySpecification(point_in_time_recovery_enabled=spec.point_in_time_recovery)
    result = dynamodb.Table(
        scope,
        construct_id(spec.key, "Table"),
        table_name=spec.name,
        partition_key=_string_key(spec.partition_key),
        sort_key=_string_key(spec.sort_key) if spec.sort_key else None,
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        encryption=dynamodb.TableEncryption.AWS_MANAGED,
        time_to_live_attribute=spec.ttl_attribute,
        point_in_time_recovery_specification=pitr,
        removal_policy=RemovalPolicy.RETAIN,
    )
    for index in spec.indexes:
        result.add_global_secondary_index(
            index_name=index.name,
            partition_key=_string_key(index.partition_key),
            sort_key=_string_key(index.sort_key) if index.sort_key else None,
            projection_type=dynamodb.ProjectionType.ALL,
        )
    return result


def _string_key(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


def bucket(scope: Construct, spec: BucketSpec) -> s3.Bucket:
    """A private, S3-encrypted, TLS-only bucket named per account and region, retained with its data.

    No ``auto_delete_objects``: its custom resource needs broad S3 permissions, and these buckets
    hold configuration, pricing history and exports that outlive a stack.
    """
    return s3.Bucket(
        scope,
        construct_id(spec.key, "Bucket"),
        bucket_name=spec.name(Aws.ACCOUNT_ID, Aws.REGION),
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        versioned=spec.versioned,
        lifecycle_rules=lifecycle_rules(spec) or None,
        removal_policy=RemovalPolicy.RETAIN,
    )


def lifecycle_rules(spec: BucketSpec) -> list[s3.LifecycleRule]:
    """The whole-bucket rule first, then one rule per prefix, named by :func:`expiry_rule_id`.

    The whole-bucket rule carries the current and the noncurrent expiry and aborts multipart
    uploads left incomplete for a day; a prefix rule only expires current objects.
    """
    rules: list[s3.LifecycleRule] = []
    if spec.expire_after_days is not None or spec.noncurrent_expire_after_days is not None:
        rules.append(
            s3.LifecycleRule(
                id=expiry_rule_id(""),
                expiration=_days(spec.expire_after_days),
                noncurrent_version_expiration=_days(spec.noncurrent_expire_after_days),
                abort_incomplete_multipart_upload_after=Duration.days(1),
            )
        )
    rules += [
        s3.LifecycleRule(id=expiry_rule_id(prefix), prefix=prefix, expiration=Duration.days(days))
        for prefix, days in spec.prefix_expiry
    ]
    return rules


def _days(days: int | None) -> Duration | None:
    return None if days is None else Duration.days(days)


def kms_key(scope: Construct, spec: KeySpec) -> kms.Key:
    """A symmetric customer-managed key with yearly rotation and its alias, retained with the stack.

    The key policy is CDK's default: the account's IAM decides who may use it, so each
    function's or role's policy gets exactly the actions of its grant (``envelope``:
    ``GenerateDataKey`` and ``Decrypt``; ``encrypt`` and ``decrypt``: one of them). Deleting the
    key would make everything it wrapped unreadable, so it is retained, and a deletion scheduled
    by hand waits the longest window.
    """
    return kms.Key(
        scope,
        construct_id(spec.key, "Key"),
        alias=spec.alias,
        description=spec.description,
        key_spec=kms.KeySpec.SYMMETRIC_DEFAULT,
        key_usage=kms.KeyUsage.ENCRYPT_DECRYPT,
        enable_key_rotation=spec.rotation,
        pending_window=Duration.days(KEY_DELETION_WINDOW_DAYS),
        removal_policy=RemovalPolicy.RETAIN,
    )
