"""Which captured exchanges an export may include, and why the others are left out.

Purpose rules (the seed's *Content Modes And Purpose*: operational audit data does not become
training data by itself):

============  =====================================  ==========================================
purpose       content modes                           consent (``ContentRef.purposes``)
============  =====================================  ==========================================
audit         ``tokenized-content``, ``encrypted-raw``  none needed: every capture is for audit
evaluation    ``tokenized-content`` only               must include ``evaluation``
training      ``tokenized-content`` only               must include ``training``
============  =====================================  ==========================================

``encrypted-raw`` (pre-tokenization requests and recovered answers) is exported for ``audit``
only, whatever consent its reference names. ``metadata-only`` and ``disabled`` store no content.

Every request of the source range that passes the filters is either included or counted under
exactly one :data:`EXCLUSION_REASONS` entry, checked in this order (the first that applies wins):

1. ``deleted``: its content was deleted (``content_deleted`` evidence), revocation included;
2. ``expired``: its audit record's ``expiresAt`` has passed, or its content's retention class
   has a retention (``retention_days``) that has passed since the request;
3. ``dropped``: its content was to be captured but was not (``content_dropped``);
4. ``no_content``: it has no content reference (``metadata-only``, ``disabled``, rejected);
5. ``integrity_failed``: its reference is malformed, or (after the fetch) the object fails its
   digest or names another request;
6. ``purpose_not_allowed``: the table above forbids it;
7. ``missing_object``: the content store no longer has the object (``get`` returned ``None``).

The first six are decided from the audit record alone (:func:`screen`); the last two need the
fetch (:func:`check_fetched`). Nothing here does I/O or reads a clock: ``now_ms`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from tollway.audit.store.views import RequestRecord
from tollway.content.base import ContentError, ContentRecord, ContentRef
from tollway.export.request import ExportFilters, Purpose

__all__ = [
    "EXCLUSION_REASONS",
    "EXPORT_OPERATION",
    "PURPOSE_MODES",
    "ExclusionReason",
    "allows",
    "check_fetched",
    "matches",
    "screen",
]

ExclusionReason = Literal[
    "deleted", "expired", "dropped", "no_content", "integrity_failed", "purpose_not_allowed", "missing_object"
]
EXCLUSION_REASONS: Final[tuple[ExclusionReason, ...]] = (
    "deleted",
    "expired",
    "dropped",
    "no_content",
    "integrity_failed",
    "purpose_not_allowed",
    "missing_object",
)
PURPOSE_MODES: Final[Mapping[str, frozenset[str]]] = {
    "audit": frozenset({"tokenized-content", "encrypted-raw"}),
    "evaluation": frozenset({"tokenized-content"}),
    "training": frozenset({"tokenized-content"}),
}
EXPORT_OPERATION: Final = "dataset.export"
"""The operation of an export job's own audit record: not a request, never exported or counted."""
_DAY_MS: Final = 86_400_000


def allows(purpose: Purpose, ref: ContentRef) -> bool:
    """Whether content captured under ``ref``'s mode and consent may be used for ``purpose``."""
    if ref.mode not in PURPOSE_MODES[purpose]:
        return False
    return purpose == "audit" or purpose in ref.purposes


def matches(record: RequestRecord, filters: ExportFilters) -> bool:
    """Whether ``record`` is one the request's filters select (a filter with no values selects all)."""
    pairs = (
        (filters.tenants, record.tenant_id),
        (filters.aliases, record.alias),
        (filters.principals, record.principal_id),
        (filters.outcomes, record.outcome),
    )
    return all(not allowed or value in allowed for allowed, value in pairs)


def _retention_passed(record: RequestRecord, ref: ContentRef, now_ms: int, retention_days: Mapping[str, int]) -> bool:
    days = retention_days.get(ref.retention_class)
    at = record.at_ms
    return days is not None and at is not None and at + days * _DAY_MS <= now_ms


def screen(
    record: RequestRecord,
    purpose: Purpose,
    *,
    now_ms: int,
    retention_days: Mapping[str, int] | None = None,
) -> ContentRef | ExclusionReason:
    """The reference to fetch for ``record``, or why it is excluded (rules 1-6, from the record alone)."""
    if record.content_deleted is not None or record.content_deleted_at_ms is not None:
        return "deleted"
    if record.expires_at is not None and record.expires_at * 1000 <= now_ms:
        return "expired"
    if record.content_dropped is not None:
        return "dropped"
    if record.content is None:
        return "no_content"
    try:
        ref = ContentRef.from_body(record.content)
    except ContentError:
        return "integrity_failed"
    if _retention_passed(record, ref, now_ms, retention_days or {}):
        return "expired"
    if not allows(purpose, ref):
        return "purpose_not_allowed"
    return ref


def check_fetched(record: RequestRecord, ref: ContentRef, content: ContentRecord | None) -> ExclusionReason | None:
    """Rule 5's second half and rule 7: ``None`` when the fetched ``content`` may be exported."""
    if content is None:
        return "missing_object"
    if content.request_id != record.request_id or content.mode != ref.mode:
        return "integrity_failed"
    return None
