"""The one source of truth for Tollway's cloud resources: names and settings, no cloud SDK.

The CDK app (``infra/``) builds its stack from :func:`topology`, and the local cloud bootstrap
(``tollway.cloud.bootstrap``) creates the same queues, tables, buckets, KMS keys and secrets on
moto server or LocalStack from it. ``tests/infra`` proves the synthesized template and the spec agree.

Every name derives from one ``prefix`` (the stage), so two stages can share an account. Bucket
names must be globally unique on AWS, so they also carry the account and region; the CDK app
passes CloudFormation tokens there, the local bootstrap the emulator's account.

Worker functions (audit writer, usage reconciler, pricing refresh, dataset export) are added to
:data:`FUNCTIONS` by the issues that build them, with their triggers and grants; the local
event-source runner serves whatever is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

__all__ = [
    "DEFAULT_PREFIX",
    "BucketSpec",
    "FunctionSpec",
    "Grant",
    "KeySpec",
    "QueueSpec",
    "QueueTrigger",
    "ScheduleTrigger",
    "SecretSpec",
    "TableIndex",
    "TableSpec",
    "Topology",
    "topology",
]

DEFAULT_PREFIX: Final = "tollway"
DAY_S: Final = 86_400


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
    """An S3 bucket: encrypted, public access blocked, TLS only."""

    key: str
    prefix: str
    versioned: bool = False
    expire_after_days: int | None = None

    def name(self, account: str, region: str) -> str:
        return f"{self.prefix}-{self.key}-{account}-{region}"


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


Access = Literal["read", "write", "read-write", "item-read-write", "consume", "send", "envelope"]
"""``item-read-write`` (tables): ``GetItem``, ``PutItem`` and ``UpdateItem`` only, no ``Query``,
``Scan``, batch, delete or export: one item at a time, by its key. ``envelope`` (KMS keys):
``GenerateDataKey`` and ``Decrypt``, what envelope encryption needs and nothing more."""


@dataclass(frozen=True, slots=True)
class Grant:
    """Least-privilege access of a function to one resource (by kind and key)."""

    kind: Literal["queue", "table", "bucket", "secret", "key"]
    key: str
    access: Access


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


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    queues: tuple[QueueSpec, ...]
    tables: tuple[TableSpec, ...]
    buckets: tuple[BucketSpec, ...]
    secrets: tuple[SecretSpec, ...]
    functions: tuple[FunctionSpec, ...]
    keys: tuple[KeySpec, ...] = ()
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


_T = TypeVar("_T", QueueSpec, TableSpec, BucketSpec, SecretSpec, KeySpec, FunctionSpec)


def _by_key(items: tuple[_T, ...], key: str) -> _T:
    for item in items:
        if item.key == key:
            return item
    raise KeyError(key)


def topology(prefix: str = DEFAULT_PREFIX) -> Topology:
    """Every resource of one stage. ``prefix`` is lower-case letters, digits and hyphens."""
    if not prefix or not all(c.islower() or c.isdigit() or c == "-" for c in prefix) or len(prefix) > 20:
        raise ValueError("prefix must be 1-20 lower-case letters, digits or hyphens")
    p = prefix
    return Topology(
        prefix=p,
        queues=(
            QueueSpec("audit", f"{p}-audit-events"),
            QueueSpec("usage", f"{p}-usage-events"),
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
            BucketSpec("content", p, expire_after_days=30),
            BucketSpec("exports", p, versioned=True),
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
                Grant("bucket", "content", "read-write"),
            ),
        ),
    )
