"""One stage of Tollway: the gateway, the workers, the queues, tables, buckets, KMS keys and secrets they
use, the roles people assume, and the alarms and dashboard that watch them.

Every name and setting comes from the :class:`~tollway.cloud.resources.Topology` passed in; this
module only decides how each spec becomes CloudFormation, so the local cloud bootstrap (which
reads the same topology) and the deployed stack cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aws_cdk import Aws, CfnOutput, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.assets import CONFIG_NAME, REPO_ROOT, LayerZips, stage_function_code
from infra.constructs.function import ARCHITECTURE, RUNTIME, Resources, TollwayFunction
from infra.constructs.gateway import TASK_ROOT, Gateway, GatewayParameters
from infra.constructs.observability import AlarmParameters, Observability
from infra.constructs.storage import QueueWithDlq, bucket, construct_id, kms_key, table
from tollway.cloud.resources import Topology
from tollway.telemetry.emf import ENVIRONMENT_VARIABLE

__all__ = ["StackInputs", "TollwayStack"]


@dataclass(frozen=True, slots=True)
class StackInputs:
    """What a stage is built from: its topology, the published config, the layer zips.

    ``staging_dir`` receives each function's staged code; it must outlive the synth.
    """

    topology: Topology
    config: Path
    layers: LayerZips
    staging_dir: Path
    repo_root: Path = REPO_ROOT


AUDIT_ENVIRONMENT: Final = {"TOLLWAY_AUDIT_WAL_DIR": "/tmp/tollway-audit-wal", "TOLLWAY_AUDIT_SINK": "sqs"}
"""Where the gateway's WAL lives on Lambda and where the extension ships it (docs/audit.md). The
bundled config reads ``TOLLWAY_AUDIT_SINK``; ``/tmp`` suits bounded-async (local-durable needs EFS)."""


class TollwayStack(Stack):
    """The stage's stack; its id, the stage prefix, is also the CloudFormation stack name."""

    def __init__(self, scope: Construct, stack_id: str, *, inputs: StackInputs, **kwargs: Any) -> None:
        super().__init__(scope, stack_id, **kwargs)
        topo = inputs.topology
        self.queues = {q.key: QueueWithDlq(self, construct_id(q.key, "Queue"), spec=q) for q in topo.queues}
        self.tables = {t.key: table(self, t) for t in topo.tables}
        self.buckets = {b.key: bucket(self, b) for b in topo.buckets}
        self.keys = {k.key: kms_key(self, k) for k in topo.keys}
        self.secrets = {
            s.key: secretsmanager.Secret.from_secret_name_v2(self, construct_id(s.key, "Secret"), s.name)
            for s in topo.secrets
        }
        resources = Resources(
            queues={k: q.queue for k, q in self.queues.items()},
            tables=self.tables,
            buckets=self.buckets,
            secrets=self.secrets,
            keys=self.keys,
        )
        layers = [
            lambda_.LayerVersion(
                self,
                f"{name.capitalize()}Layer",
                layer_version_name=f"{topo.prefix}-{name}",
                description=description,
                code=lambda_.Code.from_asset(str(path)),
                compatible_runtimes=[RUNTIME],
                compatible_architectures=[ARCHITECTURE],
            )
            for name, path, description in (
                ("deps", inputs.layers.deps, "Tollway's pinned third-party dependencies"),
                ("core", inputs.layers.core, "The tollway core library"),
            )
        ]
        # TOLLWAY_ENVIRONMENT: the ``environment`` dimension of the functions' metrics, which the
        # alarms and the dashboard filter on (the gateway's config reads it for its own label).
        environment = {**topo.environment(Aws.ACCOUNT_ID, Aws.REGION), ENVIRONMENT_VARIABLE: topo.prefix}
        # The gateway appends audit events to a WAL under /tmp; the tollway-wal-shipper extension
        # (its own layer, gateway functions only) ships them to the audit queue after each invoke.
        extension = lambda_.LayerVersion(
            self,
            "ExtensionLayer",
            layer_version_name=f"{topo.prefix}-wal-shipper",
            description="The tollway-wal-shipper Lambda extension (audit WAL to the audit queue)",
            code=lambda_.Code.from_asset(str(inputs.layers.extension)),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
        )
        gateway_environment = {**environment, **AUDIT_ENVIRONMENT}

        def code(key: str, source_dir: str, config: Path | None = None) -> lambda_.Code:
            staged = stage_function_code(
                inputs.staging_dir / key, source_dir, repo_root=inputs.repo_root, config=config
            )
            return lambda_.Code.from_asset(str(staged))

        self.gateway = Gateway(
            self,
            "Gateway",
            spec=topo.gateway,
            parameters=GatewayParameters.declare(self, topo.gateway),
            code=code(topo.gateway.key, topo.gateway.source_dir, inputs.config),
            layers=[*layers, extension],
            environment=gateway_environment,
            resources=resources,
            log_retention_days=topo.log_retention_days,
        )
        self.workers: dict[str, TollwayFunction] = {}
        for spec in topo.functions:
            # A function that tests the gateway's deployments (conformance) carries its config too.
            config = inputs.config if spec.bundles_config else None
            bundled = {"TOLLWAY_CONFIG": f"{TASK_ROOT}/{CONFIG_NAME}"} if config is not None else {}
            worker = TollwayFunction(
                self,
                construct_id(spec.key, "Function"),
                function_name=spec.name,
                handler=spec.handler,
                code=code(spec.key, spec.source_dir, config),
                layers=layers,
                environment={**environment, **dict(spec.environment), **bundled},
                memory_size=spec.memory_mb,
                timeout=Duration.seconds(spec.timeout_s),
                log_retention_days=topo.log_retention_days,
            )
            worker.connect(spec, resources)
            self.workers[spec.key] = worker
        # People's roles: trusted by the account, so its IAM decides who may assume each one.
        self.roles: dict[str, iam.Role] = {}
        for role_spec in topo.roles:
            role = iam.Role(
                self,
                construct_id(role_spec.key, "Role"),
                role_name=role_spec.name,
                description=role_spec.description,
                assumed_by=iam.AccountRootPrincipal(),
            )
            for grant in role_spec.grants:
                resources.grant(role, grant)
            self.roles[role_spec.key] = role
        self.observability = Observability(
            self,
            "Observability",
            topology=topo,
            gateway_functions=[
                (topo.gateway.name, self.gateway.streaming),
                (self.gateway.buffered_name, self.gateway.buffered),
            ],
            workers=self.workers,
            queues=self.queues,
            parameters=AlarmParameters.declare(self),
        )
        self._outputs()

    def _outputs(self) -> None:
        CfnOutput(self, "GatewayStreamingUrl", value=self.gateway.streaming_url.url, description="RESPONSE_STREAM")
        CfnOutput(self, "GatewayBufferedUrl", value=self.gateway.buffered_url.url, description="BUFFERED")
        for key, q in self.queues.items():
            CfnOutput(self, construct_id(key, "QueueUrl"), value=q.queue.queue_url)
            CfnOutput(self, construct_id(key, "DeadLetterQueueUrl"), value=q.dead_letter_queue.queue_url)
        for key, t in self.tables.items():
            CfnOutput(self, construct_id(key, "TableName"), value=t.table_name)
        for key, b in self.buckets.items():
            CfnOutput(self, construct_id(key, "BucketName"), value=b.bucket_name)
        for key, k in self.keys.items():
            CfnOutput(self, construct_id(key, "KeyArn"), value=k.key_arn)
        for key, role in self.roles.items():
            CfnOutput(self, construct_id(key, "RoleArn"), value=role.role_arn)
