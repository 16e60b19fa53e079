"""The in-memory PII vault: the shared vault contract, plus its bounds and its expiry sweep."""

from __future__ import annotations

import pytest

from tests.support.pii_vault_contract import BINDING, NOW, OTHER_TOKEN, TOKEN, VALUE, Reopen, VaultContract, entry
from tollway.pii.vault import MemoryPiiVault, TokenExists, VaultEntry, VaultUnavailable, expiry_deadline


@pytest.fixture
def vault() -> MemoryPiiVault:
    return MemoryPiiVault()


@pytest.fixture
def reopen() -> Reopen:
    async def fresh() -> MemoryPiiVault:
        return MemoryPiiVault()

    return fresh


class TestMemoryVaultContract(VaultContract):
    durable = False


async def test_a_full_vault_drops_expired_entries_first_and_never_evicts_a_live_one() -> None:
    clock = [NOW]
    vault = MemoryPiiVault(max_entries=2, clock=lambda: clock[0])
    await vault.insert(entry("AAAAAAAAAAAAAAAA", expires_at=NOW + 10), "first")
    await vault.insert(entry("BBBBBBBBBBBBBBBB", expires_at=NOW + 100), "second")
    with pytest.raises(VaultUnavailable, match="full") as full:
        await vault.insert(entry(TOKEN), VALUE)
    assert TOKEN not in str(full.value) and VALUE not in str(full.value)
    assert await vault.resolve("AAAAAAAAAAAAAAAA", BINDING, NOW) == "first"

    clock[0] = NOW + 10  # the first entry's deadline
    await vault.insert(entry(TOKEN), VALUE)
    assert len(vault) == 2
    assert await vault.resolve("BBBBBBBBBBBBBBBB", BINDING, NOW) == "second"
    assert await vault.resolve(TOKEN, BINDING, NOW) == VALUE


async def test_expire_removes_entries_at_their_deadline_and_frees_their_token_ids() -> None:
    vault = MemoryPiiVault()
    await vault.insert(entry(TOKEN, expires_at=NOW + 0.5), VALUE)
    await vault.insert(entry(OTHER_TOKEN, expires_at=NOW + 60), "later")
    await vault.revoke(OTHER_TOKEN)
    with pytest.raises(TokenExists):
        await vault.insert(entry(TOKEN, expires_at=NOW + 60), "again")

    assert vault.expire(NOW + 0.9) == 0  # the deadline is NOW + 1
    assert vault.expire(NOW + 1) == 1
    assert len(vault) == 1  # the revoked one waits for its own deadline
    await vault.insert(entry(TOKEN, expires_at=NOW + 60), "again")
    assert await vault.resolve(TOKEN, BINDING, NOW) == "again"
    assert vault.expire(NOW + 60) == 2


async def test_a_revoked_value_is_not_kept_in_memory() -> None:
    vault = MemoryPiiVault()
    await vault.insert(entry(), VALUE)
    await vault.revoke(TOKEN)
    assert all(VALUE != getattr(stored, "value", None) for stored in vault._entries.values())


def test_an_entry_shows_neither_its_token_id_nor_its_binding() -> None:
    shown = repr(entry())
    assert TOKEN not in shown
    assert BINDING.hex() not in shown and repr(BINDING) not in shown
    assert "EMAIL" in shown and "acme" in shown


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"token_id": ""}, "token id"),
        ({"token_id": "has space"}, "token id"),
        ({"token_id": "x" * 129}, "token id"),
        ({"kind": "E-MAIL ADDRESS"}, "kind"),
        ({"binding": b"short"}, "binding"),
        ({"binding": "not bytes"}, "binding"),
        ({"binding": b"x" * 65}, "binding"),
        ({"tenant": ""}, "tenant"),
        ({"expires_at": float("nan")}, "expires_at"),
        ({"expires_at": 0}, "expires_at"),
        ({"scope": "request"}, "scope"),
        ({"token_format": 0}, "token_format"),
    ],
)
def test_an_entry_out_of_range_is_refused_without_quoting_it(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "token_id": TOKEN,
        "kind": "EMAIL",
        "binding": BINDING,
        "tenant": "acme",
        "expires_at": NOW,
        **changes,
    }
    with pytest.raises(ValueError, match=message) as refused:
        VaultEntry(**fields)  # type: ignore[arg-type]
    if changes.get("token_id"):
        assert str(changes["token_id"]) not in str(refused.value)


def test_expiry_has_whole_seconds_rounded_up_so_nothing_expires_early() -> None:
    assert expiry_deadline(NOW) == int(NOW)
    assert expiry_deadline(NOW + 0.001) == int(NOW) + 1
    assert entry(expires_at=NOW + 10.2).deadline == int(NOW) + 11
