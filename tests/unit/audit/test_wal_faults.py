"""Volume faults, injected at the file-system seam: every one leaves the watermark before the failure.

After an fdatasync or write error, a read-only or full volume, or a dead writer thread, the writer
is unavailable: pending and later ``wait_durable`` and ``append`` raise ``WalUnavailable``, so the
gateway fails the request before dispatch. A slow fsync only times the waiter out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import threading
from pathlib import Path

import pytest

from tests.unit.audit.test_wal_fs import (
    SMALL,
    Fault,
    FaultFs,
    WriterKilled,
    async_wait_until,
    open_writer,
    os_error,
    segment_files,
)
from tollway.audit.wal import WalCommitTimeout, WalReader, WalUnavailable, WalWriter


async def _assert_unavailable_after_failure(writer: WalWriter, durable_before: int, failed_seq: int) -> None:
    with pytest.raises(WalUnavailable):
        await writer.wait_durable(failed_seq, timeout_s=5)
    assert writer.durable_watermark == durable_before < failed_seq
    with pytest.raises(WalUnavailable):
        writer.append(b"after the failure")
    with pytest.raises(WalUnavailable):
        await writer.wait_durable(failed_seq, timeout_s=5)
    await writer.wait_durable(durable_before)  # what was durable before stays durable
    assert writer.stats()["available"] == 0
    writer.close()


async def test_fdatasync_eio_fails_pending_and_later_waiters(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    ok = writer.append(b"committed")
    await writer.wait_durable(ok)
    fs.add(Fault("fdatasync", os_error(errno.EIO)))
    pending = asyncio.ensure_future(writer.wait_durable(writer.append(b"doomed"), timeout_s=5))
    with pytest.raises(WalUnavailable) as err:
        await pending
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.EIO
    await _assert_unavailable_after_failure(writer, ok, ok + 1)


async def test_write_enospc_makes_the_writer_unavailable(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    ok = writer.append(b"committed")
    await writer.wait_durable(ok)
    fs.add(Fault("write", os_error(errno.ENOSPC)))
    failed = writer.append(b"no room")
    await _assert_unavailable_after_failure(writer, ok, failed)
    ops = [op for op, _ in fs.calls]
    assert "fdatasync" not in ops[len(ops) - 1 - ops[::-1].index("write") :], "nothing is synced after a failed write"


async def test_bounded_async_write_failure_is_reported_too(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, durable=False, fs=fs)
    fs.add(Fault("write", os_error(errno.EIO)))
    failed = writer.append(b"lost")
    await _assert_unavailable_after_failure(writer, 0, failed)


def test_read_only_volume_fails_open(tmp_path: Path) -> None:
    fs = FaultFs()
    fs.add(Fault("open:create", os_error(errno.EROFS)))
    writer = WalWriter(tmp_path, instance_id="gw", limits=SMALL, durable=True, fs=fs)
    with pytest.raises(WalUnavailable) as err:
        writer.open()
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.EROFS
    with pytest.raises(WalUnavailable):
        writer.append(b"x")
    assert writer.durable_watermark == 0
    again = WalWriter(tmp_path, instance_id="gw", limits=SMALL, durable=True)
    again.open()  # the failed open released the directory lock
    again.close()


async def test_volume_turning_read_only_at_rollover_fails_the_batch(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    first = writer.append(b"a" * 1000)
    await writer.wait_durable(first)
    fs.add(Fault("open:create", os_error(errno.EROFS)))
    seqs = [writer.append(b"b" * 1000) for _ in range(12)]  # more than one segment holds
    with pytest.raises(WalUnavailable):
        await writer.wait_durable(seqs[-1], timeout_s=5)
    assert writer.durable_watermark < seqs[-1]
    assert writer.durable_watermark >= first
    await _assert_unavailable_after_failure(writer, writer.durable_watermark, seqs[-1])


async def test_slow_fsync_times_the_waiter_out_but_the_writer_catches_up(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    gate = fs.add(Fault("fdatasync", gate=threading.Event()))
    seq = writer.append(b"slow")
    with pytest.raises(WalCommitTimeout):
        await writer.wait_durable(seq, timeout_s=0.05)
    assert writer.durable_watermark == seq - 1
    assert writer.stats()["available"] == 1
    assert gate.gate is not None
    gate.gate.set()
    await writer.wait_durable(seq, timeout_s=5)
    assert writer.durable_watermark == seq
    writer.close()


async def test_commit_timeout_defaults_to_the_configured_limit(tmp_path: Path) -> None:
    fs = FaultFs()
    limits = dataclasses.replace(SMALL, commit_timeout_s=0.05)
    writer = open_writer(tmp_path, fs=fs, limits=limits)
    gate = fs.add(Fault("fdatasync", gate=threading.Event()))
    seq = writer.append(b"slow")
    with pytest.raises(WalCommitTimeout):
        await asyncio.wait_for(writer.wait_durable(seq), 5)
    assert gate.gate is not None
    gate.gate.set()
    writer.close()


async def test_writer_killed_mid_batch_is_unavailable_and_recovery_truncates_its_tail(tmp_path: Path) -> None:
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    ok = writer.append(b"committed")
    await writer.wait_durable(ok)
    kill = fs.add(Fault("write", WriterKilled(), partial=True))
    seqs = [writer.append(b"in flight %d" % i) for i in range(5)]
    await async_wait_until(kill.entered.is_set)
    with pytest.raises(WalUnavailable):
        await writer.wait_durable(seqs[-1], timeout_s=5)
    ops = [op for op, _ in fs.calls]
    assert "fdatasync" not in ops[ops.index("write", len(ops) - 1 - ops[::-1].index("write")) :]
    await _assert_unavailable_after_failure(writer, ok, seqs[0])

    restarted = WalWriter(tmp_path, instance_id="gw", limits=SMALL, durable=True)
    report = restarted.open()
    assert report.truncated_bytes > 0
    assert ok <= report.last_sequence < seqs[-1]
    assert restarted.append(b"after restart") == report.last_sequence + 1
    restarted.close()
    records = WalReader(tmp_path).read(0, 100, 1 << 20)
    assert [r.sequence for r in records] == [*range(1, report.last_sequence + 1), report.last_sequence + 1]
    assert records[0].payload == b"committed"


async def test_a_writer_thread_that_vanished_is_detected(tmp_path: Path) -> None:
    """A thread that ends without reporting (as if killed from outside) still makes the writer unavailable."""
    fs = FaultFs()
    writer = open_writer(tmp_path, fs=fs)
    gate = fs.add(Fault("fdatasync", gate=threading.Event()))
    seq = writer.append(b"stuck")
    await async_wait_until(gate.entered.is_set)
    real = writer._thread
    assert real is not None
    vanished = threading.Thread(target=lambda: None)  # stands in for the real one, parked in the gate
    vanished.start()
    vanished.join()
    writer._thread = vanished
    with pytest.raises(WalUnavailable):
        await writer.wait_durable(seq, timeout_s=0.05)
    with pytest.raises(WalUnavailable):
        writer.append(b"x")
    assert writer.durable_watermark == seq - 1
    assert gate.gate is not None
    gate.gate.set()
    writer.close()
    real.join(5)
    assert not real.is_alive()


def test_a_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = open_writer(tmp_path)
    with pytest.raises(WalUnavailable, match="another writer"):
        WalWriter(tmp_path, instance_id="gw-2", limits=SMALL, durable=True).open()
    first.close()


async def test_acknowledge_with_a_failing_checkpoint_fsync_deletes_nothing(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, durable=False)
    for _ in range(30):
        writer.append(b"e" * 1000)
    writer.close()
    before = segment_files(tmp_path)
    assert len(before) > 2
    fs = FaultFs()
    fs.add(Fault("fdatasync", os_error(errno.EIO), match="ack.ckpt"))
    reader = WalReader(tmp_path, fs=fs)
    with pytest.raises(WalUnavailable):
        reader.acknowledge(30)
    assert reader.acked == 0
    assert fs.ops("unlink") == [] and fs.ops("rename") == []
    assert segment_files(tmp_path) == before
    assert WalReader(tmp_path).acked == 0
