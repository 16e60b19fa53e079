"""The WAL's bytes: versioned segment headers, record length/checksum/sequence, size limits, rollover, the byte bound.

Layouts are checked with ``struct`` offsets written out here, not with the module's own decoder,
so a change to the format cannot pass by changing the encoder and decoder together.
"""

from __future__ import annotations

import struct
import time
import uuid
import zlib
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import SMALL, fill_until_full, open_writer, segment_files, wait_until
from tollway.audit.wal import WalCorrupt, WalFull, WalLimits, WalReader, WalWriter
from tollway.audit.wal.format import decode_header, encode_header, encode_record, header_prefix_is_torn

HEADER_FIXED = 36  # magic 8, version 2, uuid 16, created-at 8, id length 2


def parse_header(data: bytes) -> tuple[bytes, int, uuid.UUID, int, str, int]:
    magic, version, raw_id, created, id_len = struct.unpack_from("<8sH16sQH", data)
    instance = data[HEADER_FIXED : HEADER_FIXED + id_len].decode()
    (crc,) = struct.unpack_from("<I", data, HEADER_FIXED + id_len)
    assert crc == zlib.crc32(data[: HEADER_FIXED + id_len])
    return magic, version, uuid.UUID(bytes=raw_id), created, instance, HEADER_FIXED + id_len + 4


def parse_records(data: bytes, pos: int) -> list[tuple[int, bytes]]:
    out = []
    while pos < len(data):
        length, crc, seq = struct.unpack_from("<IIQ", data, pos)
        payload = data[pos + 16 : pos + 16 + length]
        assert len(payload) == length
        assert crc == zlib.crc32(struct.pack("<Q", seq) + payload)
        out.append((seq, payload))
        pos += 16 + length
    return out


def test_segment_header_is_magic_version_uuid_created_at_instance_and_checksum(tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    writer = open_writer(tmp_path)
    writer.close()
    (segment,) = segment_files(tmp_path)
    magic, version, segment_id, created, instance, length = parse_header(segment.read_bytes())
    assert (magic, version, instance) == (b"TWLAUDIT", 1, "test-gw-1")
    assert segment_id.version == 4
    assert before <= created <= int(time.time() * 1000)
    assert segment.stat().st_size == length
    assert segment.name == "wal-00000000000000000001.seg"


def test_each_segment_gets_its_own_uuid(tmp_path: Path) -> None:
    for _ in range(2):
        writer = open_writer(tmp_path)
        writer.append(b"x")
        writer.close()
    ids = {parse_header(p.read_bytes())[2] for p in segment_files(tmp_path)}
    assert len(ids) == 2


def test_record_is_length_checksum_sequence_payload(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    assert [writer.append(p) for p in (b"first", b"", b"third event")] == [1, 2, 3]
    writer.close()
    data = segment_files(tmp_path)[0].read_bytes()
    assert parse_records(data, parse_header(data)[5]) == [(1, b"first"), (2, b""), (3, b"third event")]


def test_checksum_covers_the_sequence_not_only_the_payload() -> None:
    one, two = encode_record(1, b"same"), encode_record(2, b"same")
    assert one[4:8] != two[4:8]
    assert one[16:] == two[16:]


def test_unknown_format_version_is_rejected_by_number() -> None:
    header = encode_header(uuid.uuid4(), "gw", 0, version=2)
    with pytest.raises(WalCorrupt, match="version 2"):
        decode_header(header)


@pytest.mark.parametrize(("offset", "what"), [(0, "magic"), (9, "version"), (20, "checksum"), (38, "checksum")])
def test_a_damaged_header_is_rejected(offset: int, what: str) -> None:
    header = bytearray(encode_header(uuid.uuid4(), "gw", 123))
    header[offset] ^= 0x01
    with pytest.raises(WalCorrupt, match=what):
        decode_header(bytes(header))


def test_instance_id_is_bounded() -> None:
    for bad in ("", "x" * 257):
        with pytest.raises(ValueError):
            WalWriter(Path("unused"), instance_id=bad, limits=SMALL, durable=False)
    assert decode_header(encode_header(uuid.uuid4(), "é" * 128, 0)).instance_id == "é" * 128


def test_payload_over_max_record_bytes_is_refused_and_takes_no_sequence(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    with pytest.raises(ValueError, match="exceeds 1024"):
        writer.append(b"x" * 1025)
    assert writer.append(b"x" * 1024) == 1
    writer.close()
    assert [r.sequence for r in WalReader(tmp_path).read(0, 10, 10_000)] == [1]


def test_segments_roll_over_before_exceeding_segment_bytes(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    payloads = [bytes([i % 251]) * (300 + i) for i in range(60)]
    for p in payloads:
        writer.append(p)
    writer.close()
    segments = segment_files(tmp_path)
    assert len(segments) >= 3
    seen: list[tuple[int, bytes]] = []
    for path in segments:
        data = path.read_bytes()
        assert len(data) <= SMALL.segment_bytes
        records = parse_records(data, parse_header(data)[5])
        assert records, path.name
        assert path.name == f"wal-{records[0][0]:020d}.seg"
        seen += records
    assert seen == list(enumerate(payloads, start=1))
    assert writer.stats()["rollovers"] == len(segments) - 1


def test_total_bytes_are_bounded_by_max_bytes_with_wal_full(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    accepted = fill_until_full(writer)
    assert 40 < accepted < SMALL.max_bytes // 1000
    assert writer.appended == accepted
    with pytest.raises(WalFull):
        writer.append(b"e" * 1000)  # nothing was acknowledged, so nothing was freed
    writer.close()
    assert sum(p.stat().st_size for p in segment_files(tmp_path)) <= SMALL.max_bytes
    stats = writer.stats()
    assert stats["full_rejections"] == 2
    assert stats["bytes_on_disk"] == sum(p.stat().st_size for p in segment_files(tmp_path))


def test_acknowledging_frees_space_for_new_appends(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    fill_until_full(writer)
    wait_until(lambda: writer.durable_watermark == writer.appended)
    full_bytes = writer.stats()["bytes_on_disk"]
    WalReader(tmp_path).acknowledge(writer.appended)
    wait_until(lambda: writer.stats()["bytes_on_disk"] < full_bytes)
    assert writer.append(b"e" * 1000) == writer.appended
    writer.close()


def test_a_rejected_append_asks_the_writer_to_remeasure_the_disk(tmp_path: Path) -> None:
    """Another process (the Lambda extension) deletes acknowledged segments without telling this one."""
    writer = open_writer(tmp_path, durable=False)
    fill_until_full(writer)
    wait_until(lambda: writer.durable_watermark == writer.appended)
    for path in segment_files(tmp_path)[:-1]:
        path.unlink()
    accepted: list[int] = []

    def retry() -> bool:
        try:
            accepted.append(writer.append(b"e" * 1000))
        except WalFull:
            return False
        return True

    wait_until(retry)
    writer.close()
    assert accepted


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_bytes": 0},
        {"max_batch_records": 0},
        {"max_commit_delay_s": -1.0},
        {"async_write_delay_s": -0.001},
        {"commit_timeout_s": 0.0},
        {"max_record_bytes": 32 * 1024 * 1024, "segment_bytes": 64 * 1024 * 1024},
        {"segment_bytes": 1024, "max_record_bytes": 1024},
        {"max_bytes": 100 * 1024 * 1024, "segment_bytes": 64 * 1024 * 1024},
    ],
)
def test_limits_the_wal_cannot_honour_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WalLimits(**kwargs)  # type: ignore[arg-type]


def test_default_limits_are_the_seeds_spool_defaults() -> None:
    limits = WalLimits()
    assert (limits.max_bytes, limits.segment_bytes, limits.max_record_bytes) == (2**30, 2**26, 2**16)
    assert (limits.max_batch_records, limits.max_batch_bytes) == (256, 2**20)
    assert (limits.max_commit_delay_s, limits.commit_timeout_s) == (0.001, 10.0)
    assert limits.async_write_delay_s == 0.01, "the loop's write delay: 10 ms (docs/audit.md)"


def test_only_a_cut_short_header_counts_as_torn() -> None:
    """Recovery removes a torn header's file; a damaged one must be rejected instead, records and all."""
    header = encode_header(uuid.uuid4(), "gw-1", 0)
    assert all(header_prefix_is_torn(header[:n]) for n in range(len(header)))
    assert not header_prefix_is_torn(header)
    assert not header_prefix_is_torn(b"XWLAUDIT")
    wrong_version = header[:8] + struct.pack("<H", 2) + header[10:20]
    assert not header_prefix_is_torn(wrong_version)
    huge_id = header[:34] + struct.pack("<H", 60_000) + b"records follow" * 10
    assert not header_prefix_is_torn(huge_id)
    with pytest.raises(WalCorrupt, match="instance id length"):
        decode_header(huge_id)
