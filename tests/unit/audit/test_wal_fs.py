"""The WAL's file-system seam: the fault-injecting wrapper the other WAL tests use, and the real one's modes.

``FaultFs`` is the real ``OsFileSystem`` with a call log and faults placed exactly where the WAL
meets the disk: an ``OSError`` with a given errno from any operation, a partial write followed by
an error (a writer killed mid-batch), or a gate that holds an operation until the test releases it
(a slow fsync). The gates wait a bounded time, so a broken test fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tollway.audit.wal import OsFileSystem, WalFull, WalLimits, WalReader, WalWriter
from tollway.audit.wal.fs import OpenMode

GATE_TIMEOUT_S = 10.0
SMALL = WalLimits(
    max_bytes=64 * 1024,
    segment_bytes=8 * 1024,
    max_record_bytes=1024,
    max_batch_records=64,
    max_batch_bytes=64 * 1024,
    max_commit_delay_s=0.001,
    commit_timeout_s=5.0,
)


class WriterKilled(BaseException):
    """Stands in for whatever kills the writer thread in the middle of a batch."""


@dataclass
class Fault:
    """Fire on calls of ``op`` whose file name contains ``match``, after letting ``skip`` of them pass."""

    op: str
    error: BaseException | None = None
    match: str = ""
    skip: int = 0
    partial: bool = False
    """For ``write``: write the first half of the data, then raise ``error``."""
    gate: threading.Event | None = None
    """Hold the call until the event is set (then run it normally)."""
    entered: threading.Event = field(default_factory=threading.Event)
    """Set when a call reaches the fault (gated or failing)."""
    seen: int = 0


class FaultFs(OsFileSystem):
    """``OsFileSystem`` plus an ordered call log ``(op, file name)`` and injectable faults."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.faults: list[Fault] = []
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def mark(self, what: str, detail: str = "") -> None:
        """Put a test's own event into the call log, to order it against file-system calls."""
        with self._lock:
            self.calls.append((what, detail))

    def ops(self, op: str, match: str = "") -> list[str]:
        with self._lock:
            return [name for o, name in self.calls if o == op and match in name]

    def _before(self, op: str, name: str) -> Fault | None:
        with self._lock:
            self.calls.append((op, name))
            for fault in self.faults:
                if fault.op == op and fault.match in name:
                    fault.seen += 1
                    if fault.seen > fault.skip:
                        break
            else:
                return None
        fault.entered.set()
        if fault.gate is not None and not fault.gate.wait(GATE_TIMEOUT_S):
            raise OSError(errno.ETIMEDOUT, "test gate never opened")
        if fault.error is not None and not fault.partial:
            raise fault.error
        return fault

    def open(self, path: Path, mode: OpenMode) -> int:
        self._before("open:" + mode, path.name)
        fd = super().open(path, mode)
        self._names[fd] = path.name
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        fault = self._before("write", self._names.get(fd, "?"))
        if fault is not None and fault.partial and fault.error is not None:
            os.write(fd, bytes(data[: max(1, len(data) // 2)]))
            raise fault.error
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        name = self._names.get(fd, "?")
        self._before("fdatasync", name)
        super().fdatasync(fd)
        self.mark("fdatasync:done", name)

    def truncate(self, fd: int, size: int) -> None:
        self._before("truncate", self._names.get(fd, "?"))
        super().truncate(fd, size)

    def close(self, fd: int) -> None:
        self._names.pop(fd, None)
        super().close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        self._before("rename", dst.name)
        super().rename(src, dst)

    def stat_size(self, path: Path) -> int:
        self._before("stat_size", path.name)
        return super().stat_size(path)

    def unlink(self, path: Path) -> None:
        self._before("unlink", path.name)
        super().unlink(path)

    def fsync_dir(self, path: Path) -> None:
        self._before("fsync_dir", path.name)
        super().fsync_dir(path)

    def makedirs(self, path: Path) -> None:
        self._before("makedirs", path.name)
        super().makedirs(path)


def os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` (bounded); fail the test if it never holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


async def async_wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


def open_writer(
    directory: Path, *, durable: bool = True, limits: WalLimits = SMALL, fs: FaultFs | None = None
) -> WalWriter:
    writer = WalWriter(directory, instance_id="test-gw-1", limits=limits, durable=durable, fs=fs)
    writer.open()
    return writer


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("wal-*.seg"))


def fill_until_full(writer: WalWriter, payload: bytes = b"e" * 1000, most: int = 1000) -> int:
    """Append ``payload`` until the WAL refuses one with ``WalFull``; the appends it accepted."""
    accepted = 0
    with pytest.raises(WalFull):
        for _ in range(most):
            writer.append(payload)
            accepted += 1
    return accepted


# the real file system


def test_directory_and_files_are_private_to_the_gateway(tmp_path: Path) -> None:
    directory = tmp_path / "spool" / "wal"
    writer = open_writer(directory)
    writer.append(b"event")
    writer.close()
    WalReader(directory).acknowledge(1)
    assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0
    files = [*segment_files(directory), directory / "ack.ckpt", directory / "wal.lock"]
    assert len(files) == 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path.name


def test_segment_creation_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    fs = OsFileSystem()
    path = tmp_path / "wal-00000000000000000001.seg"
    path.write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        fs.open(path, "create")
    assert path.read_bytes() == b"keep me"


def test_the_directory_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    fs = OsFileSystem()
    first = fs.lock(tmp_path / "wal.lock")
    try:
        with pytest.raises(BlockingIOError):
            fs.lock(tmp_path / "wal.lock")
    finally:
        fs.close(first)
    fs.close(fs.lock(tmp_path / "wal.lock"))


def test_fault_fs_logs_calls_in_order_and_fires_after_skips(tmp_path: Path) -> None:
    fs = FaultFs()
    fs.add(Fault("fdatasync", os_error(errno.EIO), skip=1))
    fd = fs.open(tmp_path / "f", "replace")
    fs.write(fd, b"abc")
    fs.fdatasync(fd)
    with pytest.raises(OSError) as err:
        fs.fdatasync(fd)
    fs.close(fd)
    assert err.value.errno == errno.EIO
    assert fs.calls == [
        ("open:replace", "f"),
        ("write", "f"),
        ("fdatasync", "f"),
        ("fdatasync:done", "f"),
        ("fdatasync", "f"),
    ]
