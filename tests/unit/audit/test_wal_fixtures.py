"""Checked-in WAL segments: what recovery and the reader do with bytes written by an earlier version.

The fixtures under ``fixtures/wal/`` are committed bytes. ``build_fixtures`` below is the script
that made them (``python -m tests.unit.audit.test_wal_fixtures`` rewrites them); a test checks the
two still agree, so a change to the on-disk format shows up as a failing fixture instead of
silently making old spools unreadable. Payloads are literal JSON here, not built by
``tollway.audit.events``, so an event-schema change does not rewrite WAL fixtures.
"""

from __future__ import annotations

import shutil
import struct
import uuid
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import SMALL, FaultFs, open_writer, segment_files
from tollway.audit.events import EVENT_KINDS, decode_event
from tollway.audit.wal import WalCorrupt, WalReader, WalWriter
from tollway.audit.wal.format import encode_header, encode_record, segment_name

FIXTURES = Path(__file__).parent / "fixtures" / "wal"
SEGMENT = segment_name(1)
SEGMENT_ID = uuid.UUID("6f1c7a52-9d3e-4b8a-a1f0-3c2d9e8b7a61")
CREATED_MS = 1_767_225_600_000
INSTANCE = "fixture-gw:worker-0"


def _event(n: int, kind: str, attempt: int | None, body: str) -> bytes:
    attempt_json = "null" if attempt is None else str(attempt)
    return (
        f'{{"schemaVersion":1,"eventId":"019b7f00-0000-7000-8000-{n:012d}","kind":"{kind}",'
        f'"requestId":"req-fixture-1","attempt":{attempt_json},"ts":{CREATED_MS + n},'
        f'"rootDigest":"sha256:fixture","body":{body}}}'
    ).encode()


LIFECYCLE = (
    _event(1, "request_admitted", None, '{"principalId":"svc-a","alias":"chat-fast-v1","stream":false}'),
    _event(2, "attempt_started", 1, '{"routeId":"r1","deploymentId":"d1","reason":"first"}'),
    _event(3, "attempt_finished", 1, '{"routeId":"r1","outcome":"ok","totalMs":12.5}'),
    _event(4, "request_finished", None, '{"status":200,"outcome":"ok","attempts":1}'),
)
UNKNOWN_KIND = _event(5, "cache_lookup", None, '{"hit":false,"futureField":[1,2,3]}')


def _segment(payloads: tuple[bytes, ...], *, version: int = 1) -> bytes:
    header = encode_header(SEGMENT_ID, INSTANCE, CREATED_MS, version=version)
    return header + b"".join(encode_record(seq, p) for seq, p in enumerate(payloads, start=1))


def _record_offset(data: bytes, index: int) -> int:
    pos = len(encode_header(SEGMENT_ID, INSTANCE, CREATED_MS))
    for _ in range(index):
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 16 + length
    return pos


def build_fixtures() -> dict[str, bytes]:
    """Every fixture file, by path under ``fixtures/wal/``."""
    valid = _segment(LIFECYCLE)
    fifth = encode_record(5, _event(5, "request_admitted", None, '{"principalId":"svc-b"}'))
    corrupt = bytearray(valid)
    corrupt[_record_offset(valid, 1) + 16 + 10] ^= 0x20  # one bit of the second record's payload
    bad_length = bytearray(valid)
    struct.pack_into("<I", bad_length, _record_offset(valid, 1), 0xFFFF_FFF0)
    return {
        f"valid/{SEGMENT}": valid,
        f"partial_tail/{SEGMENT}": valid + fifth[: len(fifth) // 2],
        f"mid_segment_corruption/{SEGMENT}": bytes(corrupt),
        f"impossible_length/{SEGMENT}": bytes(bad_length),
        f"unknown_version/{SEGMENT}": _segment(LIFECYCLE, version=2),
        f"unknown_event_kind/{SEGMENT}": _segment((LIFECYCLE[0], UNKNOWN_KIND, LIFECYCLE[3])),
    }


def fixture_dir(case: str, tmp_path: Path) -> Path:
    """A private copy: recovery may truncate, and the checked-in bytes must stay as they are."""
    target = tmp_path / case
    shutil.copytree(FIXTURES / case, target)
    return target


def test_checked_in_fixtures_are_what_the_generator_writes() -> None:
    expected = build_fixtures()
    on_disk = {str(p.relative_to(FIXTURES)): p.read_bytes() for p in FIXTURES.rglob("*.seg")}
    assert sorted(on_disk) == sorted(expected)
    for name, data in expected.items():
        assert on_disk[name] == data, name


def test_valid_segment_recovers_every_record_and_replays_them(tmp_path: Path) -> None:
    directory = fixture_dir("valid", tmp_path)
    open_writer(directory).close()
    records = WalReader(directory).read(0, 100, 1 << 20)
    assert [(r.sequence, r.payload) for r in records] == list(enumerate(LIFECYCLE, start=1))
    assert [decode_event(r.payload).kind for r in records] == list(EVENT_KINDS)


def test_recovery_report_of_a_valid_segment(tmp_path: Path) -> None:
    directory = fixture_dir("valid", tmp_path)
    writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True)
    report = writer.open()
    assert (report.segments, report.records, report.truncated_bytes) == (1, 4, 0)
    assert (report.unacked_records, report.last_sequence) == (4, 4)
    assert writer.append(b"next") == 5
    writer.close()
    assert (directory / SEGMENT).read_bytes() == (FIXTURES / "valid" / SEGMENT).read_bytes()


def test_partial_final_record_is_truncated_and_reported(tmp_path: Path) -> None:
    directory = fixture_dir("partial_tail", tmp_path)
    fs = FaultFs()
    writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True, fs=fs)
    report = writer.open()
    valid = (FIXTURES / "valid" / SEGMENT).read_bytes()
    torn = (FIXTURES / "partial_tail" / SEGMENT).read_bytes()
    assert report.truncated_bytes == len(torn) - len(valid) > 0
    assert (report.records, report.last_sequence) == (4, 4)
    assert (directory / SEGMENT).read_bytes() == valid
    assert fs.ops("truncate") == [SEGMENT]
    assert fs.ops("fdatasync", SEGMENT), "the truncation must be durable before a newer segment exists"
    assert writer.append(b"after recovery") == 5
    writer.close()
    assert [r.sequence for r in WalReader(directory).read(0, 100, 1 << 20)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("case", ["mid_segment_corruption", "impossible_length"])
def test_corruption_in_the_middle_of_a_segment_is_rejected_untouched(case: str, tmp_path: Path) -> None:
    directory = fixture_dir(case, tmp_path)
    writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True)
    with pytest.raises(WalCorrupt, match="with more data after it"):
        writer.open()
    assert (directory / SEGMENT).read_bytes() == (FIXTURES / case / SEGMENT).read_bytes()
    assert segment_files(directory) == [directory / SEGMENT]
    with pytest.raises(WalCorrupt):
        WalReader(directory).read(0, 100, 1 << 20)
    assert writer.stats()["available"] == 0
    with pytest.raises(RuntimeError):
        writer.open()


def test_unknown_format_version_is_rejected_not_guessed(tmp_path: Path) -> None:
    directory = fixture_dir("unknown_version", tmp_path)
    with pytest.raises(WalCorrupt, match="version 2"):
        WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True).open()
    with pytest.raises(WalCorrupt, match="version 2"):
        WalReader(directory).read(0, 100, 1 << 20)
    assert (directory / SEGMENT).read_bytes() == (FIXTURES / "unknown_version" / SEGMENT).read_bytes()


def test_unknown_event_kind_is_returned_intact_for_the_consumer_to_skip(tmp_path: Path) -> None:
    directory = fixture_dir("unknown_event_kind", tmp_path)
    writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=False)
    assert writer.open().records == 3
    writer.close()
    records = WalReader(directory).read(0, 100, 1 << 20)
    assert [r.payload for r in records] == [LIFECYCLE[0], UNKNOWN_KIND, LIFECYCLE[3]]
    unknown = decode_event(records[1].payload)
    assert unknown.kind == "cache_lookup" and unknown.kind not in EVENT_KINDS
    assert unknown.body == {"hit": False, "futureField": [1, 2, 3]}


def test_torn_tails_made_from_the_valid_fixture(tmp_path: Path) -> None:
    """Other shapes of an unfinished last write: zero fill, a bad final checksum, a bare record header."""
    valid = (FIXTURES / "valid" / SEGMENT).read_bytes()
    last_bad = bytearray(valid)
    last_bad[-1] ^= 0xFF
    fourth = _record_offset(valid, 3)
    cases = {
        "zeros": (valid + bytes(4096), 4, 4096),
        "last_checksum": (bytes(last_bad), 3, len(valid) - fourth),
        "bare_header": (valid + struct.pack("<IIQ", 0xFFFF_FFF0, 0, 0), 4, 16),
    }
    for name, (data, records, truncated) in cases.items():
        directory = tmp_path / name
        directory.mkdir()
        (directory / SEGMENT).write_bytes(data)
        writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=False)
        report = writer.open()
        writer.close()
        assert (report.records, report.truncated_bytes, report.last_sequence) == (records, truncated, records), name
        assert (directory / SEGMENT).read_bytes() == data[: len(data) - truncated], name


def test_a_header_cut_short_at_creation_is_removed_and_sequences_continue(tmp_path: Path) -> None:
    directory = fixture_dir("valid", tmp_path)
    torn = encode_header(SEGMENT_ID, INSTANCE, CREATED_MS)[:20]
    (directory / segment_name(5)).write_bytes(torn)
    writer = WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True)
    report = writer.open()
    assert (report.segments, report.records, report.truncated_bytes, report.last_sequence) == (1, 4, 20, 4)
    assert writer.append(b"x") == 5
    writer.close()
    assert [p.name for p in segment_files(directory)] == [SEGMENT, segment_name(5)]


def test_a_sealed_segment_with_a_partial_tail_is_corruption(tmp_path: Path) -> None:
    """Only the newest segment can be torn: the writer fdatasyncs a segment before starting the next."""
    directory = fixture_dir("partial_tail", tmp_path)
    (directory / segment_name(6)).write_bytes(_segment(()))
    with pytest.raises(WalCorrupt, match="sealed segment"):
        WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True).open()


def test_records_out_of_sequence_are_corruption(tmp_path: Path) -> None:
    header = encode_header(SEGMENT_ID, INSTANCE, CREATED_MS)
    cases = {
        "repeat": header + encode_record(1, b"a") + encode_record(1, b"b"),
        "backwards": header + encode_record(1, b"a") + encode_record(3, b"b") + encode_record(2, b"c"),
        "not_the_name": header + encode_record(2, b"a"),
    }
    for name, data in cases.items():
        directory = tmp_path / name
        directory.mkdir()
        (directory / SEGMENT).write_bytes(data)
        with pytest.raises(WalCorrupt, match="bad_sequence"):
            WalWriter(directory, instance_id="gw-2", limits=SMALL, durable=True).open()


if __name__ == "__main__":
    for rel, content in build_fixtures().items():
        path = FIXTURES / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
