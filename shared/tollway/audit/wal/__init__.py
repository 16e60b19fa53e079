"""The audit write-ahead log: append-only segments on local disk, committed before the request
path moves on, read and acknowledged by the shipper.

Modules: ``writer`` (the append side, :class:`WalWriter`), ``reader`` (:class:`WalReader`),
``format`` (the on-disk records and the errors), ``segments`` (segment files), ``recovery``
(start-up scan), ``dirs`` (one WAL directory per process, orphan shipping), ``fs`` (the file
system seam the fault tests replace).
"""

from tollway.audit.wal.format import WalCommitTimeout, WalCorrupt, WalError, WalFull, WalUnavailable
from tollway.audit.wal.fs import OsFileSystem, WalFileSystem
from tollway.audit.wal.reader import WalReader, WalRecord
from tollway.audit.wal.recovery import RecoveryReport
from tollway.audit.wal.writer import COMMIT_WAIT_BUCKETS_S, WalLimits, WalWriter

__all__ = [
    "COMMIT_WAIT_BUCKETS_S",
    "OsFileSystem",
    "RecoveryReport",
    "WalCommitTimeout",
    "WalCorrupt",
    "WalError",
    "WalFileSystem",
    "WalFull",
    "WalLimits",
    "WalReader",
    "WalRecord",
    "WalUnavailable",
    "WalWriter",
]
