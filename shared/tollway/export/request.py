"""What an export asks for: purpose, source time range, filters, transformations and approval.

An :class:`ExportRequest` is the body of the export queue's message (:func:`encode_message`)::

    {"v": 1, "export": {
        "exportId": "exp-…",                     # optional: derived from the request's digest
        "purpose": "audit" | "evaluation" | "training",
        "sinceMs": <epoch ms>, "untilMs": <epoch ms>,   # source range [since, until)
        "filters": {"tenants": [...], "aliases": [...], "principals": [...], "outcomes": [...]},
        "transformations": {"toolCalls": "keep" | "drop", "pii": "keep-tokenized" | "redact"},
        "requestedBy": "<principal>", "approvedBy": "<principal>",
        "shardRecords": 1000}}

Every filter list is "any of these"; an empty list does not filter. Lists are sorted and
de-duplicated on parsing, so two requests that mean the same have the same canonical form, the
same digest and so the same derived ``exportId``: sending one request twice makes one export.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from tollway.export.errors import InvalidExportRequest

__all__ = [
    "EXPORT_ID_PATTERN",
    "MESSAGE_VERSION",
    "ExportFilters",
    "ExportRequest",
    "Purpose",
    "Transformations",
    "decode_message",
    "encode_message",
]

Purpose = Literal["audit", "evaluation", "training"]
MESSAGE_VERSION: Final = 1
EXPORT_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
"""Safe as an S3 key segment: letters, digits, ``.``, ``_`` and ``-``."""
_MAX_FILTER_VALUES: Final = 100
_MAX_ID: Final = 256
_MAX_MESSAGE_BYTES: Final = 64 * 1024


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


def _values(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) > _MAX_FILTER_VALUES:
        raise ValueError(f"must be a list of at most {_MAX_FILTER_VALUES} strings")
    if not all(isinstance(v, str) and 0 < len(v) <= _MAX_ID for v in value):
        raise ValueError(f"every value must be a string of 1-{_MAX_ID} characters")
    return tuple(sorted(set(value)))


class ExportFilters(_Model):
    """Which of the source range's requests are considered; each list is "any of", empty is "all"."""

    tenants: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    principals: tuple[str, ...] = ()
    outcomes: tuple[str, ...] = ()

    @field_validator("tenants", "aliases", "principals", "outcomes", mode="before")
    @classmethod
    def _canonical(cls, value: Any) -> tuple[str, ...]:
        return _values(value)


class Transformations(_Model):
    """What is done to each exported exchange (``tollway.export.transform``)."""

    tool_calls: Literal["keep", "drop"] = "keep"
    """``drop``: tool definitions, assistant tool calls and tool messages are left out."""
    pii: Literal["keep-tokenized", "redact"] = "keep-tokenized"
    """``redact``: every PII placeholder becomes ``[REDACTED_<KIND>]``, so no token survives."""


class ExportRequest(_Model):
    """One export, as asked and approved. ``export_id`` is always set after validation."""

    export_id: str = Field(default="", pattern=r"^$|" + EXPORT_ID_PATTERN)
    purpose: Purpose
    since_ms: int = Field(ge=0, lt=253_402_300_800_000)
    until_ms: int = Field(gt=0, le=253_402_300_800_000)
    filters: ExportFilters = ExportFilters()
    transformations: Transformations = Transformations()
    requested_by: str = Field(min_length=1, max_length=_MAX_ID)
    approved_by: str = Field(min_length=1, max_length=_MAX_ID)
    shard_records: int = Field(default=1000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _range_and_id(self) -> ExportRequest:
        if self.until_ms <= self.since_ms:
            raise ValueError("untilMs must be after sinceMs")
        if not self.export_id:
            # Frozen model: the derived id is set once, here, before anyone can see the instance.
            object.__setattr__(self, "export_id", f"exp-{self.digest()[:24]}")
        return self

    def canonical(self) -> dict[str, Any]:
        """The request as JSON values, camelCase, without ``exportId``: what its digest covers."""
        return self.model_dump(mode="json", by_alias=True, exclude={"export_id"})

    def digest(self) -> str:
        """SHA-256 (hex) of :meth:`canonical` with sorted keys."""
        return hashlib.sha256(orjson.dumps(self.canonical(), option=orjson.OPT_SORT_KEYS)).hexdigest()

    @classmethod
    def parse(cls, doc: Any) -> ExportRequest:
        """Raises :class:`InvalidExportRequest` naming the bad fields (never their values)."""
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) or "(request)" for e in exc.errors())
            raise InvalidExportRequest(f"invalid export request: {fields}") from None


def encode_message(request: ExportRequest) -> str:
    """The export queue's message body for ``request`` (its ``exportId`` included)."""
    body = {"v": MESSAGE_VERSION, "export": request.model_dump(mode="json", by_alias=True)}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()


def decode_message(body: str | bytes) -> ExportRequest:
    """The request of one export queue message; raises :class:`InvalidExportRequest`."""
    if len(body) > _MAX_MESSAGE_BYTES:
        raise InvalidExportRequest("the export message is too large")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidExportRequest("the export message is not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != MESSAGE_VERSION or not isinstance(doc.get("export"), dict):
        raise InvalidExportRequest(f"the export message is not a version-{MESSAGE_VERSION} export object")
    return ExportRequest.parse(doc["export"])
