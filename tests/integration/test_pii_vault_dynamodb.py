"""The DynamoDB PII vault on a real moto server: the shared vault contract, and what only a stored,
encrypted item can show (no value in clear, tampering fails closed, revoke discards the
ciphertext, data keys are cached within bounds, another process reads what this one wrote).

Each test bootstraps only the ``pii-vault`` table and KMS key of a fresh stage from
``topology()``, so both are the ones the stack deploys. The test reads and tampers with the raw
items through its own admin client, which the gateway's role could not do (no Scan).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.pii_vault_contract import (
    BINDING,
    NOW,
    OTHER_BINDING,
    OTHER_TOKEN,
    TOKEN,
    UNICODE_VALUES,
    VALUE,
    Reopen,
    VaultContract,
    entry,
)
from tests.support.processes import ROOT
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology
from tollway.pii.vault import DynamoDBPiiVault, DynamoDBVaultSettings, TokenExists, VaultUnavailable

pytestmark = pytest.mark.local_cloud


@dataclasses.dataclass(frozen=True)
class Stage:
    cloud: LocalCloud
    table: str
    key_alias: str

    def settings(self, **changes: Any) -> DynamoDBVaultSettings:
        return DynamoDBVaultSettings.from_env(table=self.table, kms_key_id=self.key_alias).model_copy(update=changes)

    def admin(self, service: str = "dynamodb") -> Any:
        return Clients(self.cloud.endpoint, self.cloud.region, self.cloud.env()).client(service)

    def raw(self, token_id: str = TOKEN) -> dict[str, Any]:
        found: dict[str, Any] = self.admin().get_item(
            TableName=self.table, Key={"pk": {"S": "TOK#" + token_id}}, ConsistentRead=True
        )["Item"]
        return found

    def scan(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.admin().scan(TableName=self.table, ConsistentRead=True)["Items"]
        return items

    def tamper(self, token_id: str, attribute: str, value: dict[str, Any]) -> None:
        self.admin().update_item(
            TableName=self.table,
            Key={"pk": {"S": "TOK#" + token_id}},
            UpdateExpression="SET #a = :v",
            ExpressionAttributeNames={"#a": attribute},
            ExpressionAttributeValues={":v": value},
        )


@pytest.fixture
def stage(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Stage:
    full = topology(prefix)
    only_vault = dataclasses.replace(
        full, queues=(), tables=(full.table("pii-vault"),), buckets=(), secrets=(), functions=()
    )
    bootstrap(only_vault, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for key, value in cloud.env().items():
        monkeypatch.setenv(key, value)
    return Stage(cloud, full.table("pii-vault").name, full.kms_key("pii-vault").alias)


@pytest.fixture
async def vault(stage: Stage) -> AsyncIterator[DynamoDBPiiVault]:
    opened = DynamoDBPiiVault(stage.settings())
    yield opened
    await opened.aclose()


@pytest.fixture
def reopen(stage: Stage) -> Reopen:
    async def fresh() -> DynamoDBPiiVault:
        return DynamoDBPiiVault(stage.settings())

    return fresh


class TestDynamoDBVaultContract(VaultContract):
    durable = True


def _stored_bytes(item: dict[str, Any]) -> list[bytes]:
    """Every attribute value of a raw item as bytes (strings in UTF-8 and UTF-16, binaries as they are)."""
    out: list[bytes] = []
    for attribute in item.values():
        ((kind, value),) = attribute.items()
        if kind == "B":
            out.append(bytes(value))
        else:
            out += [str(value).encode("utf-8"), str(value).encode("utf-16-le")]
    return out


async def test_an_item_holds_the_layout_and_no_value_in_clear(vault: DynamoDBPiiVault, stage: Stage) -> None:
    values = (VALUE, *UNICODE_VALUES)
    for i, value in enumerate(values):
        await vault.insert(entry(f"CLEAR{i:011d}", expires_at=NOW + 3600.5), value)

    items = stage.scan()
    assert len(items) == len(values)
    for item in items:
        stored = _stored_bytes(item)
        for value in values:
            for encoded in (value.encode("utf-8"), value.encode("utf-16-le"), value.encode("utf-8").hex().encode()):
                assert not any(encoded in b for b in stored), "a value is stored in clear"
    item = stage.raw("CLEAR00000000000")
    assert set(item) == {
        "pk", "itemFormat", "tokenFormat", "scope", "kind", "tenant", "binding", "state",
        "keyId", "wrappedKey", "nonce", "ciphertext", "createdAt", "expiresAt",
    }  # fmt: skip
    assert item["pk"] == {"S": "TOK#CLEAR00000000000"}
    assert item["binding"] == {"B": BINDING}, "the digest, never the session id it was made from"
    assert (item["kind"], item["tenant"], item["scope"]) == ({"S": "EMAIL"}, {"S": "acme"}, {"S": "session"})
    assert (item["state"], item["itemFormat"], item["tokenFormat"]) == ({"S": "active"}, {"N": "1"}, {"N": "1"})
    assert item["expiresAt"] == {"N": str(int(NOW) + 3601)}, "whole seconds, rounded up: the TTL attribute"
    assert item["keyId"]["S"].startswith("arn:aws:kms:") and ":key/" in item["keyId"]["S"]
    assert len(item["nonce"]["B"]) == 12
    assert len(item["ciphertext"]["B"]) == len(VALUE.encode()) + 16


async def test_a_refused_duplicate_leaves_the_stored_item_as_it_was(vault: DynamoDBPiiVault, stage: Stage) -> None:
    await vault.insert(entry(), VALUE)
    before = stage.raw()
    with pytest.raises(TokenExists, match="already has an entry"):
        await vault.insert(entry(binding=OTHER_BINDING), "other")
    assert stage.raw() == before


@pytest.mark.parametrize(
    ("attribute", "tampered"),
    [
        ("ciphertext", lambda item: {"B": bytes([item["ciphertext"]["B"][0] ^ 1]) + item["ciphertext"]["B"][1:]}),
        ("nonce", lambda item: {"B": bytes(12)}),
        ("wrappedKey", lambda item: {"B": item["wrappedKey"]["B"][:-1] + bytes([item["wrappedKey"]["B"][-1] ^ 1])}),
        ("kind", lambda item: {"S": "PHONE"}),  # associated data
        ("tenant", lambda item: {"S": "globex"}),
        ("scope", lambda item: {"S": "host"}),
        ("tokenFormat", lambda item: {"N": "2"}),
        ("itemFormat", lambda item: {"N": "9"}),
        ("expiresAt", lambda item: {"S": "never"}),
    ],
)
async def test_a_tampered_item_resolves_to_nothing_and_says_so_without_naming_it(
    vault: DynamoDBPiiVault, stage: Stage, attribute: str, tampered: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await vault.insert(entry(), VALUE)
    stage.tamper(TOKEN, attribute, tampered(stage.raw()))
    fresh = DynamoDBPiiVault(stage.settings())  # no cached data key: the wrapped key goes to KMS
    try:
        with caplog.at_level(logging.WARNING, logger="tollway.pii.vault"):
            assert await fresh.resolve(TOKEN, BINDING, NOW) is None
            assert await vault.resolve(TOKEN, BINDING, NOW) is None
    finally:
        await fresh.aclose()
    assert fresh.integrity_failures == vault.integrity_failures == 1
    assert caplog.records, "an integrity failure is logged"
    for record in caplog.records:
        assert TOKEN not in record.getMessage() and VALUE not in record.getMessage()


async def test_a_ciphertext_moved_to_another_item_does_not_open_there(vault: DynamoDBPiiVault, stage: Stage) -> None:
    await vault.insert(entry(), VALUE)
    await vault.insert(entry(OTHER_TOKEN), "the other value")
    source = stage.raw(OTHER_TOKEN)
    for attribute in ("keyId", "wrappedKey", "nonce", "ciphertext"):
        stage.tamper(TOKEN, attribute, source[attribute])
    assert await vault.resolve(TOKEN, BINDING, NOW) is None
    assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) == "the other value"


async def test_revoke_discards_the_ciphertext_and_its_wrapped_key(vault: DynamoDBPiiVault, stage: Stage) -> None:
    await vault.insert(entry(), VALUE)
    await vault.revoke(TOKEN)
    item = stage.raw()
    assert item["state"] == {"S": "revoked"}
    assert not {"ciphertext", "nonce", "wrappedKey"} & set(item)
    assert "revokedAt" in item and item["expiresAt"] == {"N": str(int(NOW) + 3600)}, "the TTL still removes it"
    await vault.revoke(OTHER_TOKEN)
    assert len(stage.scan()) == 1, "revoking an unknown token creates no item"


async def test_an_expired_item_that_the_store_still_holds_resolves_to_nothing(
    vault: DynamoDBPiiVault, stage: Stage
) -> None:
    await vault.insert(entry(expires_at=NOW + 5), VALUE)
    assert await vault.resolve(TOKEN, BINDING, NOW + 5) is None
    assert stage.raw()["state"] == {"S": "active"}, "moto never expires an item: the read enforces the TTL"


async def test_inserts_share_a_data_key_until_its_use_count_is_spent(stage: Stage) -> None:
    vault = DynamoDBPiiVault(stage.settings(data_key_max_uses=3))
    try:
        for i in range(7):
            await vault.insert(entry(f"KEYUSE{i:010d}"), f"value {i}")
        wrapped = [stage.raw(f"KEYUSE{i:010d}")["wrappedKey"]["B"] for i in range(7)]
        assert wrapped[0] == wrapped[1] == wrapped[2] != wrapped[3] == wrapped[4] == wrapped[5] != wrapped[6]
        restarted = DynamoDBPiiVault(stage.settings())
        try:
            for i in range(7):
                assert await restarted.resolve(f"KEYUSE{i:010d}", BINDING, NOW) == f"value {i}"
        finally:
            await restarted.aclose()
    finally:
        await vault.aclose()


async def test_another_process_resolves_what_this_one_inserted_and_the_reverse(
    vault: DynamoDBPiiVault, stage: Stage
) -> None:
    await vault.insert(entry(), VALUE)
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from tollway.pii.vault import DynamoDBPiiVault, DynamoDBVaultSettings, VaultEntry

        async def main():
            settings = DynamoDBVaultSettings.from_env(table={stage.table!r}, kms_key_id={stage.key_alias!r})
            vault = DynamoDBPiiVault(settings)
            got = await vault.resolve({TOKEN!r}, bytes.fromhex({BINDING.hex()!r}), {NOW!r})
            entry = VaultEntry({OTHER_TOKEN!r}, "PHONE", bytes.fromhex({BINDING.hex()!r}), "acme", {NOW + 60!r})
            await vault.insert(entry, "+44 20 7946 0958")
            await vault.aclose()
            print(json.dumps({{"resolved": got}}))

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"resolved": VALUE}
    assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) == "+44 20 7946 0958"


async def test_a_missing_table_or_key_is_unavailable_and_the_message_names_neither_token_nor_value(
    stage: Stage,
) -> None:
    no_table = DynamoDBPiiVault(stage.settings(table=stage.table + "-missing"))
    no_key = DynamoDBPiiVault(stage.settings(kms_key_id=stage.key_alias + "-missing"))
    try:
        with pytest.raises(VaultUnavailable, match="ResourceNotFoundException") as table_err:
            await no_table.insert(entry(), VALUE)
        with pytest.raises(VaultUnavailable, match="ResourceNotFoundException"):
            await no_table.resolve(TOKEN, BINDING, NOW)
        with pytest.raises(VaultUnavailable, match="GenerateDataKey failed: NotFoundException") as key_err:
            await no_key.insert(entry(), VALUE)
    finally:
        await no_table.aclose()
        await no_key.aclose()
    for err in (table_err, key_err):
        assert TOKEN not in str(err.value) and VALUE not in str(err.value)
        assert err.value.__cause__ is None


def test_settings_come_from_the_environment_the_stack_sets() -> None:
    env = topology("envcheck").environment("123456789012", "eu-west-1")
    settings = DynamoDBVaultSettings.from_env(env)
    assert (settings.table, settings.kms_key_id) == ("envcheck-pii-vault", "alias/envcheck-pii-vault")
    with pytest.raises(VaultUnavailable, match="TOLLWAY_TABLE_PII_VAULT"):
        DynamoDBVaultSettings.from_env({"TOLLWAY_PII_KMS_KEY_ID": "alias/x"})
    with pytest.raises(VaultUnavailable, match="TOLLWAY_PII_KMS_KEY_ID"):
        DynamoDBVaultSettings.from_env({"TOLLWAY_TABLE_PII_VAULT": "x-pii-vault"})


async def test_warm_builds_the_clients_before_the_first_request(stage: Stage) -> None:
    vault = DynamoDBPiiVault(stage.settings())
    await vault.warm()
    assert set(vault._aws.built) == {"dynamodb", "kms"}
    await vault.insert(entry(), VALUE)
    assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE
    await vault.aclose()
    with pytest.raises(VaultUnavailable, match="closed"):
        await vault.warm()
