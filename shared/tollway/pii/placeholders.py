"""Authenticated PII placeholders: the text a provider sees instead of a sensitive value.

Grammar (format version 1), fixed ASCII, no whitespace::

    placeholder = "[TWPII1_" kind "_" id "_" mac "]"
    kind        = 1*12( %x41-5A / %x30-39 )     ; A-Z 0-9: EMAIL, PHONE, CARD, IBAN, SSN, IP, ...
    id          = 16( %x41-5A / %x32-37 )       ; RFC 4648 base32, no padding: 80 random bits
    mac         = 13( %x41-5A / %x32-37 )       ; base32: the first 65 bits of the HMAC-SHA256

    e.g. [TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]

A placeholder is 41 to 52 characters long (``MIN_PLACEHOLDER_LEN``, ``MAX_PLACEHOLDER_LEN``).
``TW`` names Tollway and ``1`` the format; a new format takes a new version digit, so old and
new placeholders can never be confused. The kind is readable so a model knows it is handling
an e-mail address or a card number and writes prose that fits; it is also under the MAC, so
relabelling a card as an e-mail does not verify. No field may contain ``_``, ``[`` or ``]``, so
a placeholder parses one way only and two placeholders can never overlap in a text.

Why these lengths:

* ``id`` comes from ``secrets``: 80 bits (16 random bytes, each giving one base32 character
  from its low 5 bits: 256 is a multiple of 32, so every character is uniform). Within one
  scope, *n* placeholders collide with probability below n²/2⁸¹ (under 2⁻⁴¹ for a million
  values). Ids are never derived from values, so equal values in different scopes are not
  linkable through their placeholders.
* ``mac`` is HMAC-SHA256 keyed by a per-deployment key over (format version, id, kind, scope
  binding), truncated to 65 bits (13 base32 characters, every bit used). Without the key an
  attacker, or a model that invents placeholders, has a chance of at most q·k·2⁻⁶⁵ to make any
  of q attempts verify against k accepted keys; a MAC can be checked only by the gateway, so
  there is no offline search. A placeholder minted under one binding (request, session,
  principal, tenant, host) verifies under another with the same 2⁻⁶⁵ chance, so a token copied
  across requests or tenants never reveals a value.
* 52 characters bound the suffix a streaming recoverer must hold back to 51.

The *binding* is opaque to this module; ``scope_binding`` derives one from named scope parts
without ambiguity. Keys rotate by listing the current key first and the previous ones after
it: minting uses the first, verifying accepts any of them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

__all__ = [
    "MAX_PLACEHOLDER_LEN",
    "MIN_PLACEHOLDER_LEN",
    "PLACEHOLDER_RE",
    "PlaceholderKey",
    "PlaceholderMinter",
    "encode_id",
    "is_placeholder_prefix",
    "normalise_kind",
    "random_id",
    "random_ids",
    "scope_binding",
]

_VERSION = "TWPII1"
_HEAD = "[" + _VERSION + "_"
_MAX_KIND_LEN = 12
_ID_LEN = 16
_ID_RE = re.compile(f"[A-Z2-7]{{{_ID_LEN}}}")
_MAC_LEN = 13
_MAC_BYTES = 9  # 72 bits, of which the first 65 are encoded
_MIN_KEY_BYTES = 32
_MAX_KEYS = 4

MIN_PLACEHOLDER_LEN = len(_HEAD) + 1 + 1 + _ID_LEN + 1 + _MAC_LEN + 1
MAX_PLACEHOLDER_LEN = len(_HEAD) + _MAX_KIND_LEN + 1 + _ID_LEN + 1 + _MAC_LEN + 1

PLACEHOLDER_RE = re.compile(r"\[TWPII1_([A-Z0-9]{1,12})_([A-Z2-7]{16})_([A-Z2-7]{13})\]")
"""A complete placeholder; groups: kind, id, mac. Matches never overlap."""

# What may follow ``[TWPII1_`` in a proper or complete prefix of a placeholder.
_AFTER_HEAD_PREFIX = re.compile(
    r"[A-Z0-9]{1,12}"  # kind, complete or not
    r"(?:_(?:[A-Z2-7]{16}(?:_(?:[A-Z2-7]{13}\]?|[A-Z2-7]{0,12}))?"  # complete id, then the mac
    r"|[A-Z2-7]{0,15}))?"  # or part of the id
)

_KIND_ALIASES = {
    "EMAILADDRESS": "EMAIL",
    "PHONENUMBER": "PHONE",
    "TELEPHONE": "PHONE",
    "CREDITCARD": "CARD",
    "PAYMENTCARD": "CARD",
    "CARDNUMBER": "CARD",
    "IPADDRESS": "IP",
    "IPV4": "IP",
    "IPV6": "IP",
    "USSSN": "SSN",
}
_NOT_KIND_CHAR = re.compile(r"[^A-Z0-9]")
_KIND_CACHE: dict[str, str] = {}
_KIND_CACHE_SIZE = 256

_BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_PAIRS = tuple(a + b for a in _BASE32 for b in _BASE32)
"""Every 10-bit value as two RFC 4648 base32 characters: an id or MAC field is then five table
lookups on one integer, where ``base64.b32encode`` (pure Python on 3.11) took twice as long;
tests check the two agree."""
_RANDOM_ID = bytes(ord(_BASE32[i & 31]) for i in range(256))
"""A random byte's base32 character (its low 5 bits): a random id is one ``bytes.translate``."""

Scope = Literal["request", "session", "host"]

_MAC_PREFIX = f"tollway.pii.placeholder\x00{_VERSION}\x00".encode("ascii")
"""What every MAC's message starts with, absorbed once into each key's prepared state."""
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))
"""RFC 2104's inner and outer pads, as ``bytes.translate`` tables (XOR with 0x36, 0x5C)."""


def normalise_kind(name: str) -> str:
    """The placeholder tag of a PII type: upper-case ASCII letters and digits, at most 12.

    Separators and other characters are dropped (``credit_card`` → ``CARD`` through a small
    alias table, ``passport_no`` → ``PASSPORTNO``). The result is idempotent. Kinds come from
    configuration, so the few there are stay cached.
    """
    tag = _KIND_CACHE.get(name)
    if tag is not None:
        return tag
    tag = _NOT_KIND_CHAR.sub("", name.upper())
    tag = _KIND_ALIASES.get(tag, tag)[:_MAX_KIND_LEN]
    if not tag:
        raise ValueError("a PII kind needs at least one ASCII letter or digit")
    if len(_KIND_CACHE) < _KIND_CACHE_SIZE:
        _KIND_CACHE[name] = tag
    return tag


def random_id() -> str:
    """A fresh random placeholder id: 16 base32 characters, 80 bits from ``secrets``."""
    return random_ids(1)


def random_ids(count: int) -> str:
    """``count`` fresh random ids, concatenated: ``count * 16`` base32 characters from one call to
    ``secrets`` (each 16 as random as one ``random_id``). A request that mints several placeholders
    draws them in one system call, where one ``random_id`` per placeholder cost 0.67 µs each (median,
    amid a request)."""
    return secrets.token_bytes(_ID_LEN * count).translate(_RANDOM_ID).decode("ascii")


def encode_id(raw: bytes) -> str:
    """A placeholder id from 10 random or derived bytes: ``base64.b32encode`` of them (16 characters)."""
    n, p = int.from_bytes(raw, "big"), _PAIRS
    return (
        p[n >> 70]
        + p[(n >> 60) & 1023]
        + p[(n >> 50) & 1023]
        + p[(n >> 40) & 1023]
        + p[(n >> 30) & 1023]
        + p[(n >> 20) & 1023]
        + p[(n >> 10) & 1023]
        + p[n & 1023]
    )


def _base32_65(raw: bytes) -> str:
    """The first 13 characters of ``base64.b32encode`` of 9 bytes: their first 65 bits."""
    n, p = int.from_bytes(raw[:_MAC_BYTES], "big") >> 2, _PAIRS
    pairs = p[n >> 60] + p[(n >> 50) & 1023] + p[(n >> 40) & 1023] + p[(n >> 30) & 1023]
    return (pairs + p[(n >> 20) & 1023] + p[(n >> 10) & 1023] + p[n & 1023])[:_MAC_LEN]


def scope_binding(scope: Scope, *parts: str) -> bytes:
    """An unambiguous, non-reversible binding for a scope, e.g. ``("session", tenant, principal, sid)``.

    Each part is length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` differ; the SHA-256
    digest can be stored beside a durable mapping without revealing the scope's identifiers.
    """
    if not parts:
        raise ValueError("a scope binding needs at least one part")
    digest = hashlib.sha256(b"tollway.pii.scope\x00" + scope.encode("ascii") + b"\x00")
    for part in parts:
        raw = part.encode("utf-8")
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return digest.digest()


def is_placeholder_prefix(text: str) -> bool:
    """Whether ``text`` is the beginning of some placeholder (a complete one included).

    A streaming recoverer holds back a suffix only while this is true of it.
    """
    if len(text) <= len(_HEAD):
        return _HEAD.startswith(text)
    if len(text) > MAX_PLACEHOLDER_LEN or not text.startswith(_HEAD):
        return False
    return _AFTER_HEAD_PREFIX.fullmatch(text, len(_HEAD)) is not None


class PlaceholderKey:
    """One per-deployment MAC key. Its ``repr`` shows only ``key_id``, never key material.

    ``key_id`` is a non-secret label (for audit and rotation bookkeeping). Only HMAC-SHA256's two
    prepared hash states are kept (RFC 2104: the key padded and XORed with ``ipad``, then the
    message's fixed prefix, absorbed into the inner state; the key XORed with ``opad`` into the
    outer one), and the key cannot be pickled or copied into a log line. A MAC is then two copies,
    two updates and two digests of ``hashlib`` states, all C calls: 0.55 µs, where copying
    OpenSSL's HMAC object took 0.72 (its copy alone 0.27 µs against 0.1 for a hash state) and
    ``hmac.HMAC``'s Python copy 1.2. The result is HMAC-SHA256 exactly (a test checks it against
    ``hmac``), so placeholders minted before still verify.
    """

    __slots__ = ("_inner", "_outer", "key_id")

    def __init__(self, secret: bytes, key_id: str = "") -> None:
        if not isinstance(secret, bytes) or len(secret) < _MIN_KEY_BYTES:
            raise ValueError(f"a placeholder key needs at least {_MIN_KEY_BYTES} bytes")
        block = hashlib.sha256().block_size
        padded = (hashlib.sha256(secret).digest() if len(secret) > block else secret).ljust(block, b"\0")
        self._inner: Any = hashlib.sha256(padded.translate(_IPAD))
        self._inner.update(_MAC_PREFIX)
        self._outer: Any = hashlib.sha256(padded.translate(_OPAD))
        self.key_id = key_id

    @classmethod
    def generate(cls, key_id: str = "") -> PlaceholderKey:
        """A fresh random key, e.g. for a process whose placeholders never outlive it."""
        return cls(secrets.token_bytes(_MIN_KEY_BYTES), key_id)

    def mac(self, token_id: str, kind: str, binding: bytes) -> str:
        """The 13-character MAC field for (format version, id, kind, binding)."""
        inner = self._inner.copy()
        # id is fixed-length and kind has no NUL, so this encoding has one parse.
        inner.update(f"{token_id}\x00{kind}\x00".encode("ascii") + binding)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return _base32_65(outer.digest())

    def __repr__(self) -> str:
        return f"PlaceholderKey(key_id={self.key_id!r})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("placeholder keys are not serializable")


class PlaceholderMinter:
    """Mints placeholders with the current key and verifies them against every accepted key.

    ``keys`` is ordered, current first, then up to three previous keys still accepted while
    placeholders minted under them may be alive (a session's retention, at most).
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Sequence[PlaceholderKey]) -> None:
        if not 1 <= len(keys) <= _MAX_KEYS:
            raise ValueError(f"a placeholder minter takes 1 to {_MAX_KEYS} keys, current first")
        self._keys = tuple(keys)

    @property
    def current_key_id(self) -> str:
        return self._keys[0].key_id

    def mint(self, kind: str, binding: bytes, token_id: str | None = None) -> str:
        """A new placeholder for a value of ``kind``, valid only under ``binding``.

        Its id is ``token_id`` when given, which must be 16 characters of ``random_ids`` (not
        checked: a derived id goes through ``mint_with_id``), else a fresh ``random_id``."""
        tag = normalise_kind(kind)
        if token_id is None:
            token_id = random_id()
        return f"{_HEAD}{tag}_{token_id}_{self._keys[0].mac(token_id, tag, bytes(binding))}]"

    def mint_tag(self, tag: str, binding: bytes, token_id: str) -> str:
        """``mint`` for a ``tag`` that ``normalise_kind`` returned, a ``bytes`` binding and an id of
        ``random_ids``, none of them checked or converted again: a ``Mapping``'s hot path."""
        return f"{_HEAD}{tag}_{token_id}_{self._keys[0].mac(token_id, tag, binding)}]"

    def mint_with_id(self, kind: str, binding: bytes, token_id: str) -> str:
        """A placeholder with a given 16-character base32 ``token_id``: for a durable scope, whose
        ids are keyed hashes of their values so a session names one value one way."""
        if _ID_RE.fullmatch(token_id) is None:
            raise ValueError("a placeholder id is 16 base32 characters")
        tag = normalise_kind(kind)
        return f"{_HEAD}{tag}_{token_id}_{self._keys[0].mac(token_id, tag, bytes(binding))}]"

    def verify(self, token: str, binding: bytes) -> tuple[str, str] | None:
        """``(token_id, kind)`` when ``token`` is exactly a placeholder minted under ``binding``.

        Anything else (altered, truncated, re-cased, forged, minted for another scope, or under
        a key no longer accepted) is ``None``. Every accepted key is checked, without early
        exit, and each MAC comparison is constant-time.
        """
        match = PLACEHOLDER_RE.fullmatch(token)
        if match is None:
            return None
        kind, token_id, mac = match.groups()
        raw_binding = bytes(binding)
        valid = False
        for key in self._keys:
            valid |= hmac.compare_digest(key.mac(token_id, kind, raw_binding), mac)
        return (token_id, kind) if valid else None

    def __repr__(self) -> str:
        return f"PlaceholderMinter(key_ids={[key.key_id for key in self._keys]!r})"
