"""The snapshot store on S3 (the stage's versioned ``pricing`` bucket), and a reader of ``s3://`` objects.

botocore is imported inside functions, never at module level: the core library ships as a Lambda
layer and the gateway imports pricing without S3. Clients come from :func:`s3_client`, which takes
them from :func:`tollway.aws.client`, one per endpoint and region, so a warm Lambda reuses one and
tests can pass their own. No boto3 anywhere (import-linter forbids it in the request-path packages,
which import the catalog).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway import aws
from tollway.exceptions import aws_error_code
from tollway.pricing.errors import SnapshotStoreError
from tollway.pricing.publish import DEFAULT_PREFIX

__all__ = ["MAX_OBJECT_BYTES", "S3SnapshotStore", "StoreSettings", "read_s3_object", "s3_client"]

MAX_OBJECT_BYTES: Final = 64 * 1024 * 1024
"""Bound on one object read: a full public catalog is a few MB."""
_MISSING: Final = frozenset({"NoSuchKey", "404", "NotFound"})


class StoreSettings(BaseModel):
    """Where snapshots are published, from the environment every function of the stage gets."""

    model_config = ConfigDict(frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = Field(default=DEFAULT_PREFIX, min_length=1, max_length=256)
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    region: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StoreSettings:
        """``TOLLWAY_BUCKET_PRICING`` (from the topology), ``TOLLWAY_PRICING_PREFIX``, ``AWS_ENDPOINT_URL``."""
        env = os.environ if environ is None else environ
        bucket = env.get("TOLLWAY_BUCKET_PRICING", "").strip()
        if not bucket:
            raise SnapshotStoreError("TOLLWAY_BUCKET_PRICING is not set: it names the pricing bucket")
        try:
            return cls(
                bucket=bucket,
                prefix=env.get("TOLLWAY_PRICING_PREFIX", "").strip().strip("/") or DEFAULT_PREFIX,
                endpoint=env.get("AWS_ENDPOINT_URL", "").strip() or None,
                region=(env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip() or None,
            )
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
            raise SnapshotStoreError(f"invalid pricing store settings: {fields}") from None


def s3_client(endpoint: str | None = None, region: str | None = None) -> Any:
    """An S3 client for ``endpoint`` (path-style addressing, bounded timeouts and retries), built once."""
    from botocore.exceptions import BotoCoreError

    try:
        return aws.client(
            "s3",
            region=region,
            endpoint=endpoint,
            connect_timeout_s=5,
            read_timeout_s=20,
            retries=3,
            s3_path_style=True,
        )
    except BotoCoreError as exc:
        raise SnapshotStoreError(f"no S3 client: {type(exc).__name__}") from None


def read_s3_object(client: Any, bucket: str, key: str, *, limit: int = MAX_OBJECT_BYTES) -> bytes | None:
    """The object's bytes, ``None`` when it does not exist; :class:`SnapshotStoreError` otherwise.

    Larger than ``limit`` is an error, not a truncation.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.get_object(Bucket=bucket, Key=key)
        if int(response.get("ContentLength") or 0) > limit:
            response["Body"].close()
            raise SnapshotStoreError(f"s3://{bucket}/{key} is larger than {limit} bytes")
        body: bytes = response["Body"].read(limit + 1)
    except ClientError as exc:
        if aws_error_code(exc) in _MISSING:
            return None
        raise SnapshotStoreError(f"s3://{bucket}/{key}: GetObject failed: {aws_error_code(exc)}") from None
    except BotoCoreError as exc:
        raise SnapshotStoreError(f"s3://{bucket}/{key}: GetObject failed: {aws_error_code(exc)}") from None
    if len(body) > limit:
        raise SnapshotStoreError(f"s3://{bucket}/{key} is larger than {limit} bytes")
    return body


class S3SnapshotStore:
    """Snapshots and the pointer as objects of one bucket. ``client`` is for tests."""

    def __init__(self, bucket: str, *, client: Any | None = None, endpoint: str | None = None) -> None:
        self.bucket = bucket
        self._client = client if client is not None else s3_client(endpoint)

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> S3SnapshotStore:
        return cls(settings.bucket, client=s3_client(settings.endpoint, settings.region))

    def get(self, key: str) -> bytes | None:
        return read_s3_object(self._client, self.bucket, key)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if aws_error_code(exc) in _MISSING:
                return False
            raise SnapshotStoreError(f"s3://{self.bucket}/{key}: HeadObject failed: {aws_error_code(exc)}") from None
        except BotoCoreError as exc:
            raise SnapshotStoreError(f"s3://{self.bucket}/{key}: HeadObject failed: {aws_error_code(exc)}") from None
        return True

    def put(self, key: str, body: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", CacheControl="no-cache"
            )
        except (ClientError, BotoCoreError) as exc:
            raise SnapshotStoreError(f"s3://{self.bucket}/{key}: PutObject failed: {aws_error_code(exc)}") from None


if TYPE_CHECKING:
    from tollway.pricing.store.base import SnapshotStore

    _s3_is_a_store: type[SnapshotStore] = S3SnapshotStore
