"""The PII vault on a dedicated DynamoDB table (partition key ``pk``, TTL attribute ``expiresAt``),
values envelope-encrypted under a dedicated KMS key.

One item per token (docs/pii-vault.md, *Item layout*)::

    pk           S  TOK#<token id>
    itemFormat   N  1                      layout and associated-data version
    tokenFormat  N  1                      the placeholder grammar's version (TWPII1)
    scope        S  session | host
    kind         S  EMAIL
    tenant       S  acme
    binding      B  32-byte scope binding digest (never the session id)
    state        S  active | revoked
    keyId        S  arn:aws:kms:…:key/…    the KMS key that wrapped the data key
    wrappedKey   B  the data key, encrypted by KMS (GenerateDataKey's CiphertextBlob)
    nonce        B  12 random bytes
    ciphertext   B  AES-256-GCM of the UTF-8 value, tag appended
    createdAt    N  epoch seconds
    expiresAt    N  epoch seconds, whole, rounded up: the table's TTL attribute
    revokedAt    N  epoch seconds (revoked items only)

* **insert** is one ``PutItem`` conditioned on ``attribute_not_exists(pk)``: it never
  overwrites, and a failed condition is :class:`TokenExists`.
* **resolve** is one ``GetItem`` with a consistent read. It compares the binding in constant
  time, then checks the state and the deadline (TTL is enforced on read: DynamoDB deletes expired
  items up to days late, moto never), then opens the ciphertext. An item that fails any check,
  including authentication of its ciphertext and associated data, resolves to ``None``: a
  tampered item is refused exactly as an unknown token is, and counted in
  :attr:`DynamoDBPiiVault.integrity_failures` and logged as a warning that names neither the token
  nor the value.
* **revoke** is one ``UpdateItem`` conditioned on ``attribute_exists(pk)``: it sets ``state``
  to ``revoked`` and removes ``ciphertext``, ``nonce`` and ``wrappedKey``, so nothing of the
  value survives it (the TTL deletes the rest). Revoking an unknown token is a no-op.

Those three calls (``PutItem``, ``GetItem``, ``UpdateItem`` on this table) and the KMS key's
``GenerateDataKey`` and ``Decrypt`` are all the gateway's role is granted: no ``Query``,
``Scan``, batch read, ``DeleteItem`` or export.

botocore runs in a small dedicated thread pool, as in the lease store, so a slow DynamoDB or KMS
never blocks the event loop; the clients come from :func:`tollway.aws.client` on first use, and
nothing AWS-related happens at import. Every botocore error becomes :class:`VaultUnavailable`
naming the table or key, the operation and the error code, never a request value.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tollway import aws
from tollway.exceptions import aws_error_code
from tollway.pii.vault.base import TokenExists, VaultEntry, VaultUnavailable, check_value, valid_token_id
from tollway.pii.vault.envelope import ITEM_FORMAT, Envelope, KeyCachePolicy, Sealed, associated_data

__all__ = ["KEY_ENV", "TABLE_ENV", "DynamoDBPiiVault", "DynamoDBVaultSettings"]

log = logging.getLogger("tollway.pii.vault")

TABLE_ENV: Final = "TOLLWAY_TABLE_PII_VAULT"
KEY_ENV: Final = "TOLLWAY_PII_KMS_KEY_ID"
ENCRYPTION_CONTEXT: Final = {"tollway:purpose": "pii-vault"}
"""KMS encryption context of every data key: a wrapped key made for another purpose under the same
KMS key does not unwrap here. It names no table, so a table restored under a new name still reads."""
_PK_PREFIX: Final = "TOK#"
_ACTIVE: Final = "active"
_REVOKED: Final = "revoked"
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
_TAMPERED_KEY: Final = frozenset({"InvalidCiphertextException", "IncorrectKeyException"})


class DynamoDBVaultSettings(BaseModel):
    """Where the vault lives, how long a call may take, and how data keys are cached."""

    model_config = ConfigDict(frozen=True)

    table: str = Field(min_length=3, max_length=255)
    kms_key_id: str = Field(min_length=1, max_length=2048)
    """A key id, key ARN, alias name (``alias/<stage>-pii-vault``) or alias ARN."""
    endpoint: str | None = None
    """``AWS_ENDPOINT_URL`` (a local cloud); ``None`` for the real AWS endpoints."""
    region: str | None = None
    connect_timeout_s: float = Field(default=1.0, gt=0, le=30)
    read_timeout_s: float = Field(default=2.0, gt=0, le=60)
    max_attempts: int = Field(default=2, ge=1, le=10)
    """botocore's total attempts per call (standard retry mode)."""
    threads: int = Field(default=4, ge=1, le=64)
    data_key_max_age_s: float = Field(default=300.0, gt=0, le=86_400)
    data_key_max_uses: int = Field(default=100_000, ge=1, le=2**30)
    unwrap_cache_size: int = Field(default=256, ge=0, le=100_000)
    unwrap_ttl_s: float = Field(default=300.0, gt=0, le=86_400)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, table: str | None = None, kms_key_id: str | None = None
    ) -> DynamoDBVaultSettings:
        """``TOLLWAY_TABLE_PII_VAULT``, ``TOLLWAY_PII_KMS_KEY_ID``, ``AWS_ENDPOINT_URL`` and
        ``AWS_REGION``/``AWS_DEFAULT_REGION``; ``table`` and ``kms_key_id`` win when given."""
        env = os.environ if environ is None else environ
        name = table or env.get(TABLE_ENV, "").strip()
        if not name:
            raise VaultUnavailable(f"{TABLE_ENV} is not set: it names the pii-vault table")
        key = kms_key_id or env.get(KEY_ENV, "").strip()
        if not key:
            raise VaultUnavailable(f"{KEY_ENV} is not set: it names the pii-vault KMS key")
        endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
        region = env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None
        return cls(table=name, kms_key_id=key, endpoint=endpoint, region=region)

    def key_cache_policy(self) -> KeyCachePolicy:
        return KeyCachePolicy(
            max_age_s=self.data_key_max_age_s,
            max_uses=self.data_key_max_uses,
            unwrap_cache_size=self.unwrap_cache_size,
            unwrap_ttl_s=self.unwrap_ttl_s,
        )


class DynamoDBPiiVault:
    """The vault. ``dynamodb`` and ``kms`` (botocore clients) are for tests; otherwise both are
    built on first use. ``clock`` (epoch seconds) stamps ``createdAt`` and ``revokedAt``."""

    def __init__(
        self,
        settings: DynamoDBVaultSettings,
        *,
        dynamodb: Any | None = None,
        kms: Any | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.table = settings.table
        self._aws = aws.ThreadedClients(
            threads=settings.threads,
            thread_name="tollway-pii-vault",
            region=settings.region,
            endpoint=settings.endpoint,
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            retries=settings.max_attempts - 1,
            clients={name: c for name, c in (("dynamodb", dynamodb), ("kms", kms)) if c is not None},
        )
        self._clock = clock
        self._envelope = Envelope(_KmsDataKeys(self), settings.key_cache_policy())
        self.integrity_failures = 0
        """Items refused because they failed a check a valid item passes (tampering, corruption)."""

    def __repr__(self) -> str:
        return f"DynamoDBPiiVault(table={self.table!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DynamoDBPiiVault:
        return cls(DynamoDBVaultSettings.from_env(environ))

    # ------------------------------------------------------------ calls

    def _client(self, service: str) -> Any:
        return self._aws.client(service)

    def _call_sync(self, service: str, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        return self._aws.call(service, operation, request)

    async def _call(self, service: str, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        """One call in the vault's threads; botocore's errors propagate (the caller maps them)."""
        try:
            return await self._aws.run(self._aws.call, service, operation, request)
        except aws.ClientsClosed:
            raise VaultUnavailable(f"pii vault {self._where(service)}: {operation} failed: closed") from None

    def _where(self, service: str) -> str:
        return f"table {self.table}" if service == "dynamodb" else "kms key"

    def _unavailable(self, service: str, operation: str, exc: Exception) -> VaultUnavailable:
        return VaultUnavailable(f"pii vault {self._where(service)}: {operation} failed: {aws_error_code(exc)}")

    async def warm(self) -> None:
        """Build both clients now, off the request path (loading a botocore model holds the GIL)."""
        for service in ("dynamodb", "kms"):
            try:
                await self._aws.run(self._aws.client, service)
            except aws.ClientsClosed:
                raise VaultUnavailable("pii vault: warm failed: closed") from None

    # ------------------------------------------------------------ KMS

    async def _generate_data_key(self) -> tuple[bytes, bytes, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        request = {"KeyId": self.settings.kms_key_id, "KeySpec": "AES_256", "EncryptionContext": ENCRYPTION_CONTEXT}
        try:
            response = await self._call("kms", "generate_data_key", request)
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable("kms", "GenerateDataKey", exc) from None
        return bytes(response["Plaintext"]), bytes(response["CiphertextBlob"]), str(response["KeyId"])

    async def _decrypt_data_key(self, wrapped: bytes, key_id: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        request = {"CiphertextBlob": wrapped, "KeyId": key_id, "EncryptionContext": ENCRYPTION_CONTEXT}
        try:
            response = await self._call("kms", "decrypt", request)
        except ClientError as exc:
            if aws_error_code(exc) in _TAMPERED_KEY:
                return None
            raise self._unavailable("kms", "Decrypt", exc) from None
        except BotoCoreError as exc:
            raise self._unavailable("kms", "Decrypt", exc) from None
        return bytes(response["Plaintext"])

    # ------------------------------------------------------------ the vault

    async def insert(self, entry: VaultEntry, value: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        raw = check_value(value)
        aad = associated_data(
            token_id=entry.token_id,
            binding=entry.binding,
            kind=entry.kind,
            tenant=entry.tenant,
            scope=entry.scope,
            token_format=entry.token_format,
        )
        sealed = await self._envelope.seal(raw, aad)
        del raw
        item = {
            "pk": {"S": _PK_PREFIX + entry.token_id},
            "itemFormat": {"N": str(ITEM_FORMAT)},
            "tokenFormat": {"N": str(entry.token_format)},
            "scope": {"S": entry.scope},
            "kind": {"S": entry.kind},
            "tenant": {"S": entry.tenant},
            "binding": {"B": bytes(entry.binding)},
            "state": {"S": _ACTIVE},
            "keyId": {"S": sealed.key_id},
            "wrappedKey": {"B": sealed.wrapped_key},
            "nonce": {"B": sealed.nonce},
            "ciphertext": {"B": sealed.ciphertext},
            "createdAt": {"N": str(int(self._clock()))},
            "expiresAt": {"N": str(entry.deadline)},
        }
        request = {
            "TableName": self.table,
            "Item": item,
            # A live or revoked entry stays; an active one past its deadline, not yet purged, is replaced.
            "ConditionExpression": "attribute_not_exists(pk) OR (#state = :active AND expiresAt <= :now)",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": {":active": {"S": _ACTIVE}, ":now": {"N": str(int(self._clock()))}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            await self._call("dynamodb", "put_item", request)
        except ClientError as exc:
            if aws_error_code(exc) == _CONDITION_FAILED:
                raise TokenExists(
                    f"pii vault table {self.table}: insert refused: the token id already has an entry",
                    _live_deadline(exc),
                ) from None
            raise self._unavailable("dynamodb", "PutItem", exc) from None
        except BotoCoreError as exc:
            raise self._unavailable("dynamodb", "PutItem", exc) from None

    async def resolve(self, token_id: str, binding: bytes, now: float) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        if not valid_token_id(token_id):
            return None
        request = {"TableName": self.table, "Key": {"pk": {"S": _PK_PREFIX + token_id}}, "ConsistentRead": True}
        try:
            response = await self._call("dynamodb", "get_item", request)
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable("dynamodb", "GetItem", exc) from None
        item = response.get("Item")
        if item is None:
            return None
        try:
            stored = _Stored.parse(item)
        except (KeyError, TypeError, ValueError):
            self._refused("an item does not have the vault's layout")
            return None
        if not hmac.compare_digest(stored.binding, bytes(binding)):
            return None
        if stored.state != _ACTIVE or now >= stored.expires_at:
            return None
        if stored.sealed is None:
            self._refused("an active item holds no ciphertext")
            return None
        try:
            plaintext = await self._envelope.open(stored.sealed, stored.associated_data(token_id, bytes(binding)))
        except UnicodeEncodeError:  # a kind or scope that is not ASCII: not written by a vault
            self._refused("an item's fields are not the vault's")
            return None
        if plaintext is None:
            self._refused("an item failed authentication")
            return None
        try:
            return plaintext.decode("utf-8")
        except UnicodeDecodeError:
            self._refused("an item's value is not UTF-8")
            return None

    def _refused(self, why: str) -> None:
        self.integrity_failures += 1
        log.warning("pii vault table %s: %s; the placeholder stays masked", self.table, why)

    async def revoke(self, token_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        request = {
            "TableName": self.table,
            "Key": {"pk": {"S": _PK_PREFIX + token_id}},
            "UpdateExpression": "SET #state = :revoked, #revokedAt = :now REMOVE #ciphertext, #nonce, #wrappedKey",
            "ConditionExpression": "attribute_exists(pk)",
            "ExpressionAttributeNames": {
                "#state": "state",
                "#revokedAt": "revokedAt",
                "#ciphertext": "ciphertext",
                "#nonce": "nonce",
                "#wrappedKey": "wrappedKey",
            },
            "ExpressionAttributeValues": {":revoked": {"S": _REVOKED}, ":now": {"N": str(int(self._clock()))}},
        }
        try:
            await self._call("dynamodb", "update_item", request)
        except ClientError as exc:
            if aws_error_code(exc) == _CONDITION_FAILED:
                return
            raise self._unavailable("dynamodb", "UpdateItem", exc) from None
        except BotoCoreError as exc:
            raise self._unavailable("dynamodb", "UpdateItem", exc) from None

    async def aclose(self) -> None:
        self._aws.close()
        self._envelope.forget()


class _KmsDataKeys:
    """The vault's :class:`~tollway.pii.vault.envelope.DataKeySource`: its KMS calls."""

    def __init__(self, vault: DynamoDBPiiVault) -> None:
        self._vault = vault

    async def generate(self) -> tuple[bytes, bytes, str]:
        return await self._vault._generate_data_key()

    async def unwrap(self, wrapped: bytes, key_id: str) -> bytes | None:
        return await self._vault._decrypt_data_key(wrapped, key_id)


def _live_deadline(exc: Exception) -> float | None:
    """The deadline of the active entry a refused insert met (DynamoDB returns it on request)."""
    item = getattr(exc, "response", {}).get("Item") or {}
    try:
        if item["state"]["S"] == _ACTIVE:
            return float(item["expiresAt"]["N"])
    except (KeyError, TypeError, ValueError):
        pass
    return None


@dataclass(frozen=True, slots=True)
class _Stored:
    """An item read back."""

    binding: bytes
    kind: str
    tenant: str
    scope: str
    token_format: int
    state: str
    expires_at: int
    sealed: Sealed | None
    """``None`` once revoked."""

    @classmethod
    def parse(cls, item: Mapping[str, Any]) -> _Stored:
        """KeyError, TypeError or ValueError when ``item`` does not have the vault's layout."""
        if int(item["itemFormat"]["N"]) != ITEM_FORMAT:
            raise ValueError("unknown item format")
        sealed = None
        if "ciphertext" in item:
            sealed = Sealed(
                str(item["keyId"]["S"]),
                bytes(item["wrappedKey"]["B"]),
                bytes(item["nonce"]["B"]),
                bytes(item["ciphertext"]["B"]),
            )
        return cls(
            binding=bytes(item["binding"]["B"]),
            kind=str(item["kind"]["S"]),
            tenant=str(item["tenant"]["S"]),
            scope=str(item["scope"]["S"]),
            token_format=int(item["tokenFormat"]["N"]),
            state=str(item["state"]["S"]),
            expires_at=int(item["expiresAt"]["N"]),
            sealed=sealed,
        )

    def associated_data(self, token_id: str, binding: bytes) -> bytes:
        """What the item's ciphertext was sealed with, if the item is as it was written."""
        return associated_data(
            token_id=token_id,
            binding=binding,
            kind=self.kind,
            tenant=self.tenant,
            scope=self.scope,
            token_format=self.token_format,
        )
