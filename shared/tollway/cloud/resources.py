"""The one source of truth for Tollway's cloud resources: names and settings, no cloud SDK.

The CDK app (``infra/``) builds its stack from :func:`topology`, and the local cloud bootstrap
(``tollway.cloud.bootstrap``) creates the same queues, tables, buckets, KMS keys and secrets on
moto server or LocalStack from it. ``tests/infra`` proves the synthesized template and the spec agree.

Every name derives from one ``prefix`` (the stage), so two stages can share an account. Bucket
names must be globally unique on AWS, so they also carry the account and region; the CDK app
passes CloudFormation tokens there, the local bootstrap the emulator's account.

Worker functions (audit writer, usage reconciler, pricing refresh, dataset export, and the
conformance run of a stage that opts in) are listed in ``functions`` with their triggers and
grants; the local event-source runner serves whatever is listed there. ``roles`` are the IAM
roles people assume (an auditor, a content deleter, whoever requests exports): the CDK app
creates them with their grants; the local cloud does not enforce IAM, so the bootstrap leaves
them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

__all__ = [
    "CONFORMANCE_PREFIX",
    "CONTENT_RETENTION_DAYS",
    "DEFAULT_PREFIX",
    "BucketSpec",
    "FunctionSpec",
    "Grant",
    "KeySpec",
    "QueueSpec",
    "QueueTrigger",
    "RoleSpec",
    "ScheduleTrigger",
    "SecretSpec",
    "TableIndex",
    "TableSpec",
    "Topology",
    "conformance_function",
    "expiry_rule_id",
    "topology",
]

DEFAULT_PREFIX: Final = "tollway"
DAY_S: Final = 86_400
CONTENT_RETENTION_DAYS: Final = (("standard", 30), ("restricted", 7))
"""The content retention classes and their days: the defaults of the config's
``content.retentionClasses``. Each becomes a lifecycle rule on ``content/<class>/`` of the content
bucket (:func:`~tollway.content.base.content_key` leads with the class) and the dataset export's
``TOLLWAY_CONTENT_RETENTION_DAYS``. An operator who configures another class adds it here, or
its objects only expire with the bucket's backstop rule."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A standard SQS queue with its dead-letter queue and redrive policy."""

    key: str
    """Logical id, stable across stages (``audit``)."""
    name: str
    visibility_timeout_s: int = 120
    """At least 6x the consumer's timeout, as AWS advises for event source mappings."""
    retention_s: int = 4 * DAY_S
    max_receive_count: int = 5
    """Receives before a message is redriven to the DLQ."""
    dlq_retention_s: int = 14 * DAY_S

    @property
    def dlq_name(self) -> str:
        return f"{self.name}-dlq"


@dataclass(frozen=True, slots=True)
class TableIndex:
    name: str
    partition_key: str
    sort_key: str | None = None


@dataclass(frozen=True, slots=True)
class TableSpec:
    """An on-demand DynamoDB table; every key attribute is a string."""

    key: str
    name: str
    partition_key: str = "pk"
    sort_key: str | None = "sk"
    ttl_attribute: str | None = "expiresAt"
    indexes: tuple[TableIndex, ...] = ()
    point_in_time_recovery: bool = True


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """An S3 bucket: encrypted, public access blocked, TLS only, with lifecycle expiry rules.

    ``expire_after_days`` expires every object (the whole-bucket rule); ``prefix_expiry`` adds a
    rule per key prefix. S3 applies the earliest expiration that matches an object, so a prefix
    rule longer than the whole-bucket one would never act: that is refused.
    """

    key: str
    prefix: str
    versioned: bool = False
    expire_after_days: int | None = None
    prefix_expiry: tuple[tuple[str, int], ...] = ()
    """``(key prefix, days)`` pairs; each prefix ends with ``/``."""
    noncurrent_expire_after_days: int | None = None
    """Days a version stays once it is no longer current (versioned buckets only)."""

    def __post_init__(self) -> None:
        days = [d for _, d in self.prefix_expiry]
        for value in (self.expire_after_days, self.noncurrent_expire_after_days, *days):
            if value is not None and value < 1:
                raise ValueError(f"bucket {self.key}: expiry days must be at least 1")
        prefixes = [p for p, _ in self.prefix_expiry]
        if len(set(prefixes)) != len(prefixes) or not all(p.endswith("/") and p != "/" for p in prefixes):
            raise ValueError(f"bucket {self.key}: expiry prefixes must be distinct and end with '/'")
        if self.expire_after_days is not None and any(d > self.expire_after_days for d in days):
            raise ValueError(
                f"bucket {self.key}: a prefix expires after the whole bucket's {self.expire_after_days} days"
            )
        if self.noncurrent_expire_after_days is not None and not self.versioned:
            raise ValueError(f"bucket {self.key}: noncurrent versions expire only on a versioned bucket")

    def name(self, account: str, region: str) -> str:
        return f"{self.prefix}-{self.key}-{account}-{region}"


def expiry_rule_id(prefix: str) -> str:
    """A lifecycle rule's id: ``expire`` for the whole bucket (``""``), ``expire-content-standard``
    for ``content/standard/``; the CDK stack and the local bootstrap name their rules alike."""
    return f"expire-{prefix.strip('/').replace('/', '-')}" if prefix else "expire"


@dataclass(frozen=True, slots=True)
class KeySpec:
    """A customer-managed symmetric KMS key (``ENCRYPT_DECRYPT``), found by its alias.

    Functions find it through ``environment_variable``, which holds the alias name: the same
    string on AWS and on a local cloud, where the key's own id is only known once it exists.
    It is retained with the stack (deleting it would make what it encrypted unreadable).
    """

    key: str
    alias: str
    """``alias/<stage>-<key>``."""
    description: str
    environment_variable: str
    rotation: bool = True
    """Yearly automatic rotation of the key material (old material still decrypts)."""


@dataclass(frozen=True, slots=True)
class SecretSpec:
    """A Secrets Manager secret the operator creates (CDK references it; it never holds values)."""

    key: str
    name: str
    description: str


@dataclass(frozen=True, slots=True)
class QueueTrigger:
    """An SQS event source mapping; ``ReportBatchItemFailures`` is always on."""

    queue: str
    """The :class:`QueueSpec` key."""
    batch_size: int = 10
    max_batching_window_s: int = 1
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleTrigger:
    """An EventBridge schedule; ``expression`` is ``rate(...)`` or ``cron(...)``."""

    name: str
    expression: str


Access = Literal[
    "read",
    "write",
    "read-write",
    "item-read-write",
    "consume",
    "send",
    "envelope",
    "encrypt",
    "decrypt",
    "delete",
    "invoke",
]
"""``item-read-write`` (tables): ``GetItem``, ``PutItem`` and ``UpdateItem`` only, no ``Query``,
``Scan``, batch, delete or export: one item at a time, by its key. ``envelope`` (KMS keys):
``GenerateDataKey`` and ``Decrypt``, what envelope encryption needs and nothing more; ``encrypt``
is ``GenerateDataKey`` alone (seal, never unwrap) and ``decrypt`` is ``Decrypt`` alone (unwrap,
never seal). Bucket ``write`` is put-only and ``delete`` is ``DeleteObject`` alone (on a
versioned bucket that adds a delete marker; no version is removed for good). ``invoke`` (kind
``bedrock``, key ``models``): ``InvokeModel`` and ``InvokeModelWithResponseStream`` (what Converse
and ConverseStream authorize by) on foundation models and the account's inference profiles, the
only grant on something the stack does not create: which models a stage routes to is
``llm-router.yml``'s, and it changes without a deploy."""


@dataclass(frozen=True, slots=True)
class Grant:
    """Least-privilege access of a function or role to one resource (by kind and key)."""

    kind: Literal["queue", "table", "bucket", "secret", "key", "bedrock"]
    key: str
    access: Access
    prefix: str | None = None
    """Buckets only: the grant covers the objects under this key prefix (``conformance/``) alone."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    key: str
    name: str
    handler: str
    """Dotted path of the Lambda handler (``functions.audit_writer.handler.handler``)."""
    source_dir: str
    """The function's folder, relative to the repository root."""
    memory_mb: int = 512
    timeout_s: int = 20
    triggers: tuple[QueueTrigger, ...] = ()
    schedules: tuple[ScheduleTrigger, ...] = ()
    grants: tuple[Grant, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    """Extra environment beyond the resource names every function receives."""
    bundles_config: bool = False
    """Its code asset carries the published ``llm-router.yml``, as the gateway's does, at ``$TOLLWAY_CONFIG``."""


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """An IAM role for people (or their tools), assumable from the account, with its grants.

    The trust is the account itself: who in the account may assume the role is the account's
    IAM (an SSO permission set, a user's ``sts:AssumeRole`` allowance), not the stack.
    """

    key: str
    name: str
    description: str
    grants: tuple[Grant, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    queues: tuple[QueueSpec, ...]
    tables: tuple[TableSpec, ...]
    buckets: tuple[BucketSpec, ...]
    secrets: tuple[SecretSpec, ...]
    functions: tuple[FunctionSpec, ...]
    keys: tuple[KeySpec, ...] = ()
    roles: tuple[RoleSpec, ...] = ()
    """Not created by the local bootstrap: moto does not enforce IAM."""
    log_retention_days: int = 30
    gateway: FunctionSpec = field(
        default_factory=lambda: FunctionSpec(
            "gateway", "tollway-gateway", "functions/gateway/run.sh", "functions/gateway"
        )
    )

    def queue(self, key: str) -> QueueSpec:
        return _by_key(self.queues, key)

    def table(self, key: str) -> TableSpec:
        return _by_key(self.tables, key)

    def bucket(self, key: str) -> BucketSpec:
        return _by_key(self.buckets, key)

    def secret(self, key: str) -> SecretSpec:
        return _by_key(self.secrets, key)

    def kms_key(self, key: str) -> KeySpec:
        return _by_key(self.keys, key)

    def function(self, key: str) -> FunctionSpec:
        return _by_key((self.gateway, *self.functions), key)

    def role(self, key: str) -> RoleSpec:
        return _by_key(self.roles, key)

    def environment(self, account: str, region: str) -> dict[str, str]:
        """The resource names every function (and the local runner) gets as environment.

        ``TOLLWAY_QUEUE_AUDIT`` holds the queue *name*; consumers resolve the URL once at start.
        A KMS key's variable holds its alias name.
        """
        env = {"TOLLWAY_STAGE": self.prefix}
        for q in self.queues:
            env[f"TOLLWAY_QUEUE_{_env_key(q.key)}"] = q.name
        for t in self.tables:
            env[f"TOLLWAY_TABLE_{_env_key(t.key)}"] = t.name
        for b in self.buckets:
            env[f"TOLLWAY_BUCKET_{_env_key(b.key)}"] = b.name(account, region)
        for k in self.keys:
            env[k.environment_variable] = k.alias
        return env


def _env_key(key: str) -> str:
    return key.upper().replace("-", "_")


_T = TypeVar("_T", QueueSpec, TableSpec, BucketSpec, SecretSpec, KeySpec, FunctionSpec, RoleSpec)


def _by_key(items: tuple[_T, ...], key: str) -> _T:
    for item in items:
        if item.key == key:
            return item
    raise KeyError(key)


CONFORMANCE_PREFIX: Final = "conformance/"
"""Where the conformance function writes its results in the config bucket (docs/conformance.md)."""


def conformance_function(prefix: str, schedule: str) -> FunctionSpec:
    """The scheduled provider conformance run (``functions/conformance``): it tests the bundled
    config's deployments with the gateway's credentials and writes results under
    :data:`CONFORMANCE_PREFIX` of the config bucket, the only place it may write."""
    return FunctionSpec(
        key="conformance",
        name=f"{prefix}-conformance",
        handler="functions.conformance.handler.handler",
        source_dir="functions/conformance",
        # Ten cases per (deployment, model), each bounded by its timeout; a few deployments fit.
        timeout_s=900,
        schedules=(ScheduleTrigger("conformance", schedule),),
        grants=(
            Grant("secret", "openai", "read"),
            Grant("secret", "anthropic", "read"),
            Grant("bedrock", "models", "invoke"),
            Grant("bucket", "config", "write", prefix=CONFORMANCE_PREFIX),
        ),
        bundles_config=True,
    )


def topology(prefix: str = DEFAULT_PREFIX, *, conformance_schedule: str | None = None) -> Topology:
    """Every resource of one stage. ``prefix`` is lower-case letters, digits and hyphens.

    ``conformance_schedule`` (``rate(1 day)``, ``cron(...)``) opts the stage into the scheduled
    conformance function; without it the stage has none (the CDK app's ``conformanceSchedule``
    context key sets it)."""
    if not prefix or not all(c.islower() or c.isdigit() or c == "-" for c in prefix) or len(prefix) > 20:
        raise ValueError("prefix must be 1-20 lower-case letters, digits or hyphens")
    p = prefix
    return Topology(
        prefix=p,
        queues=(
            QueueSpec("audit", f"{p}-audit-events"),
            QueueSpec("usage", f"{p}-usage-events"),
            # 6x the dataset export's 900 s timeout, as AWS advises for SQS triggers.
            QueueSpec("exports", f"{p}-export-requests", visibility_timeout_s=5400),
        ),
        tables=(
            TableSpec("audit", f"{p}-audit", indexes=(TableIndex("by-principal", "principalId", "ts"),)),
            TableSpec("usage-ledger", f"{p}-usage-ledger"),
            TableSpec("quota-leases", f"{p}-quota-leases", sort_key=None),
            TableSpec("idempotency", f"{p}-idempotency", sort_key=None, point_in_time_recovery=False),
            # session-scoped PII mappings (docs/pii-vault.md): one item per token, values
            # envelope-encrypted under the pii-vault key; TTL on expiresAt, checked on read too.
            TableSpec("pii-vault", f"{p}-pii-vault", sort_key=None),
        ),
        buckets=(
            BucketSpec("config", p, versioned=True),
            BucketSpec("pricing", p, versioned=True),
            # One rule per retention class (content/<class>/...), and the longest class's days on
            # the whole bucket as a backstop for an object outside every class prefix.
            BucketSpec(
                "content",
                p,
                expire_after_days=max(days for _, days in CONTENT_RETENTION_DAYS),
                prefix_expiry=tuple((f"content/{name}/", days) for name, days in CONTENT_RETENTION_DAYS),
            ),
            # Everything the export job writes is under exports/<exportId>/ (tollway.export.manifest),
            # so the whole-bucket rule is the exports/ rule, and it also covers a stray object.
            BucketSpec("exports", p, versioned=True, expire_after_days=365, noncurrent_expire_after_days=30),
        ),
        secrets=(
            SecretSpec("openai", f"{p}/providers/openai", "API key for OpenAI-format provider deployments"),
            SecretSpec("anthropic", f"{p}/providers/anthropic", "API key for Anthropic-format provider deployments"),
        ),
        keys=(
            KeySpec(
                "pii-vault",
                f"alias/{p}-pii-vault",
                "Wraps the data keys of the PII vault's values (docs/pii-vault.md)",
                environment_variable="TOLLWAY_PII_KMS_KEY_ID",
            ),
            KeySpec(
                "content",
                f"alias/{p}-content",
                "Wraps the data keys of captured content (docs/export.md)",
                environment_variable="TOLLWAY_CONTENT_KMS_KEY_ID",
            ),
        ),
        functions=(
            FunctionSpec(
                key="audit-writer",
                name=f"{p}-audit-writer",
                handler="functions.audit_writer.handler.handler",
                source_dir="functions/audit_writer",
                # The audit queue's 120 s visibility timeout is 6x this, as AWS advises for SQS triggers.
                timeout_s=20,
                triggers=(QueueTrigger("audit", batch_size=10, max_batching_window_s=1),),
                grants=(Grant("queue", "audit", "consume"), Grant("table", "audit", "read-write")),
            ),
            FunctionSpec(
                key="usage-reconciler",
                name=f"{p}-usage-reconciler",
                handler="functions.usage_reconciler.handler.handler",
                source_dir="functions/usage_reconciler",
                timeout_s=20,
                triggers=(QueueTrigger("usage", batch_size=10, max_batching_window_s=1),),
                grants=(Grant("queue", "usage", "consume"), Grant("table", "usage-ledger", "read-write")),
            ),
            FunctionSpec(
                key="pricing-refresh",
                name=f"{p}-pricing-refresh",
                handler="functions.pricing_refresh.handler.handler",
                source_dir="functions/pricing_refresh",
                timeout_s=60,
                schedules=(ScheduleTrigger("pricing-refresh", "rate(15 minutes)"),),
                # read-write: it reads the current pointer and checks a snapshot exists before writing.
                grants=(Grant("bucket", "pricing", "read-write"), Grant("bucket", "config", "read")),
            ),
            FunctionSpec(
                key="dataset-export",
                name=f"{p}-dataset-export",
                handler="functions.dataset_export.handler.handler",
                source_dir="functions/dataset_export",
                timeout_s=900,
                memory_mb=1024,
                # One export per invocation: a request is a long job, never batched with another.
                triggers=(QueueTrigger("exports", batch_size=1, max_batching_window_s=0),),
                # audit read: the job only Scans, but a Scan reads every item already, so GetItem
                # and Query would expose nothing more. exports read + write: it lists, reads and
                # puts shards and the manifest, never deletes. content: read and unwrap, never seal.
                grants=(
                    Grant("queue", "exports", "consume"),
                    Grant("table", "audit", "read"),
                    Grant("bucket", "content", "read"),
                    Grant("key", "content", "decrypt"),
                    Grant("bucket", "exports", "read"),
                    Grant("bucket", "exports", "write"),
                    Grant("queue", "audit", "send"),
                ),
                environment=(
                    (
                        "TOLLWAY_CONTENT_RETENTION_DAYS",
                        ",".join(f"{name}={days}" for name, days in CONTENT_RETENTION_DAYS),
                    ),
                ),
            ),
            *((conformance_function(p, conformance_schedule),) if conformance_schedule else ()),
        ),
        roles=(
            RoleSpec(
                "auditor",
                f"{p}-auditor",
                "Reads the audit trail and the dataset exports",
                grants=(Grant("table", "audit", "read"), Grant("bucket", "exports", "read")),
            ),
            # read on content: HeadObject (did the object exist?) needs s3:GetObject. The deletion
            # evidence goes through the audit queue, so the audit trail records who deleted what.
            RoleSpec(
                "content-deleter",
                f"{p}-content-deleter",
                "Deletes captured content and records the deletion in the audit trail",
                grants=(
                    Grant("bucket", "content", "delete"),
                    Grant("bucket", "content", "read"),
                    Grant("table", "audit", "read"),
                    Grant("queue", "audit", "send"),
                ),
            ),
            RoleSpec(
                "export-requester",
                f"{p}-export-requester",
                "Requests dataset exports and reads their results",
                grants=(Grant("queue", "exports", "send"), Grant("bucket", "exports", "read")),
            ),
        ),
        gateway=FunctionSpec(
            key="gateway",
            name=f"{p}-gateway",
            handler="functions/gateway/run.sh",
            source_dir="functions/gateway",
            memory_mb=1024,
            timeout_s=300,
            grants=(
                Grant("secret", "openai", "read"),
                Grant("secret", "anthropic", "read"),
                Grant("queue", "audit", "send"),
                Grant("queue", "usage", "send"),
                Grant("table", "quota-leases", "read-write"),
                Grant("table", "usage-ledger", "read"),
                Grant("table", "idempotency", "read-write"),
                Grant("table", "pii-vault", "item-read-write"),
                Grant("key", "pii-vault", "envelope"),
                Grant("bucket", "config", "read"),
                Grant("bucket", "pricing", "read"),
                # Capture only puts content (sealed with a fresh data key: GenerateDataKey, never
                # Decrypt); reading it back or exporting it is the export function's and the roles'.
                Grant("bucket", "content", "write"),
                Grant("key", "content", "encrypt"),
                # Bedrock routes (type: bedrock) are signed with this role's credentials.
                Grant("bedrock", "models", "invoke"),
            ),
        ),
    )
