"""Dataset export: curated, approved, immutable exports of captured content for one purpose.

An :class:`ExportRequest` (purpose, source time range, filters, transformations, requester and
approver) is put on the export queue; the ``dataset_export`` function runs :func:`run_export`:
it reads the range's request records from the audit store, keeps those whose content mode and
consent allow the purpose and that are neither expired, deleted nor dropped
(:mod:`~tollway.export.rules`), fetches and transforms their content
(:mod:`~tollway.export.transform`), writes JSONL shards and then an immutable manifest to the
exports bucket (:mod:`~tollway.export.manifest`, :mod:`~tollway.export.sink`), and audits the job
with an ``export_finished`` event (:mod:`~tollway.export.audit`). :mod:`~tollway.export.cli`
holds what ``tollway export`` does.

Modules: ``request``, ``rules``, ``transform``, ``manifest``, ``job``, ``sink``, ``queue``,
``audit``, ``cli``, ``errors``.
"""

from tollway.export.audit import ExportAudit, MemoryExportAudit, SqsExportAudit, audit_message, finished_event
from tollway.export.errors import (
    ExportConflict,
    ExportError,
    ExportIntegrityError,
    ExportUnavailable,
    InvalidExportRequest,
)
from tollway.export.job import AuditReader, ExportProgress, ExportResult, run_export, status_publisher
from tollway.export.manifest import MANIFEST_FORMAT, manifest_digest, manifest_key, status_key, verify_manifest
from tollway.export.queue import ExportQueue, MemoryExportQueue, SqsExportQueue
from tollway.export.request import ExportFilters, ExportRequest, Transformations, decode_message, encode_message
from tollway.export.rules import EXCLUSION_REASONS, PURPOSE_MODES, ExclusionReason
from tollway.export.sink import ExportSink, MemoryExportSink, S3ExportSink, SinkSettings

__all__ = [
    "EXCLUSION_REASONS",
    "MANIFEST_FORMAT",
    "PURPOSE_MODES",
    "AuditReader",
    "ExclusionReason",
    "ExportAudit",
    "ExportConflict",
    "ExportError",
    "ExportFilters",
    "ExportIntegrityError",
    "ExportProgress",
    "ExportQueue",
    "ExportRequest",
    "ExportResult",
    "ExportSink",
    "ExportUnavailable",
    "InvalidExportRequest",
    "MemoryExportAudit",
    "MemoryExportQueue",
    "MemoryExportSink",
    "S3ExportSink",
    "SinkSettings",
    "SqsExportAudit",
    "SqsExportQueue",
    "Transformations",
    "audit_message",
    "decode_message",
    "encode_message",
    "finished_event",
    "manifest_digest",
    "manifest_key",
    "run_export",
    "status_key",
    "status_publisher",
    "verify_manifest",
]
