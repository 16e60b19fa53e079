"""The audit WAL's on-disk format: segment headers, records, the ack checkpoint, and their parsing.

Pure: no I/O. :mod:`tollway.audit.wal` documents the format in full and does the reading and
writing; this module is the single place that knows where the bytes go, so the writer, the
recovery scan and the reader cannot disagree about a layout.

All integers are little-endian and unsigned. The checksum is ``zlib.crc32`` (IEEE CRC-32): the
standard library of Python 3.11 has no CRC32C, and a pure-Python CRC32C would cost more than
the fdatasync it protects.
"""

from __future__ import annotations

import enum
import re
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import Final

from tollway.exceptions import TollwayError

__all__ = [
    "ACK_FILE",
    "ACK_MAGIC",
    "CHECKPOINT_BYTES",
    "FORMAT_MAX_RECORD_BYTES",
    "FORMAT_VERSION",
    "LOCK_FILE",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_INSTANCE_ID_BYTES",
    "RECORD_OVERHEAD",
    "ParseResult",
    "ParseStop",
    "SegmentHeader",
    "WalCommitTimeout",
    "WalCorrupt",
    "WalError",
    "WalFull",
    "WalUnavailable",
    "decode_checkpoint",
    "decode_header",
    "encode_checkpoint",
    "encode_header",
    "encode_record",
    "header_prefix_is_torn",
    "parse_records",
    "segment_first_sequence",
    "segment_name",
]


class WalError(TollwayError):
    """Base of the WAL's errors. The gateway maps every one of them to a 503 before dispatch."""


class WalFull(WalError):
    """Appending would take the WAL past ``max_bytes``: backpressure until the shipper acknowledges."""


class WalUnavailable(WalError):
    """The writer is closed or dead, or the volume failed (EIO, ENOSPC, EROFS): nothing more is accepted."""


class WalCommitTimeout(WalError):
    """A record did not reach the durable watermark in time; the writer itself may still recover."""


class WalCorrupt(WalError):
    """The segments on disk are not a WAL this code can trust: never guess record boundaries."""


MAGIC: Final = b"TWLAUDIT"
FORMAT_VERSION: Final = 1
MAX_INSTANCE_ID_BYTES: Final = 256
FORMAT_MAX_RECORD_BYTES: Final = 16 * 1024 * 1024
"""A hard ceiling on any record's length, whatever ``max_record_bytes`` was when it was written.

Readers do not know the writer's limits, so a length above this is "impossible" (garbage), while
a lower configured limit on a later run never makes older, longer records unreadable.
"""

_HEAD: Final = struct.Struct("<8sH16sQH")  # magic, version, segment uuid, created-at ms, instance-id length
_CRC: Final = struct.Struct("<I")
_RECORD: Final = struct.Struct("<IIQ")  # length, checksum, sequence
_SEQ: Final = struct.Struct("<Q")
RECORD_OVERHEAD: Final = _RECORD.size
MAX_HEADER_BYTES: Final = _HEAD.size + MAX_INSTANCE_ID_BYTES + _CRC.size

ACK_FILE: Final = "ack.ckpt"
ACK_MAGIC: Final = b"TWLACKPT"
_ACK: Final = struct.Struct("<8sHQ")  # magic, version, acknowledged sequence
CHECKPOINT_BYTES: Final = _ACK.size + _CRC.size
LOCK_FILE: Final = "wal.lock"
_SEGMENT_NAME: Final = re.compile(r"wal-(\d{20})\.seg")


def segment_name(first_sequence: int) -> str:
    """``wal-<first sequence, 20 digits>.seg``: names sort in sequence order."""
    return f"wal-{first_sequence:020d}.seg"


def segment_first_sequence(name: str) -> int | None:
    """The first sequence a segment file name declares, or ``None`` for any other file."""
    m = _SEGMENT_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    segment_id: uuid.UUID
    instance_id: str
    created_at_ms: int
    length: int
    """Bytes the header occupies; the first record starts here."""
    version: int = FORMAT_VERSION


def encode_header(
    segment_id: uuid.UUID, instance_id: str, created_at_ms: int, *, version: int = FORMAT_VERSION
) -> bytes:
    """``version`` is a parameter only so tests can write the unknown-version fixture."""
    ident = instance_id.encode()
    if not 0 < len(ident) <= MAX_INSTANCE_ID_BYTES:
        raise ValueError(f"instance id must be 1..{MAX_INSTANCE_ID_BYTES} UTF-8 bytes")
    head = _HEAD.pack(MAGIC, version, segment_id.bytes, created_at_ms, len(ident)) + ident
    return head + _CRC.pack(zlib.crc32(head))


def header_prefix_is_torn(data: bytes) -> bool:
    """Whether ``data`` (a whole file) is a header cut short while it was being created.

    Only such a file may be removed by recovery: it is shorter than the header it declares, and
    every field present is one a version-1 header could hold, so no record was ever in it. A
    damaged length or an unknown version is not "torn": it goes to :func:`decode_header` and is
    rejected, so a bit flip can never make recovery delete records.
    """
    if not MAGIC.startswith(data[: len(MAGIC)]):
        return False
    if len(data) >= 10 and int.from_bytes(data[8:10], "little") != FORMAT_VERSION:
        return False
    if len(data) < _HEAD.size:
        return True
    id_len = int.from_bytes(data[_HEAD.size - 2 : _HEAD.size], "little")
    return 0 < id_len <= MAX_INSTANCE_ID_BYTES and len(data) < _HEAD.size + id_len + _CRC.size


def decode_header(data: bytes) -> SegmentHeader:
    """Parse and verify a segment header from the start of ``data``; raises :class:`WalCorrupt`.

    The version is checked before anything after it, so a future layout is rejected by its
    number, never misread as a corrupt version 1.
    """
    if len(data) < _HEAD.size + _CRC.size:
        raise WalCorrupt("segment header is truncated")
    magic, version, raw_id, created, id_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise WalCorrupt("segment does not start with the WAL magic")
    if version != FORMAT_VERSION:
        raise WalCorrupt(f"segment format version {version} is not supported (this code reads {FORMAT_VERSION})")
    if not 0 < id_len <= MAX_INSTANCE_ID_BYTES:
        raise WalCorrupt(f"segment header declares an impossible instance id length {id_len}")
    end = _HEAD.size + id_len
    if len(data) < end + _CRC.size:
        raise WalCorrupt("segment header is truncated")
    (crc,) = _CRC.unpack_from(data, end)
    if zlib.crc32(data[:end]) != crc:
        raise WalCorrupt("segment header checksum mismatch")
    try:
        instance_id = data[_HEAD.size : end].decode()
    except UnicodeDecodeError:
        raise WalCorrupt("segment header instance id is not UTF-8") from None
    return SegmentHeader(uuid.UUID(bytes=raw_id), instance_id, created, end + _CRC.size, version)


def encode_record(sequence: int, payload: bytes) -> bytes:
    """``[length u32][checksum u32][sequence u64][payload]``; the checksum covers sequence and payload."""
    seq = _SEQ.pack(sequence)
    return _RECORD.pack(len(payload), zlib.crc32(payload, zlib.crc32(seq)), sequence) + payload


class ParseStop(enum.Enum):
    """Why :func:`parse_records` stopped before the end of its buffer (or ``END`` if it did not)."""

    END = "end"
    """Every byte was consumed, exactly at a record boundary."""
    LIMIT = "limit"
    """A caller's record, byte or sequence limit was reached."""
    SHORT = "short"
    """The buffer ends inside a record: read more, or it is a partial tail."""
    BAD_LENGTH = "bad_length"
    BAD_CHECKSUM = "bad_checksum"
    BAD_SEQUENCE = "bad_sequence"


@dataclass(slots=True)
class ParseResult:
    records: list[tuple[int, bytes]]
    """(sequence, payload) of the records kept, those past ``after_seq`` (empty unless ``payloads``)."""
    kept: int
    """How many records were kept (counted even without ``payloads``)."""
    pos: int
    """Offset in the buffer where parsing stopped: the start of the first record not consumed."""
    last_sequence: int
    """The last valid sequence seen, kept or skipped."""
    count: int
    """Valid records consumed, kept or skipped."""
    stop: ParseStop
    end: int = 0
    """For ``BAD_CHECKSUM``/``SHORT``: where the offending record claims to end (buffer offset)."""


def parse_records(
    buf: bytes | memoryview,
    pos: int,
    *,
    prev_sequence: int,
    first_sequence: int | None = None,
    after_seq: int = -1,
    max_keep: int | None = None,
    max_keep_bytes: int | None = None,
    max_sequence: int | None = None,
    keep_oversized_first: bool = True,
    payloads: bool = True,
) -> ParseResult:
    """Parse complete records in ``buf`` from ``pos``, verifying length, checksum and order.

    ``prev_sequence`` is the sequence before ``pos`` (records must be strictly greater);
    ``first_sequence``, when the scan starts at a segment's first record, must equal that
    record's sequence. Records at or below ``after_seq`` are verified but not kept; keeping stops
    at ``max_keep`` records, at a sequence above ``max_sequence``, or before a record whose
    payload would pass ``max_keep_bytes`` (unless it is the first kept and
    ``keep_oversized_first``: a consumer must never stall behind one large record). What a bad or
    short record means (a partial tail or corruption) depends on what follows it, which only the
    caller knows.
    """
    view = memoryview(buf)
    size = len(view)
    out: list[tuple[int, bytes]] = []
    kept = kept_bytes = count = 0
    prev = prev_sequence
    while True:
        if pos == size:
            return ParseResult(out, kept, pos, prev, count, ParseStop.END)
        if size - pos < RECORD_OVERHEAD:
            return ParseResult(out, kept, pos, prev, count, ParseStop.SHORT, pos + RECORD_OVERHEAD)
        length, crc, seq = _RECORD.unpack_from(view, pos)
        end = pos + RECORD_OVERHEAD + length
        if length > FORMAT_MAX_RECORD_BYTES:
            return ParseResult(out, kept, pos, prev, count, ParseStop.BAD_LENGTH, end)
        if end > size:
            return ParseResult(out, kept, pos, prev, count, ParseStop.SHORT, end)
        if zlib.crc32(view[pos + 8 : end]) != crc:
            return ParseResult(out, kept, pos, prev, count, ParseStop.BAD_CHECKSUM, end)
        if seq <= prev or (first_sequence is not None and count == 0 and seq != first_sequence):
            return ParseResult(out, kept, pos, prev, count, ParseStop.BAD_SEQUENCE, end)
        if seq > after_seq:
            if (
                (max_keep is not None and kept >= max_keep)
                or (max_sequence is not None and seq > max_sequence)
                or (
                    max_keep_bytes is not None
                    and kept_bytes + length > max_keep_bytes
                    and (kept or not keep_oversized_first)
                )
            ):
                return ParseResult(out, kept, pos, prev, count, ParseStop.LIMIT, end)
            if payloads:
                out.append((seq, bytes(view[pos + RECORD_OVERHEAD : end])))
            kept += 1
            kept_bytes += length
        prev = seq
        count += 1
        pos = end


def encode_checkpoint(acked: int) -> bytes:
    """The ack checkpoint file's whole content: magic, version, sequence, CRC-32 of the three."""
    body = _ACK.pack(ACK_MAGIC, FORMAT_VERSION, acked)
    return body + _CRC.pack(zlib.crc32(body))


def decode_checkpoint(data: bytes) -> int:
    """The acknowledged sequence; raises :class:`WalCorrupt` (the file is replaced atomically, so never torn)."""
    if len(data) != CHECKPOINT_BYTES:
        raise WalCorrupt(f"ack checkpoint has {len(data)} bytes, expected {CHECKPOINT_BYTES}")
    magic, version, acked = _ACK.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _ACK.size)
    if magic != ACK_MAGIC or zlib.crc32(data[: _ACK.size]) != crc:
        raise WalCorrupt("ack checkpoint is damaged")
    if version != FORMAT_VERSION:
        raise WalCorrupt(f"ack checkpoint version {version} is not supported")
    return int(acked)
