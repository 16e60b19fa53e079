"""Create a :class:`~tollway.cloud.resources.Topology` on a local cloud, idempotently, and read it back.

:func:`bootstrap` makes the endpoint (moto server, LocalStack) hold what the topology declares,
converging whatever already exists: a second run changes nothing and reports every resource
``unchanged``. :func:`describe` reads the actual state back in one normalized shape, and
:func:`expected_state` renders a topology in that same shape, so "the cloud matches the spec"
is one ``==`` (and "the CDK template matches" is one more renderer of the shape)::

    {
      "queues": {"<key>": {"name": str, "visibility_timeout_s": int, "retention_s": int,
                           "max_receive_count": int | None, "dlq_name": str | None,
                           "dlq_retention_s": int | None} | None},
      "tables": {"<key>": {"name": str, "billing_mode": "PAY_PER_REQUEST" | "PROVISIONED",
                           "partition_key": str, "sort_key": str | None,
                           "attribute_types": {"<attribute>": "S" | "N" | "B"},
                           "indexes": [{"name": str, "partition_key": str, "sort_key": str | None,
                                        "projection": "ALL" | ...}],   # sorted by name
                           "ttl_attribute": str | None,
                           "point_in_time_recovery": bool | None} | None},  # None: not supported
      "buckets": {"<key>": {"name": str, "encryption": "AES256" | "aws:kms" | None,
                            "public_access_blocked": bool, "versioned": bool,
                            "expire_after_days": int | None} | None},
      "lifecycle": {"<bucket key>": [{"prefix": str | None, "expire_after_days": int | None,
                                      "noncurrent_expire_after_days": int | None}] | None},
      "keys": {"<key>": {"alias": str, "description": str, "key_usage": "ENCRYPT_DECRYPT" | ...,
                         "key_spec": "SYMMETRIC_DEFAULT" | ..., "enabled": bool,
                         "rotation": bool} | None},
      "secrets": {"<key>": {"name": str} | None},
    }

Keys are the spec's logical keys; ``None`` means the resource does not exist. The queue and
table fields are named after the :class:`~tollway.cloud.resources.QueueSpec` and
:class:`~tollway.cloud.resources.TableSpec` fields they come from. A KMS key is found by its
alias; a key with another usage or spec, or one pending deletion, is a conflict the bootstrap
reports rather than replaces (a new key could not decrypt what the old one wrapped).

A bucket's ``expire_after_days`` is its whole-bucket rule's. ``lifecycle`` lists every enabled
rule of each bucket, the whole-bucket one (prefix ``""``) and one per prefix, sorted by prefix
and described by what it does, not by its id (a rule filtered on anything but a prefix shows
prefix ``None``), so the rules CloudFormation made and those the bootstrap put compare equal. It
is a section of its own, beside ``buckets``, so a renderer of the bucket fields alone still
compares.

Three deliberate differences from the CDK stack: buckets get no TLS-only bucket policy (moto
enforces ``aws:SecureTransport`` and would deny every request to its plain-HTTP endpoint),
secrets are created only when a value is given (the CDK stack only references them), and the
topology's ``roles`` are not created (moto does not enforce IAM, so a role would prove nothing).

Errors are :class:`BootstrapError` and name the resource and the endpoint, never a secret value.
boto3 is imported here, inside functions: this module is never on the gateway's import path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

from tollway.aws import endpoint_url
from tollway.cloud.local import LOCAL_CREDENTIALS
from tollway.cloud.resources import BucketSpec, KeySpec, QueueSpec, SecretSpec, TableSpec, Topology, expiry_rule_id
from tollway.exceptions import TollwayError

__all__ = [
    "BootstrapError",
    "BootstrapReport",
    "Clients",
    "ResourceChange",
    "bootstrap",
    "boto_errors",
    "describe",
    "expected_state",
]

Action = Literal["created", "updated", "unchanged", "absent"]
Kind = Literal["queue", "dlq", "table", "bucket", "key", "secret"]

_WAIT_S: Final = 60.0
"""Upper bound on waiting for a table or index to become ACTIVE (instant on moto)."""
_PITR_UNSUPPORTED: Final = frozenset({"UnknownOperationException", "NotImplemented", "InternalFailure"})
_NOT_FOUND_QUEUE: Final = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


class BootstrapError(TollwayError, RuntimeError):
    """A resource could not be created, converged or read; the message names it and the endpoint."""


class _Conflict(Exception):
    """A state the bootstrap cannot converge; :func:`boto_errors` adds the resource and the endpoint."""


@dataclass(frozen=True, slots=True)
class ResourceChange:
    kind: Kind
    key: str
    name: str
    action: Action
    """``absent``: a secret with no value given and none on the endpoint."""
    notes: tuple[str, ...] = ()
    """What the emulator could not do (for example point-in-time recovery), or what changed."""


@dataclass(frozen=True, slots=True)
class BootstrapReport:
    endpoint: str
    region: str
    account: str
    changes: tuple[ResourceChange, ...]

    @property
    def changed(self) -> bool:
        return any(c.action in ("created", "updated") for c in self.changes)

    @property
    def missing_secrets(self) -> tuple[str, ...]:
        """Keys of secrets that do not exist: give their values to create them."""
        return tuple(c.key for c in self.changes if c.kind == "secret" and c.action == "absent")

    def summary(self) -> str:
        lines = [f"bootstrap of {self.endpoint} ({self.region}, account {self.account}):"]
        for c in self.changes:
            notes = f" ({'; '.join(c.notes)})" if c.notes else ""
            lines.append(f"  {c.kind:<6} {c.name:<48} {c.action}{notes}")
        return "\n".join(lines)


class Clients:
    """boto3 clients for one endpoint, with explicit credentials (never the default chain).

    ``env`` is the local cloud's environment (:meth:`tollway.cloud.local.LocalCloud.env`, which
    keeps the caller's keys only for an external emulator): its ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` are used, the dummy local credentials otherwise. Nothing falls back
    to boto3's credential chain, so no lookup reaches a profile or an instance metadata service.
    """

    def __init__(self, endpoint: str, region: str, env: Mapping[str, str] | None = None) -> None:
        import boto3
        from botocore.config import Config

        creds = {**LOCAL_CREDENTIALS, **{k: v for k, v in (env or {}).items() if k in LOCAL_CREDENTIALS and v}}
        self.endpoint = endpoint.rstrip("/")
        self.region = region
        self._session = boto3.session.Session(
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
            region_name=region,
        )
        self._config = Config(
            connect_timeout=5,
            read_timeout=30,  # above SQS's 20 s long-poll maximum
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"},
        )
        self._clients: dict[str, Any] = {}
        self._account: str | None = None

    def client(self, service: str) -> Any:
        if service not in self._clients:
            # ``endpoint_url`` leaves a service-specific AWS_ENDPOINT_URL_<SERVICE> in force.
            endpoint = endpoint_url(self.endpoint)
            self._clients[service] = self._session.client(service, endpoint_url=endpoint, config=self._config)
        return self._clients[service]

    def account(self) -> str:
        """The endpoint's account id (STS GetCallerIdentity), fetched once."""
        if self._account is None:
            with boto_errors("caller identity", "(STS)", self.endpoint):
                self._account = str(self.client("sts").get_caller_identity()["Account"])
        return self._account


@contextmanager
def boto_errors(kind: str, name: str, endpoint: str) -> Iterator[None]:
    """Map botocore errors to :class:`BootstrapError` naming the resource and endpoint, dropping the cause.

    The cause is dropped on purpose: a parameter-validation error can quote a parameter value,
    and for a secret that value is the secret.
    """
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

    try:
        yield
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise BootstrapError(
            f"{kind} {name} on {endpoint}: {err.get('Code', '?')}: {err.get('Message', '')}".rstrip(": ")
        ) from None
    except (_Conflict, TimeoutError) as exc:
        raise BootstrapError(f"{kind} {name} on {endpoint}: {exc}") from None
    except ParamValidationError:
        raise BootstrapError(f"{kind} {name} on {endpoint}: invalid request parameters") from None
    except BotoCoreError as exc:
        raise BootstrapError(f"{kind} {name} on {endpoint}: {type(exc).__name__}: {exc}") from None


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _get_or_none(call: Any, missing: frozenset[str], **kwargs: Any) -> dict[str, Any] | None:
    """A read whose "does not exist" or "not configured" error codes mean ``None``."""
    from botocore.exceptions import ClientError

    try:
        result: dict[str, Any] = call(**kwargs)
    except ClientError as exc:
        if _code(exc) in missing:
            return None
        raise
    return result


# ---------------------------------------------------------------- queues


def _queue_url(sqs: Any, name: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        return str(sqs.get_queue_url(QueueName=name)["QueueUrl"])
    except ClientError as exc:
        if _code(exc) in _NOT_FOUND_QUEUE:
            return None
        raise


def _same_queue_attribute(key: str, current: str | None, desired: str) -> bool:
    if current is None:
        return False
    if key == "RedrivePolicy":
        cur, want = json.loads(current), json.loads(desired)
        return bool(
            cur.get("deadLetterTargetArn") == want["deadLetterTargetArn"]
            and int(cur.get("maxReceiveCount", -1)) == int(want["maxReceiveCount"])
        )
    return current == desired


def _ensure_queue(sqs: Any, name: str, attributes: dict[str, str]) -> tuple[Action, str, tuple[str, ...]]:
    """Create or converge one queue; returns the action, its ARN and the attributes changed."""
    url = _queue_url(sqs, name)
    if url is None:
        url = str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])
        action: Action = "created"
        changed: tuple[str, ...] = ()
    else:
        current = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        diff = {k: v for k, v in attributes.items() if not _same_queue_attribute(k, current.get(k), v)}
        if diff:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=diff)
        action, changed = ("updated" if diff else "unchanged"), tuple(sorted(diff))
    arn = str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
    return action, arn, changed


def _bootstrap_queue(clients: Clients, spec: QueueSpec) -> list[ResourceChange]:
    sqs = clients.client("sqs")
    with boto_errors("queue", spec.dlq_name, clients.endpoint):
        dlq_action, dlq_arn, dlq_changed = _ensure_queue(
            sqs, spec.dlq_name, {"MessageRetentionPeriod": str(spec.dlq_retention_s)}
        )
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": spec.max_receive_count})
    with boto_errors("queue", spec.name, clients.endpoint):
        action, _, changed = _ensure_queue(
            sqs,
            spec.name,
            {
                "VisibilityTimeout": str(spec.visibility_timeout_s),
                "MessageRetentionPeriod": str(spec.retention_s),
                "RedrivePolicy": redrive,
            },
        )
    return [
        ResourceChange("dlq", spec.key, spec.dlq_name, dlq_action, dlq_changed),
        ResourceChange("queue", spec.key, spec.name, action, changed),
    ]


def _describe_queue(clients: Clients, spec: QueueSpec) -> dict[str, Any] | None:
    sqs = clients.client("sqs")
    with boto_errors("queue", spec.name, clients.endpoint):
        url = _queue_url(sqs, spec.name)
        if url is None:
            return None
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        redrive = json.loads(attrs["RedrivePolicy"]) if attrs.get("RedrivePolicy") else None
        dlq_name = dlq_retention = None
        if redrive is not None:
            dlq_name = str(redrive["deadLetterTargetArn"]).rsplit(":", 1)[-1]
            dlq_url = _queue_url(sqs, dlq_name)
            if dlq_url is not None:
                dlq_attrs = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["MessageRetentionPeriod"])
                dlq_retention = int(dlq_attrs["Attributes"]["MessageRetentionPeriod"])
    return {
        "name": spec.name,
        "visibility_timeout_s": int(attrs["VisibilityTimeout"]),
        "retention_s": int(attrs["MessageRetentionPeriod"]),
        "max_receive_count": int(redrive["maxReceiveCount"]) if redrive is not None else None,
        "dlq_name": dlq_name,
        "dlq_retention_s": dlq_retention,
    }


def _expected_queue(spec: QueueSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "visibility_timeout_s": spec.visibility_timeout_s,
        "retention_s": spec.retention_s,
        "max_receive_count": spec.max_receive_count,
        "dlq_name": spec.dlq_name,
        "dlq_retention_s": spec.dlq_retention_s,
    }


# ---------------------------------------------------------------- tables


def _key_schema(partition_key: str, sort_key: str | None) -> list[dict[str, str]]:
    schema = [{"AttributeName": partition_key, "KeyType": "HASH"}]
    if sort_key is not None:
        schema.append({"AttributeName": sort_key, "KeyType": "RANGE"})
    return schema


def _attribute_definitions(spec: TableSpec) -> list[dict[str, str]]:
    """Every key attribute of the table and its indexes: all strings, as the spec says."""
    names = [spec.partition_key, spec.sort_key]
    for index in spec.indexes:
        names += [index.partition_key, index.sort_key]
    unique = dict.fromkeys(n for n in names if n is not None)
    return [{"AttributeName": n, "AttributeType": "S"} for n in unique]


def _gsi(index_name: str, partition_key: str, sort_key: str | None) -> dict[str, Any]:
    return {
        "IndexName": index_name,
        "KeySchema": _key_schema(partition_key, sort_key),
        "Projection": {"ProjectionType": "ALL"},
    }


def _describe_table_raw(ddb: Any, name: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        table: dict[str, Any] = ddb.describe_table(TableName=name)["Table"]
    except ClientError as exc:
        if _code(exc) == "ResourceNotFoundException":
            return None
        raise
    return table


def _wait_table_idle(ddb: Any, name: str) -> dict[str, Any]:
    """Wait (bounded) until the table and all its indexes are ACTIVE: DynamoDB takes one change at a time."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        table = _describe_table_raw(ddb, name)
        if table is not None and table.get("TableStatus") == "ACTIVE":
            if all(i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in table.get("GlobalSecondaryIndexes", [])):
                return table
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ACTIVE after {_WAIT_S:.0f} s")
        time.sleep(0.2)


def _converge_table(ddb: Any, spec: TableSpec, table: dict[str, Any]) -> list[str]:
    """Bring an existing table to the spec where DynamoDB allows it; a different key schema is an error."""
    keys = {k["KeyType"]: k["AttributeName"] for k in table["KeySchema"]}
    if (keys.get("HASH"), keys.get("RANGE")) != (spec.partition_key, spec.sort_key):
        raise _Conflict(
            f"key schema {keys} differs from the spec ({spec.partition_key}, {spec.sort_key});"
            " DynamoDB cannot change it: delete the table"
        )
    changed: list[str] = []
    mode = table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED")
    if mode != "PAY_PER_REQUEST":
        ddb.update_table(TableName=spec.name, BillingMode="PAY_PER_REQUEST")
        changed.append("billing mode")
        _wait_table_idle(ddb, spec.name)
    current = {i["IndexName"] for i in table.get("GlobalSecondaryIndexes", [])}
    wanted = {i.name: i for i in spec.indexes}
    for name in sorted(current - wanted.keys()):
        ddb.update_table(TableName=spec.name, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": name}}])
        changed.append(f"index {name} deleted")
        _wait_table_idle(ddb, spec.name)
    for name in sorted(wanted.keys() - current):
        index = wanted[name]
        ddb.update_table(
            TableName=spec.name,
            # The full set, not just the new index's keys: moto replaces the definitions it is sent.
            AttributeDefinitions=_attribute_definitions(spec),
            GlobalSecondaryIndexUpdates=[{"Create": _gsi(index.name, index.partition_key, index.sort_key)}],
        )
        changed.append(f"index {name} created")
        _wait_table_idle(ddb, spec.name)
    return changed


def _converge_ttl(ddb: Any, spec: TableSpec) -> list[str]:
    ttl = ddb.describe_time_to_live(TableName=spec.name)["TimeToLiveDescription"]
    enabled = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
    current = ttl.get("AttributeName") if enabled else None
    if current == spec.ttl_attribute:
        return []
    if current is not None:
        ddb.update_time_to_live(
            TableName=spec.name, TimeToLiveSpecification={"Enabled": False, "AttributeName": current}
        )
    if spec.ttl_attribute is not None:
        ddb.update_time_to_live(
            TableName=spec.name, TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute}
        )
    return ["ttl"]


def _pitr_enabled(ddb: Any, name: str) -> bool | None:
    """Point-in-time recovery status, or ``None`` when the emulator does not implement it."""
    from botocore.exceptions import ClientError

    try:
        backups = ddb.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
    except ClientError as exc:
        if _code(exc) in _PITR_UNSUPPORTED:
            return None
        raise
    status = backups.get("PointInTimeRecoveryDescription", {}).get("PointInTimeRecoveryStatus")
    return bool(status == "ENABLED")


def _converge_pitr(ddb: Any, spec: TableSpec) -> tuple[list[str], list[str]]:
    """Returns (changes, notes); an emulator without PITR gets a note, not an error."""
    current = _pitr_enabled(ddb, spec.name)
    if current is None:
        return [], ["point-in-time recovery not supported by this endpoint"]
    if current == spec.point_in_time_recovery:
        return [], []
    ddb.update_continuous_backups(
        TableName=spec.name,
        PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": spec.point_in_time_recovery},
    )
    return ["point-in-time recovery"], []


def _bootstrap_table(clients: Clients, spec: TableSpec) -> ResourceChange:
    ddb = clients.client("dynamodb")
    with boto_errors("table", spec.name, clients.endpoint):
        table = _describe_table_raw(ddb, spec.name)
        if table is None:
            request: dict[str, Any] = {
                "TableName": spec.name,
                "BillingMode": "PAY_PER_REQUEST",
                "AttributeDefinitions": _attribute_definitions(spec),
                "KeySchema": _key_schema(spec.partition_key, spec.sort_key),
            }
            if spec.indexes:
                request["GlobalSecondaryIndexes"] = [_gsi(i.name, i.partition_key, i.sort_key) for i in spec.indexes]
            ddb.create_table(**request)
            changed: list[str] = []
        else:
            changed = _converge_table(ddb, spec, table)
        _wait_table_idle(ddb, spec.name)
        changed += _converge_ttl(ddb, spec)
        pitr_changed, notes = _converge_pitr(ddb, spec)
        changed += pitr_changed
    action: Action = "created" if table is None else ("updated" if changed else "unchanged")
    return ResourceChange("table", spec.key, spec.name, action, tuple(notes if table is None else changed + notes))


def _index_shape(index: Mapping[str, Any]) -> dict[str, Any]:
    keys = {k["KeyType"]: k["AttributeName"] for k in index["KeySchema"]}
    return {
        "name": index["IndexName"],
        "partition_key": keys["HASH"],
        "sort_key": keys.get("RANGE"),
        "projection": index.get("Projection", {}).get("ProjectionType"),
    }


def _describe_table(clients: Clients, spec: TableSpec) -> dict[str, Any] | None:
    ddb = clients.client("dynamodb")
    with boto_errors("table", spec.name, clients.endpoint):
        table = _describe_table_raw(ddb, spec.name)
        if table is None:
            return None
        ttl = ddb.describe_time_to_live(TableName=spec.name)["TimeToLiveDescription"]
        pitr = _pitr_enabled(ddb, spec.name)
    keys = {k["KeyType"]: k["AttributeName"] for k in table["KeySchema"]}
    return {
        "name": spec.name,
        "billing_mode": table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED"),
        "partition_key": keys["HASH"],
        "sort_key": keys.get("RANGE"),
        "attribute_types": {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]},
        "indexes": sorted((_index_shape(i) for i in table.get("GlobalSecondaryIndexes", [])), key=lambda i: i["name"]),
        "ttl_attribute": ttl.get("AttributeName") if ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING") else None,
        "point_in_time_recovery": pitr,
    }


def _expected_table(spec: TableSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "billing_mode": "PAY_PER_REQUEST",
        "partition_key": spec.partition_key,
        "sort_key": spec.sort_key,
        "attribute_types": {a["AttributeName"]: a["AttributeType"] for a in _attribute_definitions(spec)},
        "indexes": sorted(
            (_index_shape(_gsi(i.name, i.partition_key, i.sort_key)) for i in spec.indexes), key=lambda i: i["name"]
        ),
        "ttl_attribute": spec.ttl_attribute,
        "point_in_time_recovery": spec.point_in_time_recovery,
    }


# ---------------------------------------------------------------- buckets

_PUBLIC_ACCESS_BLOCK: Final = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}


def _bucket_exists(s3: Any, name: str) -> bool:
    return _get_or_none(s3.head_bucket, frozenset({"404", "NoSuchBucket", "NotFound"}), Bucket=name) is not None


def _encryption(s3: Any, name: str) -> str | None:
    got = _get_or_none(
        s3.get_bucket_encryption, frozenset({"ServerSideEncryptionConfigurationNotFoundError"}), Bucket=name
    )
    rules = (got or {}).get("ServerSideEncryptionConfiguration", {}).get("Rules", [])
    algorithms = [r.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm") for r in rules]
    return next((str(a) for a in algorithms if a), None)


def _public_access_blocked(s3: Any, name: str) -> bool:
    got = _get_or_none(s3.get_public_access_block, frozenset({"NoSuchPublicAccessBlockConfiguration"}), Bucket=name)
    return got is not None and all(got["PublicAccessBlockConfiguration"].get(k) for k in _PUBLIC_ACCESS_BLOCK)


def _versioned(s3: Any, name: str) -> bool:
    return bool(s3.get_bucket_versioning(Bucket=name).get("Status") == "Enabled")


def _lifecycle_rules(s3: Any, name: str) -> list[dict[str, Any]]:
    got = _get_or_none(s3.get_bucket_lifecycle_configuration, frozenset({"NoSuchLifecycleConfiguration"}), Bucket=name)
    return list((got or {}).get("Rules", []))


def _rule_prefix(rule: Mapping[str, Any]) -> str | None:
    """The rule's key prefix (``""``: the whole bucket); ``None`` when it filters on anything else."""
    rule_filter = rule.get("Filter")
    if rule_filter is None:
        return str(rule.get("Prefix", ""))
    if set(rule_filter) <= {"Prefix"}:
        return str(rule_filter.get("Prefix", ""))
    return None


def _lifecycle(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The enabled rules in the shape of the module docstring, sorted by prefix."""
    shaped = [
        {
            "prefix": _rule_prefix(rule),
            "expire_after_days": rule.get("Expiration", {}).get("Days"),
            "noncurrent_expire_after_days": rule.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays"),
        }
        for rule in rules
        if rule.get("Status") == "Enabled"
    ]
    return sorted(shaped, key=lambda r: (r["prefix"] is None, r["prefix"] or ""))


def _expiry_days(lifecycle: list[dict[str, Any]]) -> int | None:
    """The expiry of every object: the whole-bucket rule's."""
    return next((r["expire_after_days"] for r in lifecycle if r["prefix"] == "" and r["expire_after_days"]), None)


def _expected_lifecycle(spec: BucketSpec) -> list[dict[str, Any]]:
    rules = [
        {"prefix": prefix, "expire_after_days": days, "noncurrent_expire_after_days": None}
        for prefix, days in spec.prefix_expiry
    ]
    if spec.expire_after_days is not None or spec.noncurrent_expire_after_days is not None:
        whole = {
            "prefix": "",
            "expire_after_days": spec.expire_after_days,
            "noncurrent_expire_after_days": spec.noncurrent_expire_after_days,
        }
        rules.append(whole)
    return sorted(rules, key=lambda r: str(r["prefix"]))


def _lifecycle_rule(rule_id: str, shape: Mapping[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = {"ID": rule_id, "Status": "Enabled", "Filter": {"Prefix": shape["prefix"]}}
    if shape["expire_after_days"] is not None:
        rule["Expiration"] = {"Days": shape["expire_after_days"]}
    if shape["noncurrent_expire_after_days"] is not None:
        rule["NoncurrentVersionExpiration"] = {"NoncurrentDays": shape["noncurrent_expire_after_days"]}
    return rule


def _converge_bucket(s3: Any, name: str, spec: BucketSpec) -> list[str]:
    changed: list[str] = []
    if _encryption(s3, name) != "AES256":
        s3.put_bucket_encryption(
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
        )
        changed.append("encryption")
    if not _public_access_blocked(s3, name):
        s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=_PUBLIC_ACCESS_BLOCK)
        changed.append("public access block")
    status = s3.get_bucket_versioning(Bucket=name).get("Status")
    if spec.versioned and status != "Enabled":
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        changed.append("versioning")
    elif not spec.versioned and status == "Enabled":
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Suspended"})
        changed.append("versioning")
    rules = _lifecycle_rules(s3, name)
    wanted = _expected_lifecycle(spec)
    if not wanted and rules:
        s3.delete_bucket_lifecycle(Bucket=name)
        changed.append("lifecycle")
    elif wanted and _lifecycle(rules) != wanted:
        configuration = {"Rules": [_lifecycle_rule(expiry_rule_id(str(r["prefix"])), r) for r in wanted]}
        s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration=configuration)
        changed.append("lifecycle")
    return changed


def _bootstrap_bucket(clients: Clients, spec: BucketSpec, account: str) -> ResourceChange:
    s3 = clients.client("s3")
    name = spec.name(account, clients.region)
    with boto_errors("bucket", name, clients.endpoint):
        existed = _bucket_exists(s3, name)
        if not existed:
            request: dict[str, Any] = {"Bucket": name}
            if clients.region != "us-east-1":
                request["CreateBucketConfiguration"] = {"LocationConstraint": clients.region}
            s3.create_bucket(**request)
        changed = _converge_bucket(s3, name, spec)
    action: Action = "unchanged" if existed and not changed else ("updated" if existed else "created")
    return ResourceChange("bucket", spec.key, name, action, tuple(changed) if existed else ())


def _describe_bucket(
    clients: Clients, spec: BucketSpec, account: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    """The bucket's entry and its lifecycle rules (``None`` and ``None`` when it does not exist)."""
    s3 = clients.client("s3")
    name = spec.name(account, clients.region)
    with boto_errors("bucket", name, clients.endpoint):
        if not _bucket_exists(s3, name):
            return None, None
        lifecycle = _lifecycle(_lifecycle_rules(s3, name))
        bucket = {
            "name": name,
            "encryption": _encryption(s3, name),
            "public_access_blocked": _public_access_blocked(s3, name),
            "versioned": _versioned(s3, name),
            "expire_after_days": _expiry_days(lifecycle),
        }
    return bucket, lifecycle


def _expected_bucket(spec: BucketSpec, account: str, region: str) -> dict[str, Any]:
    return {
        "name": spec.name(account, region),
        "encryption": "AES256",
        "public_access_blocked": True,
        "versioned": spec.versioned,
        "expire_after_days": spec.expire_after_days,
    }


# ---------------------------------------------------------------- KMS keys

_KEY_USAGE: Final = "ENCRYPT_DECRYPT"
_KEY_SPEC: Final = "SYMMETRIC_DEFAULT"


def _key_metadata(kms: Any, alias: str) -> dict[str, Any] | None:
    found = _get_or_none(kms.describe_key, frozenset({"NotFoundException"}), KeyId=alias)
    return None if found is None else dict(found["KeyMetadata"])


def _key_spec_of(meta: Mapping[str, Any]) -> str:
    return str(meta.get("KeySpec") or meta.get("CustomerMasterKeySpec") or _KEY_SPEC)


def _bootstrap_key(clients: Clients, spec: KeySpec) -> ResourceChange:
    kms = clients.client("kms")
    with boto_errors("key", spec.alias, clients.endpoint):
        meta = _key_metadata(kms, spec.alias)
        created = meta is None
        changed: list[str] = []
        if meta is None:
            meta = kms.create_key(Description=spec.description, KeyUsage=_KEY_USAGE, KeySpec=_KEY_SPEC)["KeyMetadata"]
            kms.create_alias(AliasName=spec.alias, TargetKeyId=meta["KeyId"])
        else:
            if meta.get("KeyState") == "PendingDeletion":
                raise _Conflict("the key is pending deletion; cancel the deletion (CancelKeyDeletion) first")
            if meta.get("KeyUsage") != _KEY_USAGE or _key_spec_of(meta) != _KEY_SPEC:
                raise _Conflict(f"the alias names a {meta.get('KeyUsage')} {_key_spec_of(meta)} key, not {_KEY_USAGE}")
            if not meta.get("Enabled", False):
                kms.enable_key(KeyId=meta["KeyId"])
                changed.append("enabled")
            if meta.get("Description", "") != spec.description:
                kms.update_key_description(KeyId=meta["KeyId"], Description=spec.description)
                changed.append("description")
        rotation = bool(kms.get_key_rotation_status(KeyId=meta["KeyId"]).get("KeyRotationEnabled"))
        if rotation != spec.rotation:
            (kms.enable_key_rotation if spec.rotation else kms.disable_key_rotation)(KeyId=meta["KeyId"])
            changed.append("rotation")
    if created:
        return ResourceChange("key", spec.key, spec.alias, "created")
    return ResourceChange("key", spec.key, spec.alias, "updated" if changed else "unchanged", tuple(changed))


def _describe_key(clients: Clients, spec: KeySpec) -> dict[str, Any] | None:
    kms = clients.client("kms")
    with boto_errors("key", spec.alias, clients.endpoint):
        meta = _key_metadata(kms, spec.alias)
        if meta is None or meta.get("KeyState") == "PendingDeletion":
            return None
        rotation = bool(kms.get_key_rotation_status(KeyId=meta["KeyId"]).get("KeyRotationEnabled"))
    return {
        "alias": spec.alias,
        "description": str(meta.get("Description", "")),
        "key_usage": str(meta.get("KeyUsage")),
        "key_spec": _key_spec_of(meta),
        "enabled": bool(meta.get("Enabled", False)),
        "rotation": rotation,
    }


def _expected_key(spec: KeySpec) -> dict[str, Any]:
    return {
        "alias": spec.alias,
        "description": spec.description,
        "key_usage": _KEY_USAGE,
        "key_spec": _KEY_SPEC,
        "enabled": True,
        "rotation": spec.rotation,
    }


# ---------------------------------------------------------------- secrets


def _secret_description(sm: Any, name: str) -> dict[str, Any] | None:
    return _get_or_none(sm.describe_secret, frozenset({"ResourceNotFoundException"}), SecretId=name)


def _secret_value(sm: Any, name: str) -> str | None:
    got = _get_or_none(sm.get_secret_value, frozenset({"ResourceNotFoundException"}), SecretId=name)
    return None if got is None or "SecretString" not in got else str(got["SecretString"])


def _bootstrap_secret(clients: Clients, spec: SecretSpec, value: str | None) -> ResourceChange:
    sm = clients.client("secretsmanager")
    with boto_errors("secret", spec.name, clients.endpoint):
        existing = _secret_description(sm, spec.name)
        if existing is None:
            if value is None:
                return ResourceChange("secret", spec.key, spec.name, "absent", ("no value given",))
            sm.create_secret(Name=spec.name, Description=spec.description, SecretString=value)
            return ResourceChange("secret", spec.key, spec.name, "created")
        changed: list[str] = []
        if existing.get("Description") != spec.description:
            sm.update_secret(SecretId=spec.name, Description=spec.description)
            changed.append("description")
        if value is not None and _secret_value(sm, spec.name) != value:
            sm.put_secret_value(SecretId=spec.name, SecretString=value)
            changed.append("value")
    return ResourceChange("secret", spec.key, spec.name, "updated" if changed else "unchanged", tuple(changed))


def _describe_secret(clients: Clients, spec: SecretSpec) -> dict[str, Any] | None:
    with boto_errors("secret", spec.name, clients.endpoint):
        found = _secret_description(clients.client("secretsmanager"), spec.name)
    return None if found is None else {"name": spec.name}


# ---------------------------------------------------------------- public API


def bootstrap(
    topo: Topology,
    *,
    endpoint: str,
    region: str,
    secrets: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> BootstrapReport:
    """Create or converge every queue, table, bucket, KMS key and secret of ``topo`` on ``endpoint``.

    ``secrets`` maps a :class:`~tollway.cloud.resources.SecretSpec` key (``openai``) to the value
    to store, e.g. the mock provider key for local runs; secrets without a value are left as they
    are and, when missing, reported ``absent``. ``env``: see :class:`Clients`.
    """
    values = dict(secrets or {})
    unknown = sorted(values.keys() - {s.key for s in topo.secrets})
    if unknown:
        raise BootstrapError(f"unknown secret keys {unknown}; the topology has {[s.key for s in topo.secrets]}")
    if not all(isinstance(v, str) and v for v in values.values()):
        raise BootstrapError(f"secret values must be non-empty strings (keys {sorted(values)})")
    clients = Clients(endpoint, region, env)
    account = clients.account()
    changes: list[ResourceChange] = []
    for queue in topo.queues:
        changes += _bootstrap_queue(clients, queue)
    changes += [_bootstrap_table(clients, t) for t in topo.tables]
    changes += [_bootstrap_bucket(clients, b, account) for b in topo.buckets]
    changes += [_bootstrap_key(clients, k) for k in topo.keys]
    changes += [_bootstrap_secret(clients, s, values.get(s.key)) for s in topo.secrets]
    return BootstrapReport(clients.endpoint, region, account, tuple(changes))


def describe(topo: Topology, *, endpoint: str, region: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The actual state of ``topo``'s resources on ``endpoint``, in the shape of the module docstring."""
    clients = Clients(endpoint, region, env)
    account = clients.account()
    buckets = {b.key: _describe_bucket(clients, b, account) for b in topo.buckets}
    return {
        "queues": {q.key: _describe_queue(clients, q) for q in topo.queues},
        "tables": {t.key: _describe_table(clients, t) for t in topo.tables},
        "buckets": {key: bucket for key, (bucket, _) in buckets.items()},
        "lifecycle": {key: lifecycle for key, (_, lifecycle) in buckets.items()},
        "keys": {k.key: _describe_key(clients, k) for k in topo.keys},
        "secrets": {s.key: _describe_secret(clients, s) for s in topo.secrets},
    }


def expected_state(
    topo: Topology, *, account: str, region: str, secrets: Collection[str] = (), pitr_supported: bool = True
) -> dict[str, Any]:
    """What :func:`describe` returns once :func:`bootstrap` has run with values for ``secrets`` (keys).

    ``pitr_supported=False`` renders point-in-time recovery as ``None``, as :func:`describe`
    reports it on an emulator without it.
    """
    tables = {t.key: _expected_table(t) for t in topo.tables}
    if not pitr_supported:
        for table in tables.values():
            table["point_in_time_recovery"] = None
    return {
        "queues": {q.key: _expected_queue(q) for q in topo.queues},
        "tables": tables,
        "buckets": {b.key: _expected_bucket(b, account, region) for b in topo.buckets},
        "lifecycle": {b.key: _expected_lifecycle(b) for b in topo.buckets},
        "keys": {k.key: _expected_key(k) for k in topo.keys},
        "secrets": {s.key: ({"name": s.name} if s.key in secrets else None) for s in topo.secrets},
    }
