"""Placeholders: the grammar, minting, and verification that no altered or foreign token passes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tollway.pii.placeholders import (
    MAX_PLACEHOLDER_LEN,
    MIN_PLACEHOLDER_LEN,
    PLACEHOLDER_RE,
    PlaceholderKey,
    PlaceholderMinter,
    encode_id,
    is_placeholder_prefix,
    normalise_kind,
    random_id,
    random_ids,
    scope_binding,
)
from tollway.pii.recovery import ID_BATCH, Mapping

SECRET = b"k" * 32
BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
KIND_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
BINDING = scope_binding("request", "req-1")
KNOWN_MAC = "YB2ATPOQ33S6A"


@pytest.fixture(scope="module")
def minter() -> PlaceholderMinter:
    return PlaceholderMinter([PlaceholderKey(SECRET, "k1")])


def parts(token: str) -> tuple[str, str, str]:
    match = PLACEHOLDER_RE.fullmatch(token)
    assert match is not None
    kind, token_id, mac = match.groups()
    return kind, token_id, mac


# --- grammar -------------------------------------------------------------------------------


@given(st.binary(min_size=10, max_size=10))
def test_id_encoding_is_rfc4648_base32(raw: bytes) -> None:
    assert encode_id(raw) == base64.b32encode(raw).decode("ascii")


@given(
    st.text(BASE32, min_size=16, max_size=16),
    st.binary(min_size=32, max_size=32),
    # Keys shorter than, as long as and longer than SHA-256's 64-byte block (RFC 2104 hashes those first).
    st.binary(min_size=32, max_size=200) | st.sampled_from([b"k" * 64, b"k" * 65]),
)
def test_mac_is_the_first_65_bits_of_the_hmac_in_base32(token_id: str, binding: bytes, secret: bytes) -> None:
    msg = f"tollway.pii.placeholder\x00TWPII1\x00{token_id}\x00EMAIL\x00".encode("ascii") + binding
    digest = hmac.new(secret, msg, hashlib.sha256).digest()
    assert PlaceholderKey(secret).mac(token_id, "EMAIL", binding) == base64.b32encode(digest[:9]).decode()[:13]


def test_the_mac_of_a_known_vector_is_unchanged() -> None:
    # Placeholders minted by an earlier release must still verify: this MAC was computed then.
    assert PlaceholderKey(SECRET).mac("ABCDEFGHIJKLMNOP", "EMAIL", b"\x00" * 32) == KNOWN_MAC


def test_lengths_follow_from_the_grammar() -> None:
    assert MIN_PLACEHOLDER_LEN == len("[TWPII1_") + 1 + 1 + 16 + 1 + 13 + 1 == 41
    assert MAX_PLACEHOLDER_LEN == len("[TWPII1_") + 12 + 1 + 16 + 1 + 13 + 1 == 52


def test_minted_placeholder_follows_the_grammar(minter: PlaceholderMinter) -> None:
    token = minter.mint("email", BINDING)
    kind, token_id, mac = parts(token)
    assert token.startswith("[TWPII1_EMAIL_") and token.endswith("]")
    assert token.isascii() and MIN_PLACEHOLDER_LEN <= len(token) <= MAX_PLACEHOLDER_LEN
    assert kind == "EMAIL"
    assert len(base64.b32decode(token_id)) == 10  # 80 random bits, no padding
    assert len(mac) == 13 and set(mac) <= set(BASE32)


def test_longest_kind_gives_the_longest_placeholder(minter: PlaceholderMinter) -> None:
    token = minter.mint("ABCDEFGHIJKLMNOP", BINDING)
    assert parts(token)[0] == "ABCDEFGHIJKL"
    assert len(token) == MAX_PLACEHOLDER_LEN


def test_ids_are_unique_and_random(minter: PlaceholderMinter) -> None:
    ids = {parts(minter.mint("PHONE", BINDING))[1] for _ in range(2000)}
    assert len(ids) == 2000


def test_a_random_id_is_one_base32_character_per_random_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each of 16 random bytes gives the base32 character of its low 5 bits: every character is
    # the image of exactly 8 of the 256 byte values, so each is uniform and the id has 80 random bits.
    blocks = [bytes(range(i, i + 16)) for i in range(0, 256, 16)]
    given_out = iter(blocks)
    sizes = []

    def token_bytes(n: int) -> bytes:
        sizes.append(n)
        return next(given_out)

    monkeypatch.setattr("tollway.pii.placeholders.secrets.token_bytes", token_bytes)
    ids = [random_id() for _ in blocks]
    assert ids == ["".join(BASE32[b & 31] for b in block) for block in blocks]
    assert sizes == [16] * 16


def test_random_ids_are_drawn_in_one_call_and_encoded_like_one_id_each(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = []

    def token_bytes(n: int) -> bytes:
        sizes.append(n)
        return bytes(range(n))

    monkeypatch.setattr("tollway.pii.placeholders.secrets.token_bytes", token_bytes)
    ids = random_ids(8)
    assert sizes == [128]
    assert ids == "".join(BASE32[b & 31] for b in range(128))


def test_a_mapping_draws_random_ids_in_batches_and_never_reuses_one(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = []
    real = random_ids

    def counting(count: int) -> str:
        draws.append(count)
        return real(count)

    monkeypatch.setattr("tollway.pii.recovery.random_ids", counting)
    mapping = Mapping(PlaceholderMinter([PlaceholderKey(SECRET)]), BINDING)
    tokens = [mapping.mint("EMAIL", f"user{i}@example.com") for i in range(20)]
    ids = [parts(token)[1] for token in tokens]
    assert len(set(ids)) == 20
    assert draws == [ID_BATCH] * -(-20 // ID_BATCH)
    assert all(mapping.resolve(token) == f"user{i}@example.com" for i, token in enumerate(tokens))


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("email", "EMAIL"),
        ("EMAIL", "EMAIL"),
        ("phone", "PHONE"),
        ("phone_number", "PHONE"),
        ("card", "CARD"),
        ("credit_card", "CARD"),
        ("iban", "IBAN"),
        ("ssn", "SSN"),
        ("us-ssn", "SSN"),
        ("ip", "IP"),
        ("ip_address", "IP"),
        ("passport_no", "PASSPORTNO"),
        ("employee id 2", "EMPLOYEEID2"),
        ("a_very_long_custom_kind_name", "AVERYLONGCUS"),
        ("ÄÖÜ-tax id", "TAXID"),
    ],
)
def test_kind_is_normalised_to_a_short_upper_case_tag(name: str, tag: str) -> None:
    assert normalise_kind(name) == tag


@pytest.mark.parametrize("name", ["", "_", "--", "äöü", " "])
def test_kind_without_an_ascii_letter_or_digit_is_rejected(name: str) -> None:
    with pytest.raises(ValueError):
        normalise_kind(name)


@given(st.text(min_size=1, max_size=40))
def test_kind_normalisation_is_idempotent_and_fits_the_grammar(name: str) -> None:
    try:
        tag = normalise_kind(name)
    except ValueError:
        return
    assert re.fullmatch(r"[A-Z0-9]{1,12}", tag)
    assert normalise_kind(tag) == tag


# --- prefixes ------------------------------------------------------------------------------


def prefix_oracle(text: str) -> bool:
    """Independent check: does ``text`` fit, character by character, a template of some kind length?"""
    for kind_len in range(1, 13):
        template = ["["] + list("TWPII1_") + [KIND_CHARS] * kind_len + ["_"] + [BASE32] * 16 + ["_"]
        template += [BASE32] * 13 + ["]"]
        if len(text) <= len(template) and all(ch in allowed for ch, allowed in zip(text, template, strict=False)):
            return True
    return False


def test_every_prefix_of_a_placeholder_is_a_prefix(minter: PlaceholderMinter) -> None:
    for kind in ("IP", "EMAIL", "ABCDEFGHIJKL"):
        token = minter.mint(kind, BINDING)
        assert all(is_placeholder_prefix(token[:i]) for i in range(len(token) + 1))


@pytest.mark.parametrize(
    "text",
    [
        "[[",
        "[t",
        "[TWPII2",
        "[TWPII1__",
        "[TWPII1_email",
        "[TWPII1_ABCDEFGHIJKLM",  # a 13-character kind
        "[TWPII1_EMAIL_ABC1",  # 1 is not base32
        "[TWPII1_EMAIL_ABCDEFGHIJKLMNOPQ",  # a 17-character id
        "[TWPII1_EMAIL_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLMN",  # a 14-character mac
        "[TWPII1_EMAIL_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM]]",
        "[TWPII1_EMAIL_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM] ",
        " [TWPII1_",
        "TWPII1_",
    ],
)
def test_text_that_cannot_become_a_placeholder_is_not_a_prefix(text: str) -> None:
    assert not is_placeholder_prefix(text)


@given(
    st.text(alphabet="[]TWPII1_EMAILBCDK2370z", max_size=60)
    | st.builds(lambda tail: "[TWPII1_" + tail, st.text(alphabet="_ABZ0279]a[", max_size=50))
)
def test_prefix_check_agrees_with_a_character_template(text: str) -> None:
    assert is_placeholder_prefix(text) == prefix_oracle(text)


# --- verification --------------------------------------------------------------------------


def test_placeholder_verifies_under_its_binding(minter: PlaceholderMinter) -> None:
    token = minter.mint("card", BINDING)
    kind, token_id, _ = parts(token)
    assert minter.verify(token, BINDING) == (token_id, kind)
    assert kind == "CARD"


@pytest.mark.parametrize(
    "other",
    [
        scope_binding("request", "req-2"),
        scope_binding("session", "req-1"),
        scope_binding("host", "req-1"),
        b"",
        BINDING[:-1],
    ],
)
def test_placeholder_never_verifies_under_another_binding(minter: PlaceholderMinter, other: bytes) -> None:
    token = minter.mint("email", BINDING)
    assert minter.verify(token, other) is None


def test_session_binding_separates_tenants_and_principals(minter: PlaceholderMinter) -> None:
    binding = scope_binding("session", "tenant-a", "alice", "s1")
    token = minter.mint("email", binding)
    assert minter.verify(token, scope_binding("session", "tenant-a", "alice", "s1")) is not None
    assert minter.verify(token, scope_binding("session", "tenant-b", "alice", "s1")) is None
    assert minter.verify(token, scope_binding("session", "tenant-a", "bob", "s1")) is None
    assert minter.verify(token, scope_binding("session", "tenant-a", "alice", "s2")) is None


def test_scope_binding_is_unambiguous() -> None:
    assert scope_binding("session", "ab", "c") != scope_binding("session", "a", "bc")
    assert scope_binding("session", "a", "") != scope_binding("session", "a")
    assert scope_binding("request", "x") != scope_binding("session", "x")
    assert len(scope_binding("request", "x")) == 32
    with pytest.raises(ValueError):
        scope_binding("request")


def test_every_single_character_change_fails(minter: PlaceholderMinter) -> None:
    token = minter.mint("iban", BINDING)
    for i, original in enumerate(token):
        for replacement in {"A", "Z", "2", "7", "0", "_", "[", "]", "a"} - {original}:
            altered = token[:i] + replacement + token[i + 1 :]
            assert minter.verify(altered, BINDING) is None


def test_relabelled_kind_fails(minter: PlaceholderMinter) -> None:
    token = minter.mint("card", BINDING)
    assert minter.verify(token.replace("_CARD_", "_EMAIL_"), BINDING) is None
    assert minter.verify(token.replace("_CARD_", "_CAR_"), BINDING) is None


def test_truncated_extended_and_recased_placeholders_fail(minter: PlaceholderMinter) -> None:
    token = minter.mint("ssn", BINDING)
    for i in range(len(token)):
        assert minter.verify(token[:i], BINDING) is None
        assert minter.verify(token[i + 1 :], BINDING) is None
    for variant in (
        token.lower(),
        token.swapcase(),
        token[1:-1],
        token + " ",
        " " + token,
        token + token,
        token[:-1] + "A]",
        token.replace("_", "-"),
    ):
        assert minter.verify(variant, BINDING) is None


@given(
    st.sampled_from(["EMAIL", "PHONE", "CARD", "X"]),
    st.text(alphabet=BASE32, min_size=16, max_size=16),
    st.text(alphabet=BASE32, min_size=13, max_size=13),
)
def test_forged_placeholders_with_valid_grammar_fail(kind: str, token_id: str, mac: str) -> None:
    minter = PlaceholderMinter([PlaceholderKey(SECRET)])
    forged = f"[TWPII1_{kind}_{token_id}_{mac}]"
    assert PLACEHOLDER_RE.fullmatch(forged)
    assert minter.verify(forged, BINDING) is None


def test_a_different_key_does_not_verify(minter: PlaceholderMinter) -> None:
    token = minter.mint("email", BINDING)
    assert PlaceholderMinter([PlaceholderKey(b"x" * 32)]).verify(token, BINDING) is None


# --- keys and rotation ---------------------------------------------------------------------


def test_rotation_accepts_previous_keys_and_mints_with_the_current_one() -> None:
    old, new = PlaceholderKey(b"o" * 32, "old"), PlaceholderKey(b"n" * 32, "new")
    before = PlaceholderMinter([old]).mint("email", BINDING)
    rotated = PlaceholderMinter([new, old])
    assert rotated.current_key_id == "new"
    assert rotated.verify(before, BINDING) is not None
    after = rotated.mint("email", BINDING)
    assert PlaceholderMinter([new]).verify(after, BINDING) is not None
    assert PlaceholderMinter([old]).verify(after, BINDING) is None
    assert PlaceholderMinter([new]).verify(before, BINDING) is None  # the old key retired


@pytest.mark.parametrize("count", [0, 5])
def test_minter_takes_one_to_four_keys(count: int) -> None:
    with pytest.raises(ValueError):
        PlaceholderMinter([PlaceholderKey(bytes([i]) * 32) for i in range(count)])


@pytest.mark.parametrize("secret", [b"short", b"x" * 31, "y" * 32])
def test_weak_or_textual_keys_are_rejected(secret: object) -> None:
    with pytest.raises(ValueError) as caught:
        PlaceholderKey(secret)  # type: ignore[arg-type]
    assert str(secret) not in str(caught.value)


def test_repr_and_pickle_never_show_the_key() -> None:
    secret = b"S3cr3t-Key-Material-0123456789ab"
    key = PlaceholderKey(secret, "2026-01")
    minter = PlaceholderMinter([key])
    for text in (repr(key), str(key), repr(minter), str(minter)):
        assert "S3cr3t" not in text and secret.hex() not in text
    assert repr(key) == "PlaceholderKey(key_id='2026-01')"
    assert not hasattr(key, "__dict__")
    with pytest.raises(TypeError):
        pickle.dumps(key)


def test_generated_keys_differ() -> None:
    token = PlaceholderMinter([PlaceholderKey.generate()]).mint("ip", BINDING)
    assert PlaceholderMinter([PlaceholderKey.generate()]).verify(token, BINDING) is None
