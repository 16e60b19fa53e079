"""The S3 content store on a real moto server: the shared store contract, and what only a stored,
encrypted object can show (no plaintext at rest, tampering fails closed, data keys are cached,
a missing bucket or key is unavailable without naming content).

Each test bootstraps only the ``content`` bucket and the KMS keys of a fresh stage from
``topology()``, so the bucket is the one the stack deploys. The topology has no KMS key of its
own for content yet, so the objects are sealed under the ``pii-vault`` key: the store's
encryption context (``tollway:purpose=content``) still keeps its data keys apart from the
vault's. The test reads and tampers with raw objects through its own admin client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.content_store_contract import CANARY, RETENTION, ContentStoreContract, record
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology
from tollway.content import (
    ContentError,
    ContentRef,
    ContentStoreSettings,
    ContentUnavailable,
    ContentWriter,
    S3ContentStore,
)
from tollway.content.envelope import MAGIC, OBJECT_FORMAT

pytestmark = pytest.mark.local_cloud


@dataclasses.dataclass(frozen=True)
class Stage:
    cloud: LocalCloud
    bucket: str
    key_alias: str

    def settings(self, **changes: Any) -> ContentStoreSettings:
        return ContentStoreSettings.from_env(bucket=self.bucket, kms_key_id=self.key_alias).model_copy(update=changes)

    def admin(self, service: str = "s3") -> Any:
        return Clients(self.cloud.endpoint, self.cloud.region, self.cloud.env()).client(service)

    def raw(self, key: str) -> bytes:
        body: bytes = self.admin().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body

    def head(self, key: str) -> dict[str, Any]:
        found: dict[str, Any] = self.admin().head_object(Bucket=self.bucket, Key=key)
        return found

    def write(self, key: str, body: bytes) -> None:
        self.admin().put_object(Bucket=self.bucket, Key=key, Body=body)

    def keys(self) -> list[str]:
        listed = self.admin().list_objects_v2(Bucket=self.bucket).get("Contents", [])
        return [str(o["Key"]) for o in listed]


@pytest.fixture
def stage(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Stage:
    full = topology(prefix)
    only_content = dataclasses.replace(
        full, queues=(), tables=(), buckets=(full.bucket("content"),), secrets=(), functions=()
    )
    report = bootstrap(only_content, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for key, value in cloud.env().items():
        monkeypatch.setenv(key, value)
    return Stage(cloud, full.bucket("content").name(report.account, cloud.region), full.kms_key("pii-vault").alias)


@pytest.fixture
async def store(stage: Stage) -> AsyncIterator[S3ContentStore]:
    opened = S3ContentStore(stage.settings())
    yield opened
    await opened.aclose()


class TestS3StoreContract(ContentStoreContract):
    pass


def _encodings(text: str) -> list[bytes]:
    raw = text.encode("utf-8")
    return [raw, text.encode("utf-16-le"), raw.hex().encode(), "山田".encode(), "Grüße".encode()]


async def test_an_object_holds_the_envelope_and_no_content_in_clear(store: S3ContentStore, stage: Stage) -> None:
    ref = await store.put(record(), RETENTION)
    body = stage.raw(ref.key)
    head = stage.head(ref.key)
    stored = [body, repr(head).encode(), repr(head).encode("utf-16-le")]
    for encoded in _encodings(CANARY):
        assert not any(encoded in b for b in stored), "content is stored in clear"
    assert body[:4] == MAGIC and body[4] == OBJECT_FORMAT
    assert head["Metadata"] == {"tollway-format": "1", "tollway-key-id": ref.key_ref}
    assert head["ContentType"] == "application/octet-stream"
    assert head.get("ServerSideEncryption") in (None, "AES256"), "the bucket's default, not the request's"
    assert ref.key_ref.startswith("arn:aws:kms:") and ":key/" in ref.key_ref
    assert ref.key_ref.encode() in body
    assert len(body) > ref.size + 16 + 12, "ciphertext, tag, nonce and a wrapped key"
    assert stage.keys() == [ref.key]


def _flip(body: bytes, index: int) -> bytes:
    return body[:index] + bytes([body[index] ^ 1]) + body[index + 1 :]


def _field(body: bytes, n: int) -> tuple[int, int]:
    """(offset, length) of the n-th length-prefixed field of an envelope."""
    offset = 5
    for _ in range(n):
        offset += 4 + int.from_bytes(body[offset : offset + 4], "big")
    return offset + 4, int.from_bytes(body[offset : offset + 4], "big")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda body: _flip(body, len(body) - 1),  # the tag
        lambda body: _flip(body, _field(body, 3)[0]),  # the first ciphertext byte
        lambda body: _flip(body, _field(body, 2)[0]),  # the nonce
        lambda body: _flip(body, sum(_field(body, 1)) - 1),  # the wrapped key
        lambda body: body[:4] + bytes([OBJECT_FORMAT + 1]) + body[5:],  # the format version
        lambda body: b"XXXX" + body[4:],  # the magic
        lambda body: body[:40],  # truncated
        lambda body: b"",
        lambda body: record().to_json(),  # the plaintext, as a store without encryption would hold it
    ],
    ids=["tag", "ciphertext", "nonce", "wrapped-key", "version", "magic", "truncated", "empty", "plaintext"],
)
async def test_a_tampered_object_is_a_content_error_never_content(
    store: S3ContentStore, stage: Stage, tamper: Callable[[bytes], bytes]
) -> None:
    ref = await store.put(record(), RETENTION)
    stage.write(ref.key, tamper(stage.raw(ref.key)))
    fresh = S3ContentStore(stage.settings())  # no cached data key: the wrapped key goes to KMS
    try:
        for reader in (fresh, store):
            with pytest.raises(ContentError) as refused:
                await reader.get(ref)
            assert not isinstance(refused.value, ContentUnavailable)
            assert CANARY not in str(refused.value)
    finally:
        await fresh.aclose()


async def test_an_object_copied_under_another_key_does_not_open_there(store: S3ContentStore, stage: Stage) -> None:
    ref = await store.put(record(), RETENTION)
    other = await store.put(record("req_other"), RETENTION)
    stage.write(other.key, stage.raw(ref.key))
    with pytest.raises(ContentError, match="authentication"):
        await store.get(other)
    with pytest.raises(ContentError, match="authentication"):
        await store.get(dataclasses.replace(other, digest=ref.digest, size=ref.size))
    assert await store.get(ref) == record()


async def test_puts_share_a_data_key_until_its_use_count_is_spent_and_another_store_reads_them(
    stage: Stage,
) -> None:
    store = S3ContentStore(stage.settings(data_key_max_uses=2))
    refs: list[ContentRef] = []
    try:
        refs = [await store.put(record(f"req_{i}"), RETENTION) for i in range(5)]
    finally:
        await store.aclose()

    def wrapped(ref: ContentRef) -> bytes:
        body = stage.raw(ref.key)
        offset, length = _field(body, 1)
        return body[offset : offset + length]

    keys = [wrapped(ref) for ref in refs]
    assert keys[0] == keys[1] != keys[2] == keys[3] != keys[4]
    restarted = S3ContentStore(stage.settings())
    try:
        for i, ref in enumerate(refs):
            assert await restarted.get(ref) == record(f"req_{i}")
    finally:
        await restarted.aclose()


async def test_tenants_and_retention_classes_never_share_a_data_key(stage: Stage) -> None:
    store = S3ContentStore(stage.settings())
    try:
        refs = [
            await store.put(record("req_a1", tenant="acme"), "standard"),
            await store.put(record("req_a2", tenant="acme"), "standard"),
            await store.put(record("req_g1", tenant="globex"), "standard"),
            await store.put(record("req_a3", tenant="acme"), "restricted"),
        ]
        for ref, rid in zip(refs, ("req_a1", "req_a2", "req_g1", "req_a3"), strict=True):
            got = await store.get(ref)
            assert got is not None and got.request_id == rid
    finally:
        await store.aclose()

    def wrapped(ref: ContentRef) -> bytes:
        body = stage.raw(ref.key)
        offset, length = _field(body, 1)
        return body[offset : offset + length]

    keys = [wrapped(ref) for ref in refs]
    assert keys[0] == keys[1]  # one tenant and class: one data key while it is fresh
    assert len({keys[0], keys[2], keys[3]}) == 3


async def test_a_data_key_wrapped_for_another_purpose_does_not_unwrap(store: S3ContentStore, stage: Stage) -> None:
    ref = await store.put(record(), RETENTION)
    body = stage.raw(ref.key)
    offset, length = _field(body, 1)
    vault_key = stage.admin("kms").generate_data_key(
        KeyId=stage.key_alias, KeySpec="AES_256", EncryptionContext={"tollway:purpose": "pii-vault"}
    )["CiphertextBlob"]
    stage.write(ref.key, body[: offset - 4] + len(vault_key).to_bytes(4, "big") + vault_key + body[offset + length :])
    fresh = S3ContentStore(stage.settings())
    try:
        with pytest.raises(ContentError, match="authentication"):
            await fresh.get(ref)
    finally:
        await fresh.aclose()


async def test_a_missing_bucket_or_key_is_unavailable_and_the_message_names_no_content(stage: Stage) -> None:
    no_bucket = S3ContentStore(stage.settings(bucket=stage.bucket + "-missing"))
    no_key = S3ContentStore(stage.settings(kms_key_id=stage.key_alias + "-missing"))
    store = S3ContentStore(stage.settings())
    errors: list[ContentUnavailable] = []
    try:
        ref = await store.put(record(), RETENTION)
        elsewhere = dataclasses.replace(ref, bucket=no_bucket.bucket)
        for call, code in (
            (no_bucket.put(record(), RETENTION), "content store s3: PutObject failed: NoSuchBucket"),
            (no_bucket.get(elsewhere), "content store s3: GetObject failed: NoSuchBucket"),
            (no_bucket.delete(elsewhere), "content store s3: DeleteObject failed: NoSuchBucket"),
            (no_key.put(record(), RETENTION), "content store kms: GenerateDataKey failed: NotFoundException"),
        ):
            with pytest.raises(ContentUnavailable) as refused:
                await call
            assert str(refused.value) == code
            errors.append(refused.value)
    finally:
        for opened in (no_bucket, no_key, store):
            await opened.aclose()
    for err in errors:
        assert CANARY not in str(err) and record().request_id not in str(err)
        assert err.__cause__ is None


async def test_the_writer_stores_through_s3_and_the_reference_reads_back(stage: Stage) -> None:
    store = S3ContentStore(stage.settings())
    stored: list[ContentRef] = []
    dropped: list[str] = []
    writer = ContentWriter(
        store, on_stored=lambda _, ref: stored.append(ref), on_dropped=lambda _, reason: dropped.append(reason)
    )
    try:
        for i in range(5):
            assert writer.submit(record(f"req_{i}"), RETENTION)
        assert await writer.drain(30)
        await writer.aclose()
        assert (writer.stored, dropped) == (5, [])
        got = {ref.key: await store.get(ref) for ref in stored}
        assert sorted(r.request_id for r in got.values() if r is not None) == [f"req_{i}" for i in range(5)]
    finally:
        await store.aclose()


async def test_warm_builds_both_clients_and_a_closed_store_refuses(stage: Stage) -> None:
    store = S3ContentStore(stage.settings())
    await store.warm()
    assert set(store._aws.built) == {"s3", "kms"}
    ref = await store.put(record(), RETENTION)
    assert await store.get(ref) == record()
    await store.aclose()
    with pytest.raises(ContentUnavailable, match="closed"):
        await store.warm()
