"""Captured content: what an alias's ``contentMode`` keeps of an exchange, and where it is kept.

The audit trail is metadata only. An alias whose ``contentMode`` is ``tokenized-content`` (the
exchange as the provider saw it, after PII tokenization) or ``encrypted-raw`` (the request before
tokenization and the answer after recovery) also has each sampled exchange stored, as one object
in the content store (S3), envelope-encrypted under a KMS data key, off the request path. The audit
trail gets only a :class:`ContentRef`: where the object is, its digest, size, media type, key
reference, retention class and mode; never the content.

A :class:`ContentStore` puts, gets and deletes those objects; the gateway only puts, the export
function only gets, a deletion role only deletes (separate IAM roles in the CDK app).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import orjson

from tollway.exceptions import TollwayError

__all__ = [
    "CAPTURING_MODES",
    "CONTENT_MEDIA_TYPE",
    "CONTENT_MODES",
    "PURPOSES",
    "ContentError",
    "ContentMode",
    "ContentRecord",
    "ContentRef",
    "ContentStore",
    "ContentUnavailable",
    "content_key",
]

ContentMode = Literal["metadata-only", "disabled", "tokenized-content", "encrypted-raw"]
CONTENT_MODES: Final[tuple[ContentMode, ...]] = ("metadata-only", "disabled", "tokenized-content", "encrypted-raw")
CAPTURING_MODES: Final = frozenset({"tokenized-content", "encrypted-raw"})
"""The modes that store content; the other two store none."""
PURPOSES: Final = ("audit", "evaluation", "training")
"""What captured content may be used for; ``audit`` always, the others only with consent."""
CONTENT_MEDIA_TYPE: Final = "application/vnd.tollway.content+json"
"""The plaintext's media type: :meth:`ContentRecord.to_json`."""
RECORD_FORMAT: Final = 1


class ContentError(TollwayError):
    """Captured content could not be handled; messages never hold content or key material."""


class ContentUnavailable(ContentError):
    """The content store or KMS failed (unreachable, throttled, access denied, missing bucket or key)."""


@dataclass(frozen=True, slots=True)
class ContentRecord:
    """One captured exchange, in the chat format an evaluation or fine-tuning set uses.

    ``request`` holds ``messages`` (role and content, as the canonical request had them, tool calls
    included) and, when present, ``tools``; ``response`` holds the final answer: ``content``,
    ``tool_calls`` and ``finish_reason`` (``None`` for a request that failed before an answer).
    In ``tokenized-content`` both are what the provider saw and said (placeholders, never values);
    in ``encrypted-raw`` what the client sent and got back.
    """

    request_id: str
    tenant: str
    principal_id: str
    alias: str
    operation: str
    mode: ContentMode
    captured_at_ms: int
    request: dict[str, Any] = field(repr=False)
    response: dict[str, Any] | None = field(repr=False, default=None)
    purposes: tuple[str, ...] = ("audit",)
    """What it may be exported for (the alias's consent when it was captured); in the digest."""
    _json: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def to_json(self) -> bytes:
        """The plaintext of the stored object: deterministic (sorted keys), so its digest is too.
        Serialised once: the writer measures it on the request path and the store seals the same
        bytes (a record is not changed after it is built)."""
        if self._json is not None:
            return self._json
        raw = orjson.dumps(
            {
                "format": RECORD_FORMAT,
                "requestId": self.request_id,
                "tenant": self.tenant,
                "principalId": self.principal_id,
                "alias": self.alias,
                "operation": self.operation,
                "mode": self.mode,
                "capturedAt": self.captured_at_ms,
                "request": self.request,
                "response": self.response,
                "purposes": list(self.purposes),
            },
            option=orjson.OPT_SORT_KEYS,
        )
        object.__setattr__(self, "_json", raw)
        return raw

    @classmethod
    def from_json(cls, raw: bytes) -> ContentRecord:
        """Raises ``ContentError`` for a document that is not a content record of a known format."""
        try:
            doc = orjson.loads(raw)
            if doc["format"] != RECORD_FORMAT or doc["mode"] not in CAPTURING_MODES:
                raise ContentError("not a content record of a known format")
            if not isinstance(doc["request"], dict) or not isinstance(doc["response"], dict | None):
                raise TypeError("request and response are JSON objects")
            return cls(
                request_id=str(doc["requestId"]),
                tenant=str(doc["tenant"]),
                principal_id=str(doc["principalId"]),
                alias=str(doc["alias"]),
                operation=str(doc["operation"]),
                mode=doc["mode"],
                captured_at_ms=int(doc["capturedAt"]),
                request=dict(doc["request"]),
                response=None if doc["response"] is None else dict(doc["response"]),
                purposes=tuple(str(p) for p in doc.get("purposes", ("audit",))),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ContentError(f"a content object is malformed ({type(exc).__name__})") from None

    def digest(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()


def content_key(retention_class: str, tenant: str, captured_at_ms: int, request_id: str) -> str:
    """The object key: ``content/<retention class>/<tenant>/<yyyy>/<mm>/<dd>/<request id>.json.enc``.

    The retention class leads, so a bucket lifecycle rule per class expires its objects; the date
    lets ``--before <date>`` deletion and exports walk a range without listing everything. Tenant
    and request id are URL-safe already (configuration ids and generated ids).
    """
    import datetime as _dt

    day = _dt.datetime.fromtimestamp(captured_at_ms / 1000, tz=_dt.UTC).strftime("%Y/%m/%d")
    return f"content/{retention_class}/{tenant}/{day}/{request_id}.json.enc"


@dataclass(frozen=True, slots=True)
class ContentRef:
    """The audit trail's reference to one stored object (what the WAL and the audit table hold)."""

    bucket: str
    key: str
    digest: str
    """SHA-256 (hex) of the plaintext, :meth:`ContentRecord.to_json`."""
    size: int
    """Plaintext bytes."""
    key_ref: str
    """The KMS key that wrapped the object's data key (its id or alias), never key material."""
    retention_class: str
    mode: ContentMode
    media_type: str = CONTENT_MEDIA_TYPE
    purposes: tuple[str, ...] = ("audit",)
    """What the content may be used for (the alias's ``contentPurposes`` when it was captured, the
    consent it was given under): ``audit``, ``evaluation``, ``training``."""

    def to_body(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "key": self.key,
            "digest": self.digest,
            "size": self.size,
            "keyRef": self.key_ref,
            "retentionClass": self.retention_class,
            "mode": self.mode,
            "mediaType": self.media_type,
            "purposes": list(self.purposes),
        }

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ContentRef:
        """Raises ``ContentError`` when a field is missing or of the wrong type."""
        try:
            ref = cls(
                bucket=body["bucket"],
                key=body["key"],
                digest=body["digest"],
                size=body["size"],
                key_ref=body["keyRef"],
                retention_class=body["retentionClass"],
                mode=body["mode"],
                media_type=body.get("mediaType", CONTENT_MEDIA_TYPE),
                purposes=tuple(body.get("purposes", ("audit",))),
            )
        except (KeyError, TypeError) as exc:
            raise ContentError(f"a content reference is malformed ({type(exc).__name__})") from None
        strings = (ref.bucket, ref.key, ref.digest, ref.key_ref, ref.retention_class, ref.media_type)
        if not all(isinstance(s, str) and s for s in strings) or not _is_size(ref.size):
            raise ContentError("a content reference is malformed")
        if not all(p in PURPOSES for p in ref.purposes):
            raise ContentError("a content reference names an unknown purpose")
        if not isinstance(ref.mode, str) or ref.mode not in CAPTURING_MODES:
            raise ContentError("a content reference names a mode that stores no content")
        return ref


def _is_size(value: object) -> bool:
    """A byte count: an ``int`` (not a ``bool``), not negative."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class ContentStore(Protocol):
    """Where captured content lives. Implementations: ``tollway.content.s3`` (S3 + KMS) and
    ``tollway.content.memory`` (unit tests). No method lists or scans: readers come from the audit
    trail's references."""

    async def put(self, record: ContentRecord, retention_class: str) -> ContentRef:
        """Encrypt and store ``record`` under :func:`content_key`; idempotent for the same record.
        Raises ``ContentUnavailable``."""
        ...

    async def get(self, ref: ContentRef) -> ContentRecord | None:
        """The record, decrypted and checked against ``ref.digest``; ``None`` when the object is gone
        (deleted, expired). Raises ``ContentUnavailable``, or ``ContentError`` when it fails its
        integrity check (never returns content that does not match its reference)."""
        ...

    async def delete(self, ref: ContentRef) -> bool:
        """Delete the object; ``True`` if it existed. Raises ``ContentUnavailable``."""
        ...

    async def aclose(self) -> None: ...
