"""The segment files of one WAL directory: listing, the verifying scan, the ack checkpoint.

Shared by the writer's recovery and by the reader, so both classify the bytes after the last
good record the same way (see :func:`scan_segment`). Also the in-process registry of live
writers, through which a reader in the writer's own process never reads past the durable
watermark and tells the writer when an acknowledgement freed space.
"""

from __future__ import annotations

import errno
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from tollway.audit.wal.format import (
    ACK_FILE,
    CHECKPOINT_BYTES,
    MAX_HEADER_BYTES,
    ParseStop,
    SegmentHeader,
    WalCorrupt,
    decode_checkpoint,
    decode_header,
    header_prefix_is_torn,
    parse_records,
    segment_first_sequence,
)
from tollway.audit.wal.fs import WalFileSystem

__all__ = [
    "LiveWriter",
    "Resume",
    "ScanLimits",
    "SegmentScan",
    "list_segments",
    "live_writer",
    "read_checkpoint",
    "register_writer",
    "scan_segment",
    "unregister_writer",
    "write_all",
]

CHUNK_BYTES: Final = 256 * 1024


def list_segments(fs: WalFileSystem, directory: Path) -> list[tuple[int, str]]:
    """``(first sequence, file name)`` of every segment, oldest first; empty if the directory is missing."""
    try:
        names = fs.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(first, name) for name in names if (first := segment_first_sequence(name)) is not None]
    return sorted(found)


def read_checkpoint(fs: WalFileSystem, directory: Path) -> int:
    """The durable acknowledgement checkpoint, 0 when none was ever written."""
    try:
        fd = fs.open(directory / ACK_FILE, "read")
    except FileNotFoundError:
        return 0
    try:
        return decode_checkpoint(fs.pread(fd, CHECKPOINT_BYTES + 1, 0))
    finally:
        fs.close(fd)


@dataclass(frozen=True, slots=True)
class ScanLimits:
    """What a reader keeps; recovery keeps nothing but counts records past ``after_seq``."""

    after_seq: int = -1
    max_keep: int | None = None
    max_keep_bytes: int | None = None
    max_sequence: int | None = None
    payloads: bool = False
    keep_oversized_first: bool = True


@dataclass(slots=True)
class SegmentScan:
    header: SegmentHeader | None
    """``None`` for a header torn while the segment was being created (no record was ever in it)."""
    records: list[tuple[int, bytes]]
    kept: int
    count: int
    """Valid records consumed from ``start`` (kept or skipped)."""
    last_sequence: int
    pos: int
    """File offset where the scan stopped: the end of the last consumed record."""
    size: int
    torn: bool
    """The bytes from ``pos`` to ``size`` are a partial final record (or a torn header)."""
    limited: bool
    """The scan stopped at a caller's limit, not at the end of the valid records."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a previous scan of the same segment stopped (the segment id guards against a replaced file)."""

    segment_id: uuid.UUID
    pos: int
    prev_sequence: int


def scan_segment(
    fs: WalFileSystem,
    path: Path,
    first_sequence: int,
    *,
    resume: Resume | None = None,
    limits: ScanLimits = ScanLimits(),
) -> SegmentScan:
    """Verify a segment's header, then its records from the first (or from ``resume``, if it is this file).

    Bytes after the last valid record are a *torn tail* (returned as ``torn``) only if they could
    be the unfinished end of the last write: a partial record header or record, a complete record
    whose checksum fails and which ends exactly at the end of the file, an impossible length with
    nothing after its record header, or nothing but zeros (an extension the OS had not filled
    before a crash). Anything else (a bad checksum or length followed by more data, a record out
    of sequence, a bad header or an unknown format version) is :class:`WalCorrupt`. Whether a torn
    tail is acceptable is the caller's decision: only in the last segment.
    """
    fd = fs.open(path, "read")
    try:
        size = fs.size(fd)
        head = fs.pread(fd, min(size, MAX_HEADER_BYTES), 0)
        if header_prefix_is_torn(head):
            return SegmentScan(None, [], 0, 0, first_sequence - 1, 0, size, True, False)
        header = decode_header(head)
        if resume is not None and resume.segment_id == header.segment_id and resume.pos >= header.length:
            start, prev, check_first = resume.pos, resume.prev_sequence, False
        else:
            start, prev, check_first = header.length, first_sequence - 1, True
        return _scan_records(fs, fd, path, header, start, size, first_sequence, prev, check_first, limits)
    finally:
        fs.close(fd)


def _scan_records(
    fs: WalFileSystem,
    fd: int,
    path: Path,
    header: SegmentHeader,
    start: int,
    size: int,
    first_sequence: int,
    prev: int,
    check_first: bool,
    limits: ScanLimits,
) -> SegmentScan:
    records: list[tuple[int, bytes]] = []
    kept = kept_bytes = count = 0
    base, buf, need = start, b"", CHUNK_BYTES
    while True:
        while base + len(buf) < size and len(buf) < need:
            chunk = fs.pread(fd, min(need - len(buf), size - base - len(buf)), base + len(buf))
            if not chunk:
                size = base + len(buf)  # the file shrank under us: what we hold is all there is
                break
            buf += chunk
        res = parse_records(
            buf,
            0,
            prev_sequence=prev,
            first_sequence=first_sequence if count == 0 and check_first else None,
            after_seq=limits.after_seq,
            max_keep=None if limits.max_keep is None else limits.max_keep - kept,
            max_keep_bytes=None if limits.max_keep_bytes is None else limits.max_keep_bytes - kept_bytes,
            max_sequence=limits.max_sequence,
            keep_oversized_first=limits.keep_oversized_first and kept == 0,
            payloads=limits.payloads,
        )
        records.extend(res.records)
        kept += res.kept
        kept_bytes += sum(len(p) for _, p in res.records)
        count += res.count
        prev = res.last_sequence
        pos = base + res.pos
        at_eof = base + len(buf) >= size
        claimed_end = base + res.end
        buf, base = buf[res.pos :], pos
        need = max(CHUNK_BYTES, claimed_end - pos)
        stop = res.stop
        if stop is ParseStop.LIMIT:
            return SegmentScan(header, records, kept, count, prev, pos, size, False, True)
        if stop is ParseStop.END and at_eof:
            return SegmentScan(header, records, kept, count, prev, pos, size, False, False)
        if stop is ParseStop.END or (stop is ParseStop.SHORT and not at_eof):
            continue
        if stop is ParseStop.SHORT or _tail_is_torn(fs, fd, stop, pos, claimed_end, size):
            return SegmentScan(header, records, kept, count, prev, pos, size, True, False)
        raise WalCorrupt(f"{path.name}: {stop.value} at offset {pos} with more data after it")


def _tail_is_torn(fs: WalFileSystem, fd: int, stop: ParseStop, pos: int, claimed_end: int, size: int) -> bool:
    if stop is ParseStop.BAD_SEQUENCE:
        return False
    if stop is ParseStop.BAD_CHECKSUM and claimed_end == size:
        return True
    if stop is ParseStop.BAD_LENGTH and size - pos <= 16:
        return True
    offset = pos
    while offset < size:
        chunk = fs.pread(fd, min(CHUNK_BYTES, size - offset), offset)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        offset += len(chunk)
    return True


def write_all(fs: WalFileSystem, fd: int, data: bytes) -> None:
    """Write every byte, across short writes; a write that makes no progress is an I/O error."""
    view = memoryview(data)
    while view:
        n = fs.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[n:]


class LiveWriter(Protocol):
    """What a reader asks of a writer open in the same process."""

    @property
    def durable_watermark(self) -> int: ...
    def request_refresh(self) -> None: ...


_live: weakref.WeakValueDictionary[str, LiveWriter] = weakref.WeakValueDictionary()
_live_lock = threading.Lock()


def _key(directory: Path) -> str:
    return str(directory.resolve())


def register_writer(directory: Path, writer: LiveWriter) -> None:
    with _live_lock:
        _live[_key(directory)] = writer


def unregister_writer(directory: Path, writer: LiveWriter) -> None:
    with _live_lock:
        key = _key(directory)
        if _live.get(key) is writer:
            del _live[key]


def live_writer(directory: Path) -> LiveWriter | None:
    with _live_lock:
        return _live.get(_key(directory))
