"""The stored form of one content object: a small versioned binary envelope, and the associated
data that binds its ciphertext to its place.

The sealing itself is :class:`tollway.pii.vault.envelope.Envelope` (AES-256-GCM under cached KMS
data keys, a fresh 96-bit nonce per object); this module only says what is sealed with what, and
how the result is laid out. An object's body is::

    magic        4 bytes    b"TWCE"
    version      1 byte     OBJECT_FORMAT (1)
    key id       u32 + n    the KMS key (ARN) that wrapped the data key, UTF-8
    wrapped key  u32 + n    the data key, encrypted by KMS (GenerateDataKey's CiphertextBlob)
    nonce        u32 + n    12 random bytes
    ciphertext   the rest   AES-256-GCM of ContentRecord.to_json(), tag appended

(u32: a big-endian length.) Binary rather than JSON: a wrapped key, nonce and ciphertext in JSON
would be base64, a third larger, for no reader that needs it.

The associated data (:func:`associated_data`) is the object key, the request id, the tenant, the
retention class, the mode, the plaintext's SHA-256 and the format version, each length-prefixed.
So a body copied to another key, or read through a reference whose mode, retention class or
digest was altered, fails authentication. The bucket is left out on purpose: a bucket replicated
or restored under another name still reads.

Everything here is pure: no I/O, and ``cryptography`` is never imported. The memory store
checks what it returns with the same :func:`verified_record`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final

import orjson

from tollway.content.base import ContentError, ContentRecord, ContentRef, content_key
from tollway.pii.vault.envelope import NONCE_BYTES, Sealed

__all__ = [
    "MAGIC",
    "OBJECT_FORMAT",
    "KeyParts",
    "associated_data",
    "decode_object",
    "encode_object",
    "key_parts",
    "object_key",
    "record_plaintext",
    "verified_record",
]

OBJECT_FORMAT: Final = 1
"""The version of the body's layout and of :func:`associated_data`'s encoding."""
MAGIC: Final = b"TWCE"
_AAD_DOMAIN: Final = b"tollway.content"
_MAX_FIELD_BYTES: Final = 4096
"""Bound on the key id and the wrapped key (an ARN is at most 2048 bytes, a wrapped data key ~200)."""
_SEGMENT: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
_KEY: Final = re.compile(r"content/([^/]+)/([^/]+)/\d{4}/\d{2}/\d{2}/([^/]+)\.json\.enc")


@dataclass(frozen=True, slots=True)
class KeyParts:
    """What an object key says about its object."""

    retention_class: str
    tenant: str
    request_id: str


def key_parts(key: str) -> KeyParts:
    """The retention class, tenant and request id of an object key; :class:`ContentError` when
    ``key`` is not one :func:`object_key` makes."""
    found = _KEY.fullmatch(key) if isinstance(key, str) else None
    if found is None or not all(_SEGMENT.fullmatch(segment) for segment in found.groups()):
        raise ContentError("a content key does not have the content layout")
    return KeyParts(*found.groups())


def object_key(record: ContentRecord, retention_class: str) -> tuple[str, KeyParts]:
    """:func:`~tollway.content.base.content_key` of ``record``, checked to parse back to its parts:
    a retention class, tenant or request id that is not one URL-safe segment (a ``/``, a leading dot,
    over 128 characters) raises :class:`ContentError` rather than make a key outside the layout."""
    try:
        key = content_key(retention_class, record.tenant, record.captured_at_ms, record.request_id)
    except (OverflowError, OSError, ValueError, TypeError):
        raise ContentError("a content record's capture time is out of range") from None
    expected = KeyParts(retention_class, record.tenant, record.request_id)
    with contextlib.suppress(ContentError):
        if key_parts(key) == expected:
            return key, expected
    raise ContentError("a content record's retention class, tenant or request id is not URL-safe")


def associated_data(*, key: str, parts: KeyParts, mode: str, digest: str) -> bytes:
    """The AES-GCM associated data of one object: every field length-prefixed, so it parses one way."""
    fields = (
        _AAD_DOMAIN,
        str(OBJECT_FORMAT).encode("ascii"),
        key.encode("utf-8"),
        parts.request_id.encode("utf-8"),
        parts.tenant.encode("utf-8"),
        parts.retention_class.encode("utf-8"),
        mode.encode("utf-8"),
        digest.encode("utf-8"),
    )
    return b"".join(len(field).to_bytes(4, "big") + field for field in fields)


def encode_object(sealed: Sealed) -> bytes:
    key_id = sealed.key_id.encode("utf-8")
    fields = (key_id, sealed.wrapped_key, sealed.nonce)
    return b"".join(
        (MAGIC, bytes([OBJECT_FORMAT]), *(len(f).to_bytes(4, "big") + f for f in fields), sealed.ciphertext)
    )


def decode_object(body: bytes) -> Sealed:
    """The sealed parts of a body; :class:`ContentError` when it is not an envelope of a known format."""
    if body[: len(MAGIC)] != MAGIC or len(body) <= len(MAGIC):
        raise ContentError("a content object is not a content envelope")
    if body[len(MAGIC)] != OBJECT_FORMAT:
        raise ContentError("a content object has an unknown format version")
    offset = len(MAGIC) + 1
    fields: list[bytes] = []
    for _ in range(3):
        size = int.from_bytes(body[offset : offset + 4], "big")
        offset += 4
        if len(body) < offset or size > _MAX_FIELD_BYTES or len(body) < offset + size:
            raise ContentError("a content object is truncated")
        fields.append(body[offset : offset + size])
        offset += size
    key_id, wrapped, nonce = fields
    if len(nonce) != NONCE_BYTES or not key_id or not wrapped:
        raise ContentError("a content object's envelope is malformed")
    try:
        key_text = key_id.decode("utf-8")
    except UnicodeDecodeError:
        raise ContentError("a content object's envelope is malformed") from None
    return Sealed(key_text, wrapped, nonce, body[offset:])


def record_plaintext(record: ContentRecord, limit: int) -> bytes:
    """``record.to_json()``; :class:`ContentError` when it is not serialisable or over ``limit`` bytes."""
    try:
        plaintext = record.to_json()
    except orjson.JSONEncodeError:
        raise ContentError("a content record is not serialisable as JSON") from None
    if len(plaintext) > limit:
        raise ContentError(f"a content record is larger than {limit} bytes")
    return plaintext


def verified_record(plaintext: bytes, ref: ContentRef, parts: KeyParts) -> ContentRecord:
    """The record of ``plaintext`` if it is the one ``ref`` names (digest, size, mode, tenant and
    request id of its key); else :class:`ContentError`, whatever the plaintext holds."""
    digest = hashlib.sha256(plaintext).hexdigest().encode("ascii")
    claimed = ref.digest.encode("utf-8", "replace") if isinstance(ref.digest, str) else b""
    if not hmac.compare_digest(digest, claimed) or len(plaintext) != ref.size:
        raise ContentError("a content object does not match its reference's digest or size")
    record = ContentRecord.from_json(plaintext)
    if (record.tenant, record.request_id, record.mode) != (parts.tenant, parts.request_id, ref.mode):
        raise ContentError("a content object does not match its reference's key or mode")
    return record
