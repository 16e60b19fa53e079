"""WAL recovery at open: verify every segment, repair only a torn tail, find where sequences continue.

The one repair allowed is cutting the unfinished end of the last write off the newest segment
(:func:`tollway.audit.wal.segments.scan_segment` decides what counts as one). A newest segment
left with no record at all is removed, so the writer's new segment can take its name. Everything
else that fails verification is :class:`WalCorrupt`: an operator must look, because guessing
record boundaries could ship garbage or drop events silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tollway.audit.wal.format import WalCorrupt
from tollway.audit.wal.fs import WalFileSystem
from tollway.audit.wal.segments import ScanLimits, list_segments, read_checkpoint, scan_segment

__all__ = ["RecoveryReport", "recover"]


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    segments: int
    """Segments found valid (after any truncation), not counting the one the writer then starts."""
    records: int
    truncated_bytes: int
    unacked_records: int
    """Valid records above the ack checkpoint: the reader will replay them."""
    last_sequence: int
    """Appends continue after this sequence."""


def recover(fs: WalFileSystem, directory: Path) -> tuple[RecoveryReport, int, int]:
    """Verify and repair ``directory``; returns the report, the bytes and the number of segments kept.

    The newest kept segment is fdatasync'd (truncated or not): the previous process may have died
    with its last writes only in the page cache, and once a newer segment exists that one is
    sealed, so it must not be able to lose its tail later. Sequences continue after the highest of
    the last valid record, the ack checkpoint and a removed empty segment's name, so a sequence is
    never reused even when a machine crash lost records that had already been shipped.
    """
    acked = read_checkpoint(fs, directory)
    segments = list_segments(fs, directory)
    prev = records = unacked = truncated = disk = kept = floor = 0
    for i, (first, name) in enumerate(segments):
        path, newest = directory / name, i == len(segments) - 1
        if first <= prev:
            raise WalCorrupt(f"{name}: starts at or before the previous segment's last record {prev}")
        scan = scan_segment(fs, path, first, limits=ScanLimits(after_seq=acked))
        if scan.torn and not newest:
            raise WalCorrupt(f"{name}: a sealed segment ends in a partial record")
        records += scan.count
        unacked += scan.kept
        prev = max(prev, scan.last_sequence)
        if scan.torn:
            truncated += scan.size - scan.pos
        if newest and scan.count == 0:
            fs.unlink(path)
            fs.fsync_dir(directory)
            floor = first - 1
            continue
        if newest:
            _truncate_and_sync(fs, path, scan.pos if scan.torn else None)
        disk += scan.pos if scan.torn else scan.size
        kept += 1
    last = max(prev, acked, floor)
    return RecoveryReport(kept, records, truncated, unacked, last), disk, kept


def _truncate_and_sync(fs: WalFileSystem, path: Path, size: int | None) -> None:
    fd = fs.open(path, "rw")
    try:
        if size is not None:
            fs.truncate(fd, size)
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
