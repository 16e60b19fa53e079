"""Where exports are written: the stage's ``exports`` bucket (S3) or a dict (unit tests).

Every export object is written once and never replaced: :meth:`ExportSink.put_if_absent` is a
conditional create (S3 ``PutObject`` with ``If-None-Match: *``), so a resumed or repeated run can
never overwrite a shard or a manifest, and two runs racing on one key leave the first one's
object. Each object carries its SHA-256 (hex) as metadata (``x-amz-meta-sha256``), so a resumed
run checks a shard with a ``HeadObject`` instead of reading it back. The bucket is versioned (the
topology's ``exports`` bucket), so even a delete leaves the written version recoverable.

The S3 sink's client comes from :func:`tollway.aws.client` on first use, never at import; every
botocore error becomes :class:`~tollway.export.errors.ExportUnavailable` naming the operation and
the AWS error code only.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway import aws
from tollway.exceptions import aws_error_code
from tollway.export.errors import ExportUnavailable

__all__ = [
    "BUCKET_ENV",
    "STACK_BUCKET_ENV",
    "ExportObject",
    "ExportSink",
    "MemoryExportSink",
    "S3ExportSink",
    "SinkSettings",
]

BUCKET_ENV: Final = "TOLLWAY_EXPORTS_BUCKET"
STACK_BUCKET_ENV: Final = "TOLLWAY_BUCKET_EXPORTS"
"""What ``Topology.environment`` names the ``exports`` bucket; read when ``TOLLWAY_EXPORTS_BUCKET`` is unset."""
_DIGEST_META: Final = "sha256"
_MAX_LIST_PAGES: Final = 1000
_MISSING: Final = frozenset({"404", "NoSuchKey", "NotFound"})


@dataclass(frozen=True, slots=True)
class ExportObject:
    """What :meth:`ExportSink.head` tells of a stored object."""

    key: str
    size: int
    sha256: str | None
    """The digest it was written with; ``None`` for an object written by something else."""


class ExportSink(Protocol):
    def put_if_absent(self, key: str, body: bytes, *, content_type: str) -> bool:
        """Create ``key`` with ``body``: ``True`` when written, ``False`` when an object was already
        there (left unchanged). Raises :class:`ExportUnavailable`."""
        ...

    def get(self, key: str) -> bytes | None:
        """The object's bytes, ``None`` when there is none."""
        ...

    def head(self, key: str) -> ExportObject | None:
        """The object's size and digest, ``None`` when there is none."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""
        ...

    def put_status(self, key: str, body: bytes) -> None:
        """Write (or overwrite) a run's progress object: the one object of an export that is not
        immutable, read by ``tollway export create`` while the run goes on."""
        ...


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class MemoryExportSink:
    """The sink in a dict. ``fail_puts`` makes the put of those keys raise, once each (a crash mid-run)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []
        """Keys written, in order (a test counts duplicates with it)."""
        self.fail_puts: set[str] = set()
        self._lock = threading.Lock()

    def put_if_absent(self, key: str, body: bytes, *, content_type: str) -> bool:
        with self._lock:
            if key in self.fail_puts:
                self.fail_puts.discard(key)
                raise ExportUnavailable(f"exports memory: PutObject {key} failed: injected")
            if key in self.objects:
                return False
            self.objects[key] = bytes(body)
            self.puts.append(key)
            return True

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self.objects.get(key)

    def head(self, key: str) -> ExportObject | None:
        body = self.get(key)
        return None if body is None else ExportObject(key, len(body), _sha256(body))

    def list(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(k for k in self.objects if k.startswith(prefix))

    def put_status(self, key: str, body: bytes) -> None:
        with self._lock:
            self.objects[key] = bytes(body)


class SinkSettings(BaseModel):
    """The exports bucket and how to reach it."""

    model_config = ConfigDict(frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    region: str | None = None
    endpoint_url: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, bucket: str | None = None) -> SinkSettings:
        """``TOLLWAY_EXPORTS_BUCKET`` (else ``TOLLWAY_BUCKET_EXPORTS``), ``AWS_ENDPOINT_URL``,
        ``AWS_REGION``/``AWS_DEFAULT_REGION``; ``bucket`` wins. Raises :class:`ExportUnavailable`."""
        env = os.environ if environ is None else environ
        name = bucket or env.get(BUCKET_ENV, "").strip() or env.get(STACK_BUCKET_ENV, "").strip()
        if not name:
            raise ExportUnavailable(f"{BUCKET_ENV} is not set: it names the exports bucket")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        region = env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None
        try:
            return cls(bucket=name, region=region, endpoint_url=endpoint)
        except ValidationError:
            raise ExportUnavailable("invalid exports bucket settings: bucket") from None


class S3ExportSink:
    """The exports bucket. ``client`` (a botocore S3 client) is for tests."""

    def __init__(self, settings: SinkSettings, *, client: Any | None = None) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self._client = client

    def __repr__(self) -> str:
        return f"S3ExportSink(bucket={self.bucket!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> S3ExportSink:
        return cls(SinkSettings.from_env(environ))

    def _call(self, operation: str, **params: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        if self._client is None:
            self._client = aws.client(
                "s3",
                region=self.settings.region,
                endpoint=self.settings.endpoint_url,
                s3_path_style=self.settings.endpoint_url is not None,
            )
        try:
            return getattr(self._client, operation)(Bucket=self.bucket, **params)
        except ClientError:
            raise
        except BotoCoreError as exc:
            raise ExportUnavailable(f"exports bucket {self.bucket}: {operation} failed: {type(exc).__name__}") from None

    def _failed(self, operation: str, exc: Exception) -> ExportUnavailable:
        return ExportUnavailable(f"exports bucket {self.bucket}: {operation} failed: {aws_error_code(exc)}")

    def put_if_absent(self, key: str, body: bytes, *, content_type: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(
                "put_object",
                Key=key,
                Body=body,
                ContentType=content_type,
                Metadata={_DIGEST_META: _sha256(body)},
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if aws_error_code(exc) == "PreconditionFailed":
                return False
            raise self._failed("PutObject", exc) from None
        return True

    def get(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body: bytes = self._call("get_object", Key=key)["Body"].read()
        except ClientError as exc:
            if aws_error_code(exc) in _MISSING:
                return None
            raise self._failed("GetObject", exc) from None
        return body

    def head(self, key: str) -> ExportObject | None:
        from botocore.exceptions import ClientError

        try:
            found = self._call("head_object", Key=key)
        except ClientError as exc:
            if aws_error_code(exc) in _MISSING:
                return None
            raise self._failed("HeadObject", exc) from None
        digest = (found.get("Metadata") or {}).get(_DIGEST_META)
        return ExportObject(key, int(found.get("ContentLength", 0)), digest if isinstance(digest, str) else None)

    def put_status(self, key: str, body: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self._call("put_object", Key=key, Body=body, ContentType="application/json")
        except ClientError as exc:
            raise self._failed("PutObject", exc) from None

    def list(self, prefix: str) -> list[str]:
        from botocore.exceptions import ClientError

        keys: list[str] = []
        params: dict[str, Any] = {"Prefix": prefix}
        for _ in range(_MAX_LIST_PAGES):
            try:
                page = self._call("list_objects_v2", **params)
            except ClientError as exc:
                raise self._failed("ListObjectsV2", exc) from None
            keys.extend(str(o["Key"]) for o in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return sorted(keys)
            params["ContinuationToken"] = page["NextContinuationToken"]
        raise ExportUnavailable(f"exports bucket {self.bucket}: ListObjectsV2 read more than {_MAX_LIST_PAGES} pages")
