"""Which WAL directory a process writes, and adopting one nobody writes (real WALs on disk)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tollway.audit.wal import WalLimits, WalWriter
from tollway.audit.wal import dirs as wal_dirs
from tollway.audit.wal.dirs import (
    ENVIRONMENT_ID_FILE,
    ShipLock,
    claim_orphan,
    environment_id,
    ship_orphans,
    wal_directories,
    wal_directory_name,
)
from tollway.audit.wal.format import WalCorrupt

LIMITS = WalLimits(max_bytes=4 << 20, segment_bytes=256 << 10, max_record_bytes=64 << 10)


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    def send(self, batch: list[bytes]) -> None:
        for body in batch:
            self.events.extend(json.loads(body)["events"])


def fill(directory: Path, count: int, *, close: bool = True) -> WalWriter:
    writer = WalWriter(directory, instance_id="unit", limits=LIMITS, durable=True)
    writer.open()
    for n in range(count):
        writer.append(json.dumps({"eventId": f"e-{n}"}).encode())
    if close:
        writer.close()
    else:
        deadline = time.monotonic() + 5
        while writer.durable_watermark < count and time.monotonic() < deadline:
            time.sleep(0.01)
    return writer


def test_the_environment_id_is_made_once_and_shared_by_every_process(tmp_path: Path) -> None:
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(environment_id(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(ids[0]) == 32
    assert (tmp_path / ENVIRONMENT_ID_FILE).read_text() == ids[0]
    # No drafts left behind; the lock file serializes the processes that read or make the id.
    assert sorted(p.name for p in tmp_path.iterdir()) == [ENVIRONMENT_ID_FILE, ENVIRONMENT_ID_FILE + ".lock"]


def test_a_damaged_environment_id_is_replaced(tmp_path: Path) -> None:
    (tmp_path / ENVIRONMENT_ID_FILE).write_text("../../etc")
    made = environment_id(tmp_path)
    assert made != "../../etc" and len(made) == 32 and environment_id(tmp_path) == made


def test_directory_names_by_mode(tmp_path: Path) -> None:
    assert wal_directory_name({"TOLLWAY_WORKER_INDEX": "3"}, tmp_path) == "worker-3"
    assert wal_directory_name({}, tmp_path) == "worker-0"
    on_lambda = wal_directory_name({"AWS_LAMBDA_FUNCTION_NAME": "gw"}, tmp_path)
    assert on_lambda == f"env-{environment_id(tmp_path)}"
    assert wal_directory_name({"AWS_LAMBDA_FUNCTION_NAME": "gw"}, tmp_path) == on_lambda  # after a restart too
    other_environment = tmp_path / "elsewhere"
    other_environment.mkdir()
    assert wal_directory_name({"AWS_LAMBDA_FUNCTION_NAME": "gw"}, other_environment) != on_lambda


def test_only_wal_directories_are_listed(tmp_path: Path) -> None:
    for name in ("worker-0", "worker-12", "env-" + "a" * 32, "env-short", "worker-x", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "worker-5").write_text("a file")
    assert [p.name for p in wal_directories(tmp_path)] == ["env-" + "a" * 32, "worker-0", "worker-12"]
    assert wal_directories(tmp_path / "absent") == []


def test_a_live_writer_keeps_its_directory(tmp_path: Path) -> None:
    writer = fill(tmp_path / "w", 2, close=False)
    try:
        assert claim_orphan(tmp_path / "w", idle_s=0) is None
    finally:
        writer.close()
    orphan = claim_orphan(tmp_path / "w", idle_s=0)
    assert orphan is not None
    orphan.release()


def test_a_shipper_keeps_its_directory_and_the_adopter_holds_both_locks(tmp_path: Path) -> None:
    fill(tmp_path / "w", 2)
    ship = ShipLock(tmp_path / "w")
    assert ship.acquire()
    assert claim_orphan(tmp_path / "w", idle_s=0) is None
    ship.release()
    with claim_orphan(tmp_path / "w", idle_s=0) as orphan:  # type: ignore[union-attr]
        assert orphan.last_sequence == 2
        assert not ship.acquire()
        with pytest.raises(Exception, match="another writer"):
            fill(tmp_path / "w", 1)
    after = ShipLock(tmp_path / "w")
    assert after.acquire()
    after.release()


def test_a_recently_changed_directory_is_not_adopted(tmp_path: Path) -> None:
    fill(tmp_path / "w", 1)
    assert claim_orphan(tmp_path / "w", idle_s=60) is None
    later = time.time() + 61
    orphan = claim_orphan(tmp_path / "w", idle_s=60, now=later)
    assert orphan is not None
    orphan.release()


def test_retire_waits_for_the_checkpoint_then_deletes_everything(tmp_path: Path) -> None:
    fill(tmp_path / "w", 3)
    orphan = claim_orphan(tmp_path / "w", idle_s=0)
    assert orphan is not None
    reader = orphan.reader()
    assert [r.sequence for r in reader.read(reader.acked, 10, 1 << 20)] == [1, 2, 3]
    reader.acknowledge(2)
    assert not orphan.retire(after_idle_s=0) and (tmp_path / "w").is_dir()
    reader.acknowledge(3)
    assert not orphan.retire(), "claimed a moment after its last change: kept for a day"
    assert orphan.retire(after_idle_s=0)
    assert not (tmp_path / "w").exists()


def test_only_real_directories_holding_a_wal_are_adopted_and_only_wal_files_deleted(tmp_path: Path) -> None:
    (tmp_path / "worker-1").mkdir()
    (tmp_path / "worker-1" / "notes.txt").write_text("not a WAL")
    assert claim_orphan(tmp_path / "worker-1", idle_s=0) is None
    fill(tmp_path / "target", 1)
    (tmp_path / "worker-2").symlink_to(tmp_path / "target")
    assert claim_orphan(tmp_path / "worker-2", idle_s=0) is None
    assert [p.name for p in wal_directories(tmp_path)] == ["worker-1"]

    fill(tmp_path / "worker-3", 1)
    (tmp_path / "worker-3" / "notes.txt").write_text("someone else's")
    with claim_orphan(tmp_path / "worker-3", idle_s=0) as orphan:  # type: ignore[union-attr]
        reader = orphan.reader()
        reader.acknowledge(1)
        assert not orphan.retire(after_idle_s=0), "a directory that holds more than a WAL is not removed"
    assert sorted(os.listdir(tmp_path / "worker-3")) == ["notes.txt"]


def test_one_failing_orphan_does_not_stop_the_pass(tmp_path: Path) -> None:
    fill(tmp_path / "worker-1", 2)
    (tmp_path / "worker-1" / "ack.ckpt.tmp").mkdir()  # its checkpoint cannot be written: the drain fails
    fill(tmp_path / "worker-2", 3)
    sink = ListSink()
    shipped, retired = ship_orphans(
        tmp_path, sink, own=[], batch_records=64, batch_bytes=1 << 20, idle_s=0, retire_after_s=0
    )
    assert (shipped, retired) == (3, 1)
    assert len(sink.events) == 5  # worker-1's were sent but not acknowledged: sent again next pass
    assert (tmp_path / "worker-1").is_dir() and not (tmp_path / "worker-2").exists()


def test_an_orphan_pass_stops_at_its_budget(tmp_path: Path) -> None:
    fill(tmp_path / "worker-1", 2)
    sink = ListSink()
    assert ship_orphans(tmp_path, sink, own=[], batch_records=64, batch_bytes=1 << 20, idle_s=0, budget_s=0) == (0, 0)
    assert sink.events == []


def test_adoption_cuts_a_torn_tail_like_the_writers_recovery(tmp_path: Path) -> None:
    fill(tmp_path / "w", 2)
    segment = max((tmp_path / "w").glob("wal-*.seg"))
    with segment.open("ab") as f:
        f.write(b"\x40\x00\x00\x00partial")  # a crash in the middle of writing a record
    with claim_orphan(tmp_path / "w", idle_s=0) as orphan:  # type: ignore[union-attr]
        assert orphan.last_sequence == 2
        reader = orphan.reader()
        assert [r.sequence for r in reader.read(0, 10, 1 << 20)] == [1, 2]


def test_a_corrupt_orphan_raises_and_lets_go_of_its_locks(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "wal-00000000000000000001.seg").write_bytes(b"not a WAL segment" * 4)
    with pytest.raises(WalCorrupt):
        claim_orphan(tmp_path / "w", idle_s=0)
    after = ShipLock(tmp_path / "w")
    assert after.acquire()
    after.release()
    assert sorted(os.listdir(tmp_path / "w")) == ["ship.lock", "wal-00000000000000000001.seg", "wal.lock"]


def test_a_drained_orphan_is_not_claimed_again_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims: list[Path] = []
    real_recover = wal_dirs.recover
    monkeypatch.setattr(wal_dirs, "recover", lambda fs, path: claims.append(path) or real_recover(fs, path))
    fill(tmp_path / "worker-1", 2)
    sink, drained = ListSink(), {}
    common = {"own": [], "batch_records": 64, "batch_bytes": 1 << 20, "idle_s": 0, "drained": drained}

    assert ship_orphans(tmp_path, sink, retire_after_s=3600, **common) == (2, 0)  # type: ignore[arg-type]
    assert ship_orphans(tmp_path, sink, retire_after_s=3600, **common) == (0, 0)  # type: ignore[arg-type]
    assert len(claims) == 1, "a shipped-out orphan was read again (a claim recovers every segment)"

    time.sleep(0.01)
    fill(tmp_path / "worker-1", 1)  # it changed (say, a frozen environment woke up and wrote)
    assert ship_orphans(tmp_path, sink, retire_after_s=3600, **common) == (1, 0)  # type: ignore[arg-type]
    assert len(claims) == 2
    assert ship_orphans(tmp_path, sink, retire_after_s=0, **common) == (0, 1)  # type: ignore[arg-type]
    assert drained == {} and not (tmp_path / "worker-1").exists()
    assert [e["eventId"] for e in sink.events] == ["e-0", "e-1", "e-0"]


def test_two_adopters_racing_for_one_orphan_ship_it_once(tmp_path: Path) -> None:
    """Two shippers (two ship processes, or two Lambda environments' extensions on EFS) pass over
    the same orphan at once: the one that claimed it ships and retires it; the other skips it."""
    fill(tmp_path / "worker-1", 300)
    sending, release = threading.Event(), threading.Event()

    class HeldSink(ListSink):
        def send(self, batch: list[bytes]) -> None:
            sending.set()
            assert release.wait(5)
            super().send(batch)

    first, second = HeldSink(), ListSink()
    results: dict[str, tuple[int, int]] = {}

    def adopt(name: str, sink: ListSink) -> None:
        results[name] = ship_orphans(
            tmp_path, sink, own=[], batch_records=64, batch_bytes=1 << 20, idle_s=0, retire_after_s=0, budget_s=10
        )

    racer = threading.Thread(target=adopt, args=("first", first))
    racer.start()
    try:
        assert sending.wait(5), "the first adopter never reached its sink"
        adopt("second", second)  # while the first holds the orphan, in the middle of a send
    finally:
        release.set()
        racer.join(10)
    assert results == {"first": (300, 1), "second": (0, 0)}
    assert second.events == []
    assert [e["eventId"] for e in first.events] == [f"e-{n}" for n in range(300)]
    assert not (tmp_path / "worker-1").exists()
    assert ship_orphans(tmp_path, ListSink(), own=[], batch_records=64, batch_bytes=1 << 20, idle_s=0) == (0, 0)
