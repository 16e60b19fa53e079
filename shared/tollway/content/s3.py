"""The content store on S3 (the stage's ``content`` bucket), objects envelope-encrypted under KMS.

One object per captured exchange, at :func:`~tollway.content.base.content_key`; its body is the
binary envelope of :mod:`tollway.content.envelope` (format version, KMS key id, wrapped data key,
nonce, ciphertext). The object's metadata holds only ``tollway-format`` and ``tollway-key-id``:
nothing of the content, not even its digest (a digest of a short answer can confirm a guess).
The PUT names no ``ServerSideEncryption``: the bucket's default applies on top of the envelope.

* **put** seals ``ContentRecord.to_json()`` with a cached data key (``GenerateDataKey`` at most
  once per :attr:`ContentStoreSettings.data_key_max_uses` objects or
  :attr:`~ContentStoreSettings.data_key_max_age_s`), then one ``PutObject``. Putting the same
  record again overwrites the object with an equal plaintext: idempotent.
* **get** is one ``GetObject`` (``NoSuchKey`` is ``None``), then ``Decrypt`` of the wrapped key
  unless it is cached, then AES-GCM authentication with the associated data rebuilt from the
  reference (its key, retention class, mode and digest), then the SHA-256 and size of the
  plaintext against the reference. Any mismatch is :class:`ContentError`, never content.
* **delete** is ``HeadObject`` (did it exist?), then ``DeleteObject``. ``DeleteObject`` is sent
  even when ``HeadObject`` found nothing: it is idempotent, and its ``NoSuchBucket`` tells a
  missing bucket from a missing object, which ``HeadObject``'s body-less 404 cannot. On a
  versioned bucket it deletes only the current version (S3 adds a delete marker); noncurrent
  versions are left to the bucket's lifecycle rule. The stage's ``content`` bucket is not
  versioned, so there the object is gone. (``HeadObject`` needs ``s3:GetObject``.)

KMS data keys carry the encryption context ``{"tollway:purpose": "content"}``: a data key wrapped
for another purpose under the same KMS key (the PII vault's, say) does not unwrap here.

botocore runs in a small dedicated thread pool, so neither S3 nor KMS ever blocks the event loop;
clients come from :func:`tollway.aws.client` on first use (tight timeouts: connect 1 s, read
5 s, 2 attempts), and nothing AWS-related happens at import. Every botocore error becomes
:class:`ContentUnavailable` naming the backend, the operation and the AWS error code only.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway import aws
from tollway.content.base import ContentError, ContentRecord, ContentRef, ContentUnavailable
from tollway.content.envelope import (
    OBJECT_FORMAT,
    associated_data,
    decode_object,
    encode_object,
    key_parts,
    object_key,
    record_plaintext,
    verified_record,
)
from tollway.exceptions import aws_error_code
from tollway.pii.vault.envelope import Envelope, KeyCachePolicy

__all__ = ["BUCKET_ENV", "KEY_ENV", "STACK_BUCKET_ENV", "ContentStoreSettings", "S3ContentStore"]

BUCKET_ENV: Final = "TOLLWAY_CONTENT_BUCKET"
STACK_BUCKET_ENV: Final = "TOLLWAY_BUCKET_CONTENT"
"""What ``Topology.environment`` names the ``content`` bucket; read when ``TOLLWAY_CONTENT_BUCKET`` is unset."""
KEY_ENV: Final = "TOLLWAY_CONTENT_KMS_KEY_ID"
ENCRYPTION_CONTEXT: Final = {"tollway:purpose": "content"}
OBJECT_CONTENT_TYPE: Final = "application/octet-stream"
MAX_SEALERS: Final = 256
"""Sealing envelopes kept (one per tenant and retention class): each holds one data key at a time."""
_MISSING_KEY: Final = frozenset({"NoSuchKey"})
_MISSING_HEAD: Final = frozenset({"404", "NoSuchKey", "NotFound"})
_TAMPERED_KEY: Final = frozenset({"InvalidCiphertextException", "IncorrectKeyException"})

_T = TypeVar("_T")


class ContentStoreSettings(BaseModel):
    """Where content lives, how long a call may take, and how data keys are cached."""

    model_config = ConfigDict(frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    kms_key_id: str = Field(min_length=1, max_length=2048)
    """A key id, key ARN, alias name or alias ARN."""
    region: str | None = None
    endpoint_url: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    connect_timeout_s: float = Field(default=1.0, gt=0, le=30)
    read_timeout_s: float = Field(default=5.0, gt=0, le=60)
    max_attempts: int = Field(default=2, ge=1, le=10)
    """botocore's total attempts per call (standard retry mode)."""
    threads: int = Field(default=4, ge=1, le=64)
    max_object_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    """The largest plaintext put, and (plus the envelope) the largest object read."""
    data_key_max_age_s: float = Field(default=300.0, gt=0, le=86_400)
    data_key_max_uses: int = Field(default=100_000, ge=1, le=2**30)
    unwrap_cache_size: int = Field(default=256, ge=0, le=100_000)
    unwrap_ttl_s: float = Field(default=300.0, gt=0, le=86_400)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, bucket: str | None = None, kms_key_id: str | None = None
    ) -> ContentStoreSettings:
        """``TOLLWAY_CONTENT_BUCKET`` (else ``TOLLWAY_BUCKET_CONTENT``, the stack's name for it),
        ``TOLLWAY_CONTENT_KMS_KEY_ID``, ``AWS_ENDPOINT_URL`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``;
        ``bucket`` and ``kms_key_id`` win when given. Raises :class:`ContentUnavailable`."""
        env = os.environ if environ is None else environ
        name = bucket or env.get(BUCKET_ENV, "").strip() or env.get(STACK_BUCKET_ENV, "").strip()
        if not name:
            raise ContentUnavailable(f"{BUCKET_ENV} is not set: it names the content bucket")
        key = kms_key_id or env.get(KEY_ENV, "").strip()
        if not key:
            raise ContentUnavailable(f"{KEY_ENV} is not set: it names the content KMS key")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        region = env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None
        try:
            return cls(bucket=name, kms_key_id=key, region=region, endpoint_url=endpoint)
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
            raise ContentUnavailable(f"invalid content store settings: {fields}") from None

    def key_cache_policy(self) -> KeyCachePolicy:
        return KeyCachePolicy(
            max_age_s=self.data_key_max_age_s,
            max_uses=self.data_key_max_uses,
            unwrap_cache_size=self.unwrap_cache_size,
            unwrap_ttl_s=self.unwrap_ttl_s,
        )


def _envelope_unavailable(detail: str) -> Exception:
    return ContentUnavailable(f"content store kms: {detail}")


class S3ContentStore:
    """The store. ``s3`` and ``kms`` (botocore clients) are for tests; otherwise both are built on
    first use."""

    def __init__(self, settings: ContentStoreSettings, *, s3: Any | None = None, kms: Any | None = None) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        preset = {name: c for name, c in (("s3", s3), ("kms", kms)) if c is not None}
        self._aws = aws.ThreadedClients(
            threads=settings.threads,
            thread_name="tollway-content",
            region=settings.region,
            endpoint=settings.endpoint_url,
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            retries=settings.max_attempts - 1,
            s3_path_style=True,
            clients=preset,
        )
        self._envelope = Envelope(_KmsDataKeys(self), settings.key_cache_policy(), unavailable=_envelope_unavailable)
        """Opens any object (its unwrap cache serves every tenant and class)."""
        self._sealers: OrderedDict[tuple[str, str], Envelope] = OrderedDict()
        """One sealing envelope per (tenant, retention class), least recently used out first: no two
        tenants' objects, and no two classes', are ever sealed under the same data key."""

    def __repr__(self) -> str:
        return f"S3ContentStore(bucket={self.bucket!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> S3ContentStore:
        return cls(ContentStoreSettings.from_env(environ))

    # ------------------------------------------------------------ calls

    def _client(self, service: str) -> Any:
        return self._aws.client(service)

    async def _run(self, service: str, operation: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in the store's threads; botocore's errors become :class:`ContentUnavailable`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await self._aws.run(fn, *args)
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(service, operation, aws_error_code(exc)) from None
        except aws.ClientsClosed:
            raise _unavailable(service, operation, "closed") from None

    def _call_sync(self, service: str, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        return self._aws.call(service, operation, request)

    def _get_sync(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            response = self._client("s3").get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if aws_error_code(exc) in _MISSING_KEY:
                return None
            raise
        limit = self.settings.max_object_bytes + 64 * 1024
        stream = response["Body"]
        try:
            if int(response.get("ContentLength") or 0) > limit:
                raise ContentError("a content object is larger than the store reads")
            body: bytes = stream.read(limit + 1)
        finally:
            stream.close()
        if len(body) > limit:
            raise ContentError("a content object is larger than the store reads")
        return body

    def _exists_sync(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client("s3").head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if aws_error_code(exc) in _MISSING_HEAD:
                return False
            raise
        return True

    async def warm(self) -> None:
        """Build both clients now, off the request path (loading a botocore model holds the GIL)."""
        for service in ("s3", "kms"):
            await self._run(service, "warm", self._client, service)

    # ------------------------------------------------------------ KMS

    async def _generate_data_key(self) -> tuple[bytes, bytes, str]:
        request = {"KeyId": self.settings.kms_key_id, "KeySpec": "AES_256", "EncryptionContext": ENCRYPTION_CONTEXT}
        response = await self._run("kms", "GenerateDataKey", self._call_sync, "kms", "generate_data_key", request)
        return bytes(response["Plaintext"]), bytes(response["CiphertextBlob"]), str(response["KeyId"])

    def _decrypt_sync(self, wrapped: bytes, key_id: str) -> bytes | None:
        from botocore.exceptions import ClientError

        request = {"CiphertextBlob": wrapped, "KeyId": key_id, "EncryptionContext": ENCRYPTION_CONTEXT}
        try:
            response = self._client("kms").decrypt(**request)
        except ClientError as exc:
            if aws_error_code(exc) in _TAMPERED_KEY:
                return None
            raise
        return bytes(response["Plaintext"])

    async def _decrypt_data_key(self, wrapped: bytes, key_id: str) -> bytes | None:
        return await self._run("kms", "Decrypt", self._decrypt_sync, wrapped, key_id)

    # ------------------------------------------------------------ the store

    async def put(self, record: ContentRecord, retention_class: str) -> ContentRef:
        key, parts = object_key(record, retention_class)
        plaintext = record_plaintext(record, self.settings.max_object_bytes)
        digest = hashlib.sha256(plaintext).hexdigest()
        aad = associated_data(key=key, parts=parts, mode=record.mode, digest=digest)
        sealed = await self._sealer(record.tenant, retention_class).seal(plaintext, aad)
        size = len(plaintext)
        del plaintext
        request = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": encode_object(sealed),
            "ContentType": OBJECT_CONTENT_TYPE,
            "Metadata": {"tollway-format": str(OBJECT_FORMAT), "tollway-key-id": sealed.key_id},
        }
        await self._run("s3", "PutObject", self._call_sync, "s3", "put_object", request)
        return ContentRef(
            bucket=self.bucket,
            key=key,
            digest=digest,
            size=size,
            key_ref=sealed.key_id,
            retention_class=retention_class,
            mode=record.mode,
            purposes=record.purposes,
        )

    async def get(self, ref: ContentRef) -> ContentRecord | None:
        self._check_bucket(ref)
        parts = key_parts(ref.key)
        if parts.retention_class != ref.retention_class:
            raise ContentError("a content reference's retention class does not match its key")
        body = await self._run("s3", "GetObject", self._get_sync, ref.key)
        if body is None:
            return None
        sealed = decode_object(body)
        aad = associated_data(key=ref.key, parts=parts, mode=ref.mode, digest=ref.digest)
        plaintext = await self._envelope.open(sealed, aad)
        if plaintext is None:
            raise ContentError("a content object failed authentication against its reference")
        return verified_record(plaintext, ref, parts)

    async def delete(self, ref: ContentRef) -> bool:
        self._check_bucket(ref)
        key_parts(ref.key)
        existed = await self._run("s3", "HeadObject", self._exists_sync, ref.key)
        await self._run(
            "s3", "DeleteObject", self._call_sync, "s3", "delete_object", {"Bucket": self.bucket, "Key": ref.key}
        )
        return existed

    def _sealer(self, tenant: str, retention_class: str) -> Envelope:
        key = (tenant, retention_class)
        sealer = self._sealers.get(key)
        if sealer is None:
            sealer = Envelope(_KmsDataKeys(self), self.settings.key_cache_policy(), unavailable=_envelope_unavailable)
            self._sealers[key] = sealer
            if len(self._sealers) > MAX_SEALERS:
                _, oldest = self._sealers.popitem(last=False)
                oldest.forget()
        else:
            self._sealers.move_to_end(key)
        return sealer

    def _check_bucket(self, ref: ContentRef) -> None:
        if ref.bucket != self.bucket:
            raise ContentError("a content reference names another bucket than this store's")

    async def aclose(self) -> None:
        self._aws.close()
        self._envelope.forget()
        for sealer in self._sealers.values():
            sealer.forget()
        self._sealers.clear()


class _KmsDataKeys:
    """The store's :class:`~tollway.pii.vault.envelope.DataKeySource`: its KMS calls."""

    def __init__(self, store: S3ContentStore) -> None:
        self._store = store

    async def generate(self) -> tuple[bytes, bytes, str]:
        return await self._store._generate_data_key()

    async def unwrap(self, wrapped: bytes, key_id: str) -> bytes | None:
        return await self._store._decrypt_data_key(wrapped, key_id)


def _unavailable(service: str, operation: str, code: str) -> ContentUnavailable:
    return ContentUnavailable(f"content store {service}: {operation} failed: {code}")
