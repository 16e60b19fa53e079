"""The :class:`~tollway.pii.vault.PiiVault` contract, run against every implementation.

A test module subclasses :class:`VaultContract` and provides two fixtures: ``vault`` (a fresh,
empty vault) and ``reopen`` (an async callable that opens a *new* vault instance on the same
backing store, as a restarted process or another replica would: no state, no key caches).
``durable`` says whether what one instance inserted must outlive it; the memory vault is not
durable, and the restart test proves that it does not pretend to be.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest

from tollway.pii.vault import MAX_VALUE_BYTES, PiiVault, TokenExists, VaultEntry, VaultUnavailable

NOW = 1_900_000_000.0
"""The injected clock: every resolve passes its own ``now``."""
TOKEN = "K3Q7ZB2M5XW4A6RT"
OTHER_TOKEN = "PZ4D7LQ2HX3NBA2C"
BINDING = hashlib.sha256(b"session\x00acme\x00alice\x00sess-1").digest()
OTHER_BINDING = hashlib.sha256(b"session\x00acme\x00alice\x00sess-2").digest()
VALUE = "jane.doe@example.com"
UNICODE_VALUES = (
    "José Ñúñez-Müller",
    "山田 太郎",
    "+44 20 7946 0958 📞",
    "Zoë\u200dO'Brien\tline\nbreak",
    "\U0001d11e outside the BMP " + "é" * 100,
)

Reopen = Callable[[], Awaitable[PiiVault]]


def entry(
    token_id: str = TOKEN,
    *,
    binding: bytes = BINDING,
    expires_at: float = NOW + 3600,
    kind: str = "EMAIL",
    tenant: str = "acme",
) -> VaultEntry:
    return VaultEntry(token_id=token_id, kind=kind, binding=binding, tenant=tenant, expires_at=expires_at)


class VaultContract:
    durable: ClassVar[bool]

    async def test_a_value_resolves_under_its_exact_token_and_binding(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE
        assert await vault.resolve(TOKEN, BINDING, NOW + 60) == VALUE  # a read changes nothing

    async def test_another_binding_resolves_nothing(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        assert await vault.resolve(TOKEN, OTHER_BINDING, NOW) is None
        assert await vault.resolve(TOKEN, BINDING[:-1] + bytes([BINDING[-1] ^ 1]), NOW) is None
        assert await vault.resolve(TOKEN, b"", NOW) is None
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE

    async def test_an_unknown_near_or_malformed_token_resolves_nothing(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        for token in (OTHER_TOKEN, TOKEN.lower(), TOKEN[:-1], TOKEN + "A", "", "TOK#" + TOKEN, "é" * 16, "*"):
            assert await vault.resolve(token, BINDING, NOW) is None, token

    async def test_a_revoked_token_resolves_nothing_and_revoking_again_changes_nothing(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        await vault.insert(entry(OTHER_TOKEN), "kept")
        await vault.revoke(TOKEN)
        assert await vault.resolve(TOKEN, BINDING, NOW) is None
        await vault.revoke(TOKEN)
        assert await vault.resolve(TOKEN, BINDING, NOW) is None
        assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) == "kept"

    async def test_revoking_an_unknown_token_is_a_no_op(self, vault: PiiVault) -> None:
        await vault.revoke(TOKEN)
        await vault.insert(entry(), VALUE)  # the revoke created nothing that blocks an insert
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE

    async def test_expiry_is_enforced_on_every_read_in_whole_seconds_rounded_up(self, vault: PiiVault) -> None:
        await vault.insert(entry(expires_at=NOW + 10.2), VALUE)  # the deadline is NOW + 11
        assert await vault.resolve(TOKEN, BINDING, NOW + 10.9) == VALUE
        assert await vault.resolve(TOKEN, BINDING, NOW + 11) is None
        assert await vault.resolve(TOKEN, BINDING, NOW + 86_400 * 365) is None
        # The clock is the caller's: an earlier ``now`` (another replica's) still sees it.
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE

    async def test_an_entry_already_past_its_deadline_never_resolves(self, vault: PiiVault) -> None:
        await vault.insert(entry(expires_at=NOW - 1), VALUE)
        assert await vault.resolve(TOKEN, BINDING, NOW) is None

    async def test_an_insert_never_overwrites_and_says_so_without_naming_the_token(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        with pytest.raises(TokenExists) as refused:
            await vault.insert(entry(binding=OTHER_BINDING, kind="PHONE"), "an attacker's value")
        assert TOKEN not in str(refused.value) and VALUE not in str(refused.value)
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE
        assert await vault.resolve(TOKEN, OTHER_BINDING, NOW) is None
        await vault.revoke(TOKEN)
        with pytest.raises(TokenExists):  # a revoked entry still holds its token id
            await vault.insert(entry(), VALUE)
        assert await vault.resolve(TOKEN, BINDING, NOW) is None

    async def test_a_refused_insert_reports_until_when_the_live_entry_lives(self, vault: PiiVault) -> None:
        await vault.insert(entry(expires_at=NOW + 10.2), VALUE)
        with pytest.raises(TokenExists) as live:
            await vault.insert(entry(), VALUE)
        assert live.value.expires_at == NOW + 11  # the stored deadline: rounded up to a whole second
        await vault.revoke(TOKEN)
        with pytest.raises(TokenExists) as revoked:
            await vault.insert(entry(), VALUE)
        assert revoked.value.expires_at is None  # nothing to remember: it stays revoked

    async def test_an_expired_entry_not_yet_purged_is_replaced_by_an_insert(self, vault: PiiVault) -> None:
        # Expired by the vault's own (real) clock: a session's id for the same value is the same
        # after its TTL, and must be storable again even where the table purges late or never.
        await vault.insert(entry(expires_at=time.time() - 5), "the old value")
        await vault.insert(entry(expires_at=NOW + 3600), VALUE)
        assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE
        await vault.insert(entry(OTHER_TOKEN, expires_at=time.time() - 5), "revoked and expired")
        await vault.revoke(OTHER_TOKEN)
        with pytest.raises(TokenExists):  # a revoked entry is never replaced, expired or not
            await vault.insert(entry(OTHER_TOKEN, expires_at=NOW + 3600), "again")
        assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) is None

    async def test_unicode_values_come_back_exactly(self, vault: PiiVault) -> None:
        tokens = [f"UNICODE{i:09d}" for i in range(len(UNICODE_VALUES))]
        for token, value in zip(tokens, UNICODE_VALUES, strict=True):
            await vault.insert(entry(token), value)
        for token, value in zip(tokens, UNICODE_VALUES, strict=True):
            assert await vault.resolve(token, BINDING, NOW) == value

    async def test_the_largest_value_fits_and_a_larger_one_is_refused_without_being_quoted(
        self, vault: PiiVault
    ) -> None:
        largest = "€" * (MAX_VALUE_BYTES // 3)  # 3 bytes each in UTF-8
        await vault.insert(entry(), largest)
        assert await vault.resolve(TOKEN, BINDING, NOW) == largest
        too_long = "x" * (MAX_VALUE_BYTES + 1)
        for bad in (too_long, "", "lone \ud800 surrogate"):
            with pytest.raises(ValueError) as refused:
                await vault.insert(entry(OTHER_TOKEN), bad)
            assert not bad or bad not in str(refused.value)
        assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) is None

    async def test_tenants_and_kinds_are_kept_apart_by_the_binding_not_by_a_lookup(self, vault: PiiVault) -> None:
        await vault.insert(entry(tenant="acme", kind="EMAIL"), VALUE)
        await vault.insert(entry(OTHER_TOKEN, tenant="globex", kind="CARD", binding=OTHER_BINDING), "4111 1111")
        assert await vault.resolve(TOKEN, OTHER_BINDING, NOW) is None
        assert await vault.resolve(OTHER_TOKEN, BINDING, NOW) is None
        assert await vault.resolve(OTHER_TOKEN, OTHER_BINDING, NOW) == "4111 1111"

    async def test_a_new_instance_resolves_what_another_inserted_only_if_the_vault_is_durable(
        self, vault: PiiVault, reopen: Reopen
    ) -> None:
        await vault.insert(entry(), VALUE)
        await vault.aclose()
        restarted = await reopen()
        try:
            assert await restarted.resolve(TOKEN, BINDING, NOW) == (VALUE if self.durable else None)
            assert await restarted.resolve(TOKEN, OTHER_BINDING, NOW) is None
            assert await restarted.resolve(TOKEN, BINDING, NOW + 3600) is None
        finally:
            await restarted.aclose()

    async def test_a_closed_vault_is_unavailable(self, vault: PiiVault) -> None:
        await vault.insert(entry(), VALUE)
        await vault.aclose()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: vault.insert(entry(OTHER_TOKEN), VALUE),
            lambda: vault.resolve(TOKEN, BINDING, NOW),
            lambda: vault.revoke(TOKEN),
        ]
        for call in calls:
            with pytest.raises(VaultUnavailable) as closed:
                await call()
            assert TOKEN not in str(closed.value) and VALUE not in str(closed.value)
