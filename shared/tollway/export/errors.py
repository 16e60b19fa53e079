"""What can go wrong in a dataset export; messages name ids, keys and codes, never content.

::

    TollwayError
    └── ExportError                  a dataset export could not be made or read
        ├── InvalidExportRequest     the request (or its queue message) is malformed
        ├── ExportConflict           an immutable object exists with other content (shard or manifest)
        ├── ExportIntegrityError     a manifest or shard does not match its digest
        └── ExportUnavailable        the exports bucket or a queue failed

A content store that is down (``ContentUnavailable``) and an audit table that cannot be read
(``AuditStoreError``) propagate as they are: the job fails, the message is retried, and the run
resumes past the shards already written.
"""

from __future__ import annotations

from tollway.exceptions import TollwayError

__all__ = ["ExportConflict", "ExportError", "ExportIntegrityError", "ExportUnavailable", "InvalidExportRequest"]


class ExportError(TollwayError):
    """A dataset export could not be made or read."""


class InvalidExportRequest(ExportError, ValueError):
    """The export request is malformed: the text names fields, never their values."""


class ExportConflict(ExportError):
    """An export object that is immutable exists with other content: a different request reused an
    export id, or the source changed (a record expired or was deleted) since a shard was written."""


class ExportIntegrityError(ExportError):
    """A manifest or shard read back does not match its digest."""


class ExportUnavailable(ExportError):
    """The exports bucket or a queue refused or failed a call (named by operation and AWS error code)."""
