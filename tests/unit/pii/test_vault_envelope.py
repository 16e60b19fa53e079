"""Envelope encryption of vault values: AES-256-GCM bound to its item, and bounded data-key caches.

A fake KMS counts the calls: the point of the caches is how few there are, and the point of
their bounds is that there are more once a key is old, used up, or pushed out.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from tollway.pii.vault import VaultUnavailable
from tollway.pii.vault.envelope import Envelope, KeyCachePolicy, Sealed, associated_data

KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
BINDING = bytes(range(32))


def aad(**changes: object) -> bytes:
    fields: dict[str, object] = {
        "token_id": "K3Q7ZB2M5XW4A6RT",
        "binding": BINDING,
        "kind": "EMAIL",
        "tenant": "acme",
        "scope": "session",
        "token_format": 1,
        **changes,
    }
    return associated_data(**fields)  # type: ignore[arg-type]


class FakeKms:
    """Wraps by XOR with a fixed pad and a tag, which is enough to tell a wrapped key it made."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.generated = 0
        self.unwrapped = 0
        self.delay_s = delay_s
        self.fail: Exception | None = None
        self._pad = os.urandom(32)

    async def generate(self) -> tuple[bytes, bytes, str]:
        if self.fail is not None:
            raise self.fail
        await asyncio.sleep(self.delay_s)
        self.generated += 1
        key = os.urandom(32)
        return key, b"W" + bytes(a ^ b for a, b in zip(key, self._pad, strict=True)), KEY_ARN

    async def unwrap(self, wrapped: bytes, key_id: str) -> bytes | None:
        if self.fail is not None:
            raise self.fail
        await asyncio.sleep(self.delay_s)
        self.unwrapped += 1
        if key_id != KEY_ARN or len(wrapped) != 33 or wrapped[:1] != b"W":
            return None
        return bytes(a ^ b for a, b in zip(wrapped[1:], self._pad, strict=True))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_seals_share_one_data_key_until_it_has_been_used_max_uses_times() -> None:
    kms = FakeKms()
    envelope = Envelope(kms, KeyCachePolicy(max_uses=3))
    sealed = [await envelope.seal(b"value %d" % i, aad()) for i in range(7)]
    assert kms.generated == 3
    assert [s.wrapped_key for s in sealed[:3]] == [sealed[0].wrapped_key] * 3
    assert len({s.wrapped_key for s in sealed}) == 3
    assert len({s.nonce for s in sealed}) == 7, "a fresh nonce for every value"


async def test_a_data_key_is_replaced_once_it_is_max_age_old() -> None:
    kms, clock = FakeKms(), Clock()
    envelope = Envelope(kms, KeyCachePolicy(max_age_s=60), clock=clock)
    first = await envelope.seal(b"a", aad())
    clock.now += 59.9
    assert (await envelope.seal(b"b", aad())).wrapped_key == first.wrapped_key
    clock.now += 0.1
    assert (await envelope.seal(b"c", aad())).wrapped_key != first.wrapped_key
    assert kms.generated == 2


async def test_concurrent_seals_at_a_cold_start_ask_kms_once() -> None:
    kms = FakeKms(delay_s=0.01)
    envelope = Envelope(kms)
    sealed = await asyncio.gather(*(envelope.seal(b"v", aad()) for _ in range(20)))
    assert kms.generated == 1
    assert len({s.wrapped_key for s in sealed}) == 1


async def test_what_was_just_sealed_opens_without_a_kms_call() -> None:
    kms = FakeKms()
    envelope = Envelope(kms)
    sealed = await envelope.seal("José ✓".encode(), aad())
    assert await envelope.open(sealed, aad()) == "José ✓".encode()
    assert kms.unwrapped == 0


async def test_a_new_envelope_unwraps_each_data_key_once_however_many_opens_wait_for_it() -> None:
    kms = FakeKms(delay_s=0.01)
    sealed = [await Envelope(kms).seal(b"v%d" % i, aad()) for i in range(2)]  # two envelopes: two data keys
    restarted = Envelope(kms)
    opened = await asyncio.gather(*(restarted.open(sealed[i % 2], aad()) for i in range(30)))
    assert opened == [b"v%d" % (i % 2) for i in range(30)]
    assert kms.unwrapped == 2


async def test_the_unwrap_cache_is_bounded_in_size_least_recently_used_out_first() -> None:
    kms = FakeKms()
    sealed = [await Envelope(kms).seal(b"v%d" % i, aad()) for i in range(3)]
    envelope = Envelope(kms, KeyCachePolicy(unwrap_cache_size=2))
    for s in (sealed[0], sealed[1], sealed[0], sealed[2]):  # 2 goes in, 1 (least recent) out
        assert await envelope.open(s, aad()) is not None
    assert kms.unwrapped == 3
    await envelope.open(sealed[0], aad())
    assert kms.unwrapped == 3
    await envelope.open(sealed[1], aad())
    assert kms.unwrapped == 4


async def test_an_unwrapped_key_is_forgotten_after_its_ttl() -> None:
    kms, clock = FakeKms(), Clock()
    sealed = await Envelope(kms).seal(b"v", aad())
    envelope = Envelope(kms, KeyCachePolicy(unwrap_ttl_s=30), clock=clock)
    await envelope.open(sealed, aad())
    clock.now += 29
    await envelope.open(sealed, aad())
    assert kms.unwrapped == 1
    clock.now += 1
    await envelope.open(sealed, aad())
    assert kms.unwrapped == 2


async def test_forget_drops_every_key() -> None:
    kms = FakeKms()
    envelope = Envelope(kms)
    sealed = await envelope.seal(b"v", aad())
    envelope.forget()
    assert await envelope.open(sealed, aad()) == b"v"
    assert kms.unwrapped == 1
    await envelope.seal(b"w", aad())
    assert kms.generated == 2


@pytest.mark.parametrize(
    "changes",
    [
        {"token_id": "PZ4D7LQ2HX3NBA2C"},
        {"binding": bytes(31) + b"\x01"},
        {"kind": "PHONE"},
        {"tenant": "globex"},
        {"scope": "host"},
        {"token_format": 2},
    ],
)
async def test_a_ciphertext_opens_only_with_the_associated_data_of_its_item(changes: dict[str, object]) -> None:
    envelope = Envelope(FakeKms())
    sealed = await envelope.seal(b"secret", aad())
    assert await envelope.open(sealed, aad(**changes)) is None
    assert await envelope.open(sealed, aad()) == b"secret"


def _flip(data: bytes, at: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


async def test_a_tampered_ciphertext_nonce_or_wrapped_key_fails_closed() -> None:
    kms = FakeKms()
    sealed = await Envelope(kms).seal(b"secret", aad())
    envelope = Envelope(kms)
    tampered = [
        Sealed(sealed.key_id, sealed.wrapped_key, sealed.nonce, _flip(sealed.ciphertext)),
        Sealed(sealed.key_id, sealed.wrapped_key, sealed.nonce, _flip(sealed.ciphertext, -1)),  # the tag
        Sealed(sealed.key_id, sealed.wrapped_key, sealed.nonce, sealed.ciphertext[:-1]),
        Sealed(sealed.key_id, sealed.wrapped_key, _flip(sealed.nonce), sealed.ciphertext),
        Sealed(sealed.key_id, sealed.wrapped_key, sealed.nonce[:-1], sealed.ciphertext),
        Sealed(sealed.key_id, _flip(sealed.wrapped_key, 5), sealed.nonce, sealed.ciphertext),  # another key
        Sealed(sealed.key_id, b"X" + sealed.wrapped_key[1:], sealed.nonce, sealed.ciphertext),  # KMS refuses it
        Sealed(sealed.key_id + "0", sealed.wrapped_key, sealed.nonce, sealed.ciphertext),
    ]
    for bad in tampered:
        assert await envelope.open(bad, aad()) is None
    assert await envelope.open(sealed, aad()) == b"secret"


async def test_a_kms_failure_is_unavailable_for_every_waiter_and_is_not_cached() -> None:
    kms = FakeKms()
    sealed = await Envelope(kms).seal(b"v", aad())
    envelope = Envelope(kms)
    kms.fail = VaultUnavailable("pii vault kms key: Decrypt failed: ThrottlingException")
    results = await asyncio.gather(*(envelope.open(sealed, aad()) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, VaultUnavailable) for r in results)
    with pytest.raises(VaultUnavailable):
        await envelope.seal(b"w", aad())
    kms.fail = None
    assert await envelope.open(sealed, aad()) == b"v"


async def test_a_cancelled_open_does_not_cancel_the_unwrap_others_wait_for() -> None:
    kms = FakeKms(delay_s=0.05)
    sealed = await Envelope(kms).seal(b"v", aad())
    envelope = Envelope(kms)
    first = asyncio.ensure_future(envelope.open(sealed, aad()))
    second = asyncio.ensure_future(envelope.open(sealed, aad()))
    await asyncio.sleep(0.01)
    first.cancel()
    assert await second == b"v"
    assert kms.unwrapped == 1


def test_nothing_sealed_shows_in_a_repr() -> None:
    sealed = Sealed(KEY_ARN, b"wrapped-key-bytes", b"nonce-bytes!", b"ciphertext-bytes")
    assert repr(sealed) == "Sealed(...)"


def test_associated_data_parses_one_way() -> None:
    assert aad(kind="AB", tenant="c") != aad(kind="A", tenant="Bc")
    assert aad(tenant="ab") != aad(tenant="a", binding=b"b" + BINDING)
