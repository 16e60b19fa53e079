"""The shipper's side of the WAL: read records in sequence, checkpoint acknowledgements, free segments.

A reader may run in the writer's process (server mode: the shipper task) or in another one (the
Lambda extension, or after a restart). In the writer's process it never returns a record above the
writer's durable watermark; elsewhere it returns the complete, checksum-valid records on disk and
stops before a record still being written. Reading does not change anything on disk.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tollway.audit.wal.format import ACK_FILE, WalCorrupt, WalUnavailable, encode_checkpoint
from tollway.audit.wal.fs import OsFileSystem, WalFileSystem
from tollway.audit.wal.segments import (
    Resume,
    ScanLimits,
    list_segments,
    live_writer,
    read_checkpoint,
    scan_segment,
    write_all,
)

__all__ = ["WalReader", "WalRecord"]

_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class WalRecord:
    sequence: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Cursor:
    """Where the last read stopped, so a consumer reading forward never rescans a segment."""

    first_sequence: int
    resume: Resume


class WalReader:
    """Reads and acknowledges one WAL directory; not thread-safe (one shipper owns it)."""

    def __init__(self, directory: Path, *, fs: WalFileSystem | None = None) -> None:
        self._dir = Path(directory)
        self._fs: WalFileSystem = fs if fs is not None else OsFileSystem()
        self._acked: int | None = None
        self._cursor: _Cursor | None = None
        self._caught_up = True

    @property
    def caught_up(self) -> bool:
        """Whether the last :meth:`read` returned every record readable when it ran.

        False when it stopped at ``max_records`` or ``max_bytes``: more records can be read right
        away. True when it reached the end of the newest segment or the live writer's durable
        watermark (or found nothing): what follows has not been written, or not made durable, yet.
        """
        return self._caught_up

    @property
    def acked(self) -> int:
        """The durable acknowledgement checkpoint (0 before the first acknowledgement)."""
        if self._acked is None:
            try:
                self._acked = read_checkpoint(self._fs, self._dir)
            except OSError as exc:
                raise WalUnavailable(f"cannot read the ack checkpoint: {exc}") from exc
        return self._acked

    def read(self, after_seq: int, max_records: int, max_bytes: int) -> list[WalRecord]:
        """Records with sequence > ``after_seq``, in order: at most ``max_records``, and payloads of at
        most ``max_bytes`` in total, except that one record is returned whatever its size.

        Raises :class:`WalCorrupt` for damage a recovery would reject, :class:`WalUnavailable` for I/O errors.
        """
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be positive")
        self._caught_up = True
        writer = live_writer(self._dir)
        cap = writer.durable_watermark if writer is not None else None
        if cap is not None and cap <= after_seq:
            return []
        for _ in range(_ATTEMPTS):
            try:
                return self._read(after_seq, max_records, max_bytes, cap)
            except FileNotFoundError:
                self._cursor = None  # a segment was acknowledged away between listing and opening
            except OSError as exc:
                raise WalUnavailable(f"cannot read the WAL: {exc}") from exc
        raise WalUnavailable("WAL segments kept disappearing while being read")

    def _read(self, after_seq: int, max_records: int, max_bytes: int, cap: int | None) -> list[WalRecord]:
        segments = list_segments(self._fs, self._dir)
        if not segments:
            return []
        idx, resume = self._locate(segments, after_seq)
        out: list[WalRecord] = []
        used = 0
        while True:
            first, name = segments[idx]
            newest = idx == len(segments) - 1
            limits = ScanLimits(
                after_seq=after_seq,
                max_keep=max_records - len(out),
                max_keep_bytes=max_bytes - used,
                max_sequence=cap,
                payloads=True,
                keep_oversized_first=not out,
            )
            scan = scan_segment(self._fs, self._dir / name, first, resume=resume, limits=limits)
            out.extend(WalRecord(seq, payload) for seq, payload in scan.records)
            used += sum(len(payload) for _, payload in scan.records)
            if scan.torn and not newest:
                raise WalCorrupt(f"{name}: a sealed segment ends in a partial record")
            if scan.header is not None:
                self._cursor = _Cursor(first, Resume(scan.header.segment_id, scan.pos, scan.last_sequence))
            if scan.limited or newest:
                at_cap = cap is not None and scan.last_sequence >= cap
                self._caught_up = not scan.limited or at_cap
                return out
            idx, resume = idx + 1, None

    def _locate(self, segments: list[tuple[int, str]], after_seq: int) -> tuple[int, Resume | None]:
        """The segment holding ``after_seq + 1`` (or the oldest), and the cursor if it points into it."""
        idx = 0
        for i, (first, _) in enumerate(segments):
            if first <= after_seq + 1:
                idx = i
        c = self._cursor
        if c is not None and c.resume.prev_sequence <= after_seq and segments[idx][0] == c.first_sequence:
            return idx, c.resume
        return idx, None

    def acknowledge(self, seq: int) -> None:
        """Durably checkpoint ``seq`` as shipped, then delete every segment whose records are all at or below it.

        The checkpoint is written to a temporary file, fdatasync'd, renamed over the old one, and
        the directory fsync'd, all before any segment is unlinked; the newest segment is never
        deleted (the writer may be appending to it, and its name carries the sequence forward).
        """
        if seq < 0:
            raise ValueError("sequence must not be negative")
        if seq <= self.acked:
            return
        fs, tmp = self._fs, self._dir / (ACK_FILE + ".tmp")
        try:
            fd = fs.open(tmp, "replace")
            try:
                write_all(fs, fd, encode_checkpoint(seq))
                fs.fdatasync(fd)
            finally:
                fs.close(fd)
            fs.rename(tmp, self._dir / ACK_FILE)
            fs.fsync_dir(self._dir)
        except OSError as exc:
            raise WalUnavailable(f"cannot write the ack checkpoint: {exc}") from exc
        self._acked = seq
        self._delete_acknowledged(seq)

    def _delete_acknowledged(self, seq: int) -> None:
        fs = self._fs
        try:
            segments = list_segments(fs, self._dir)
            deleted = 0
            for (_, name), (next_first, _) in itertools.pairwise(segments):
                if next_first - 1 > seq:
                    break
                with contextlib.suppress(FileNotFoundError):
                    fs.unlink(self._dir / name)
                deleted += 1
            if deleted:
                fs.fsync_dir(self._dir)
        except OSError as exc:
            raise WalUnavailable(f"checkpoint {seq} is durable but acknowledged segments remain: {exc}") from exc
        writer = live_writer(self._dir)
        if deleted and writer is not None:
            writer.request_refresh()
