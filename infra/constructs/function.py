"""A Lambda function with its own role and log group, and the grants that give it least privilege.

Each function gets a dedicated role with no managed policy: AWSLambdaBasicExecutionRole allows
writing to every log group in the account, so the role is granted its one log group instead.
The log group is explicit (the deprecated ``log_retention`` property would add a custom resource
with broad IAM) and its retention comes from the topology.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar, cast

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.constructs.storage import construct_id
from tollway.cloud.resources import FunctionSpec, Grant

__all__ = [
    "ARCHITECTURE",
    "DECRYPT_ACTIONS",
    "DELETE_ACTIONS",
    "ENCRYPT_ACTIONS",
    "ENVELOPE_ACTIONS",
    "ITEM_ACTIONS",
    "RUNTIME",
    "Resources",
    "TollwayFunction",
]

RUNTIME: Final = lambda_.Runtime.PYTHON_3_13
"""The newest Lambda Python runtime that requires-python admits and every binary dependency has
wheels for; ``layers.build.TARGET`` builds the dependencies layer for the same version."""
ARCHITECTURE: Final = lambda_.Architecture.X86_64
"""x86_64, as the dependencies layer's wheels (``manylinux2014_x86_64``) and the Web Adapter layer."""

ITEM_ACTIONS: Final = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
"""A table's ``item-read-write`` grant: one item at a time, by its key."""
ENVELOPE_ACTIONS: Final = ("kms:GenerateDataKey", "kms:Decrypt")
"""A KMS key's ``envelope`` grant: new data keys, and unwrapping stored ones."""
ENCRYPT_ACTIONS: Final = ("kms:GenerateDataKey",)
"""A KMS key's ``encrypt`` grant: new data keys to seal with; nothing sealed can be unwrapped."""
DECRYPT_ACTIONS: Final = ("kms:Decrypt",)
"""A KMS key's ``decrypt`` grant: unwrapping stored data keys; no new ones."""
DELETE_ACTIONS: Final = ("s3:DeleteObject",)
"""A bucket's ``delete`` grant: the current object only (no version, no tagging, no bucket)."""
_KEY_ACTIONS: Final = {"envelope": ENVELOPE_ACTIONS, "encrypt": ENCRYPT_ACTIONS, "decrypt": DECRYPT_ACTIONS}

BEDROCK_ACTIONS: Final = ("bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream")
"""What Bedrock's Converse and ConverseStream are authorized by."""


def bedrock_model_arns() -> list[str]:
    """Foundation models in any region (a cross-region inference profile invokes them in several),
    and this account's system-defined and application inference profiles."""
    partition, account = Aws.PARTITION, Aws.ACCOUNT_ID
    return [
        f"arn:{partition}:bedrock:*::foundation-model/*",
        f"arn:{partition}:bedrock:*:{account}:inference-profile/*",
        f"arn:{partition}:bedrock:*:{account}:application-inference-profile/*",
    ]


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Resources:
    """The stack's queues, tables, buckets, secrets and KMS keys by spec key, for grants and triggers."""

    queues: Mapping[str, sqs.IQueue]
    tables: Mapping[str, dynamodb.ITable]
    buckets: Mapping[str, s3.IBucket]
    secrets: Mapping[str, secretsmanager.ISecret]
    keys: Mapping[str, kms.IKey] = field(default_factory=dict)

    def grant(self, grantee: iam.IGrantable, grant: Grant) -> None:
        """Apply one :class:`Grant` through the L2 ``grant_*`` method that matches its access.

        Bucket ``write`` is put-only (``grant_put``): writers here add immutable objects (pricing
        snapshots, captured content, exports) and never need delete; bucket ``delete`` is
        :data:`DELETE_ACTIONS` on the bucket's objects. Table ``item-read-write`` is ``GetItem``,
        ``PutItem`` and ``UpdateItem`` on the table alone (no index, ``Query``, ``Scan``, batch,
        delete or export), and key ``envelope`` is ``GenerateDataKey`` and ``Decrypt``: the PII
        vault's boundary (docs/pii-vault.md); key ``encrypt`` and ``decrypt`` are one of the two.
        A bucket grant with a ``prefix`` covers the objects under it alone. A pair with no meaning
        (``secret``/``write``, a prefix on anything but a bucket read or write) fails synth rather
        than silently granting more or less.
        """
        kind, key, access = grant.kind, grant.key, grant.access
        if grant.prefix is not None and not (kind == "bucket" and access in ("read", "write", "read-write")):
            raise ValueError(f"unsupported grant: a prefix on {access!r} of {kind} {key!r}")
        if kind == "queue" and access in ("send", "consume"):
            queue = _lookup(self.queues, grant)
            (queue.grant_send_messages if access == "send" else queue.grant_consume_messages)(grantee)
        elif kind == "table" and access == "item-read-write":
            _lookup(self.tables, grant).grant(grantee, *ITEM_ACTIONS)
        elif kind == "table" and access in ("read", "write", "read-write"):
            table = _lookup(self.tables, grant)
            {"read": table.grant_read_data, "write": table.grant_write_data, "read-write": table.grant_read_write_data}[
                access
            ](grantee)
        elif kind == "bucket" and access in ("read", "write", "read-write"):
            bucket = _lookup(self.buckets, grant)
            pattern = f"{grant.prefix}*" if grant.prefix else "*"
            {"read": bucket.grant_read, "write": bucket.grant_put, "read-write": bucket.grant_read_write}[access](
                grantee, pattern
            )
        elif kind == "bucket" and access == "delete":
            # Not grant_delete: that is s3:DeleteObject*, which includes DeleteObjectVersion.
            objects = _lookup(self.buckets, grant).arn_for_objects("*")
            iam.Grant.add_to_principal(grantee=grantee, actions=list(DELETE_ACTIONS), resource_arns=[objects])
        elif kind == "secret" and access == "read":
            _lookup(self.secrets, grant).grant_read(grantee)
        elif kind == "key" and access in _KEY_ACTIONS:
            _lookup(self.keys, grant).grant(grantee, *_KEY_ACTIONS[access])
        elif kind == "bedrock" and key == "models" and access == "invoke":
            iam.Grant.add_to_principal(
                grantee=grantee, actions=list(BEDROCK_ACTIONS), resource_arns=bedrock_model_arns()
            )
        else:
            raise ValueError(f"unsupported grant: {access!r} on {kind} {key!r}")


def _lookup(items: Mapping[str, _T], grant: Grant) -> _T:
    try:
        return items[grant.key]
    except KeyError:
        raise ValueError(f"grant names unknown {grant.kind} {grant.key!r}; known: {sorted(items)}") from None


class TollwayFunction(Construct):
    """``Role``, ``LogGroup`` and ``Function`` for one deployment of a function on :data:`RUNTIME`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function_name: str,
        handler: str,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        environment: Mapping[str, str],
        memory_size: float,
        timeout: Duration,
        log_retention_days: int,
        reserved_concurrent_executions: float | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Least-privilege role of {function_name}",
        )
        self.log_group = logs.LogGroup(
            self,
            "LogGroup",
            log_group_name=f"/aws/lambda/{function_name}",
            retention=logs.RetentionDays.INFINITE,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # RetentionDays is an enum of names; the topology holds a number of days, which
        # CloudFormation validates against the allowed values at deploy time.
        cast(logs.CfnLogGroup, self.log_group.node.default_child).retention_in_days = log_retention_days
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            function_name=function_name,
            description=description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=handler,
            code=code,
            layers=list(layers),
            environment=dict(environment),
            memory_size=memory_size,
            timeout=timeout,
            reserved_concurrent_executions=reserved_concurrent_executions,
            role=self.role,
            log_group=self.log_group,
        )

    def connect(self, spec: FunctionSpec, resources: Resources) -> None:
        """Wire the spec's queue triggers and schedules, and apply its grants."""
        for trigger in spec.triggers:
            window = trigger.max_batching_window_s
            self.function.add_event_source(
                sources.SqsEventSource(
                    _lookup(resources.queues, Grant("queue", trigger.queue, "consume")),
                    batch_size=trigger.batch_size,
                    max_batching_window=Duration.seconds(window) if window else None,
                    max_concurrency=trigger.max_concurrency,
                    report_batch_item_failures=True,
                )
            )
        for schedule in spec.schedules:
            events.Rule(
                self,
                construct_id(schedule.name, "Schedule"),
                rule_name=f"{spec.name}-{schedule.name}",
                schedule=events.Schedule.expression(schedule.expression),
                targets=[targets.LambdaFunction(self.function)],
            )
        for grant in spec.grants:
            resources.grant(self.function, grant)
