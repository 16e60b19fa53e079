"""Which WAL directory a process writes, and how a shipper takes over one that nobody writes any more.

Every writing process has a directory of its own under the WAL root, with one writer (``wal.lock``):

- server mode: ``worker-<N>`` (``$TOLLWAY_WORKER_INDEX``), the same after a restart, so a restarted
  worker recovers what its predecessor appended but never shipped;
- Lambda: ``env-<id>``, one per execution environment. The id is made once per environment and
  kept in its ``/tmp``, which the function and the extension share and no other environment sees.
  A function process restarted in the same environment finds the same id, so it recovers its WAL;
  with the root on EFS, shared by every environment, no two environments write one directory;
- anything else: ``worker-0``.

A directory nobody writes any more is an **orphan**: an execution environment reclaimed with
records left on EFS, or a worker index that a smaller ``--workers`` no longer starts. Shippers adopt
orphans (:func:`claim_orphan`), so those records are delivered too:

1. claim: the directory has been idle (no file changed) for ``idle_s``, and both its ``ship.lock``
   and its ``wal.lock`` are free. A live shipper holds the first and a live writer the second, for
   as long as they run; the adopter holds both until it lets go;
2. recover: the writer's own recovery (a torn tail is cut; corruption in the middle is left for an
   operator, :class:`~tollway.audit.wal.format.WalCorrupt`);
3. drain with a :class:`~tollway.audit.ship.shipper.Shipper`, for at most ``ORPHAN_PASS_S`` a pass (the
   next pass resumes from the checkpoint), then :meth:`OrphanWal.retire`: once the checkpoint
   covers the last record *and* the directory has been idle for ``ORPHAN_RETIRE_S`` (a day), its
   WAL files and the directory are deleted. Shipping early and deleting late: on EFS a frozen
   environment's locks may lapse while it sleeps; its records are then shipped twice at worst
   (the store is idempotent), but its files stay until it is surely gone.

Only real directories that hold WAL files (``wal.lock``, a segment or a checkpoint) are adopted,
never a symlink, and only WAL file names are ever deleted.

Standard library only: the Lambda extension imports this.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import AuditSink, SinkUnavailable
from tollway.audit.wal.format import LOCK_FILE, WalError
from tollway.audit.wal.fs import OsFileSystem, WalFileSystem
from tollway.audit.wal.reader import WalReader
from tollway.audit.wal.recovery import recover

__all__ = [
    "ENVIRONMENT_ID_FILE",
    "ORPHAN_IDLE_S",
    "ORPHAN_PASS_S",
    "ORPHAN_RETIRE_S",
    "SHIP_LOCK_FILE",
    "OrphanWal",
    "ShipLock",
    "claim_orphan",
    "environment_id",
    "lambda_directory_name",
    "ship_orphans",
    "wal_directories",
    "wal_directory_name",
]

log = logging.getLogger("tollway.audit")

ENVIRONMENT_ID_FILE: Final = "tollway-environment-id"
SHIP_LOCK_FILE: Final = "ship.lock"
ORPHAN_IDLE_S: Final = 300.0
"""How long a directory must have been unchanged before a shipper adopts it: beyond the seconds a
process restart takes, so the locks are never the only thing standing between two shippers."""
ORPHAN_RETIRE_S: Final = 24 * 3600.0
"""How long an adopted, fully shipped directory must have been unchanged before it is deleted."""
ORPHAN_PASS_S: Final = 2.0
"""The most one orphan pass ships for, so the live directories are drained again soon."""

_DIRECTORY: Final = re.compile(r"(worker-\d+|env-[0-9a-f]{32})")
_WAL_FILE: Final = re.compile(r"wal-\d{20}\.seg|ack\.ckpt(\.tmp)?|wal\.lock|ship\.lock")
_ID: Final = re.compile(r"[0-9a-f]{32}")


def environment_id(scratch: Path | None = None) -> str:
    """This execution environment's id (32 hex digits), made on first use and kept in ``scratch``.

    ``scratch`` (default: the temporary directory, ``/tmp`` on Lambda) must be private to the
    environment. The file is created whole with ``link``, so two processes asking at once get the
    same id, and neither can read a half-written one.
    """
    path = (scratch or Path(tempfile.gettempdir())) / ENVIRONMENT_ID_FILE
    # One process at a time reads, repairs or makes the id: without the lock, two processes that
    # both found a damaged file could each replace it and go on with different ids.
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _settle_environment_id(path)
    finally:
        os.close(fd)


def _settle_environment_id(path: Path) -> str:
    for _ in range(3):
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            pass
        else:
            if _ID.fullmatch(text):
                return text
            path.unlink(missing_ok=True)  # not ours, or damaged: make a new one
        candidate = uuid.uuid4().hex
        draft = path.with_name(f".{path.name}.{candidate}")
        draft.write_text(candidate)
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process made it first: read theirs
        finally:
            draft.unlink(missing_ok=True)
    raise OSError(errno.EIO, f"cannot settle an environment id in {path.parent}")


def wal_directory_name(env: Mapping[str, str], scratch: Path | None = None) -> str:
    """The name of the WAL directory this process writes (see the module docstring)."""
    index = env.get("TOLLWAY_WORKER_INDEX")
    if index is not None and index.strip():
        return f"worker-{int(index)}"
    if env.get("AWS_LAMBDA_FUNCTION_NAME"):
        return lambda_directory_name(scratch)
    return "worker-0"


def lambda_directory_name(scratch: Path | None = None) -> str:
    """``env-<id>``: the directory this Lambda execution environment's function writes."""
    return f"env-{environment_id(scratch)}"


def wal_directories(root: Path) -> list[Path]:
    """Every WAL directory under ``root`` (``worker-<N>`` and ``env-<id>``), by name."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [
        root / name
        for name in names
        if _DIRECTORY.fullmatch(name) and not (root / name).is_symlink() and (root / name).is_dir()
    ]


class ShipLock:
    """``ship.lock`` of one WAL directory: whoever holds it is that directory's only shipper."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another shipper holds it or the directory is gone."""
        if self._file is not None:
            return True
        try:
            fd = os.open(self.directory / SHIP_LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return False
        lock = os.fdopen(fd, "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return False
        except BaseException:
            lock.close()
            raise
        self._file = lock
        return True

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class OrphanWal:
    """A WAL directory whose writer and shipper are gone, held by this process until released."""

    def __init__(
        self, path: Path, fs: WalFileSystem, ship: ShipLock, wal_lock_fd: int, last_sequence: int, idle_s: float
    ) -> None:
        self.path = path
        self.idle_s = idle_s
        """How long nothing in the directory had changed when it was claimed."""
        self.last_sequence = last_sequence
        """The highest sequence the directory held when it was claimed (nothing appends after)."""
        self._fs = fs
        self._ship = ship
        self._wal_lock_fd: int | None = wal_lock_fd

    def reader(self) -> WalReader:
        return WalReader(self.path, fs=self._fs)

    def retire(self, after_idle_s: float = ORPHAN_RETIRE_S) -> bool:
        """Delete the directory if its checkpoint covers every record and it had been idle for
        ``after_idle_s`` when claimed; whether it was deleted. Only WAL files are deleted: a
        directory that also holds anything else is emptied of them and left."""
        if self.idle_s < after_idle_s or self.reader().acked < self.last_sequence:
            return False
        for name in os.listdir(self.path):
            if _WAL_FILE.fullmatch(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / name)
        self.release()
        try:
            os.rmdir(self.path)
        except OSError:
            return False  # something else is in it, or another adopter's lock appeared meanwhile
        with contextlib.suppress(OSError):
            self._fs.fsync_dir(self.path.parent)
        return True

    def release(self) -> None:
        if self._wal_lock_fd is not None:
            with contextlib.suppress(OSError):
                self._fs.close(self._wal_lock_fd)
            self._wal_lock_fd = None
        self._ship.release()

    def __enter__(self) -> OrphanWal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _holds_a_wal(path: Path) -> bool:
    return any(_WAL_FILE.fullmatch(name) for name in os.listdir(path))


def _newest_change(path: Path) -> float:
    """When anything in ``path`` (or the directory itself) last changed (epoch seconds)."""
    newest = path.stat().st_mtime
    for name in os.listdir(path):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, (path / name).stat().st_mtime)
    return newest


def _idle_for(path: Path, now: float) -> float:
    """Seconds since anything in ``path`` (or the directory itself) last changed."""
    return now - _newest_change(path)


def claim_orphan(
    path: Path, *, idle_s: float = ORPHAN_IDLE_S, fs: WalFileSystem | None = None, now: float | None = None
) -> OrphanWal | None:
    """Adopt ``path`` if nobody writes or ships it (see the module docstring); ``None`` otherwise.

    Raises :class:`~tollway.audit.wal.format.WalCorrupt` (locks released) when recovery finds
    damage it must not repair.
    """
    fs = fs or OsFileSystem()
    try:
        if path.is_symlink() or not path.is_dir() or not _holds_a_wal(path):
            return None
        idle = _idle_for(path, time.time() if now is None else now)
    except FileNotFoundError:
        return None
    if idle < idle_s:
        return None
    ship = ShipLock(path)
    if not ship.acquire():
        return None
    try:
        wal_lock = fs.lock(path / LOCK_FILE)
    except BlockingIOError:
        ship.release()
        return None
    except BaseException:
        ship.release()
        raise
    try:
        report, _, _ = recover(fs, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.close(wal_lock)
        ship.release()
        raise
    return OrphanWal(path, fs, ship, wal_lock, report.last_sequence, idle)


def ship_orphans(
    root: Path,
    sink: AuditSink,
    *,
    own: Collection[Path],
    batch_records: int,
    batch_bytes: int,
    deadline: float | None = None,
    idle_s: float = ORPHAN_IDLE_S,
    retire_after_s: float = ORPHAN_RETIRE_S,
    budget_s: float = ORPHAN_PASS_S,
    drained: dict[Path, float] | None = None,
) -> tuple[int, int]:
    """Adopt, drain and retire every orphan under ``root`` but ``own``; (records shipped, directories retired).

    Stops after ``budget_s`` or at the ``time.monotonic()`` ``deadline``, whichever comes first
    (an orphan not drained by then is let go, and the next pass resumes from its checkpoint), and
    at the first sink failure, which it raises (:class:`~tollway.audit.ship.sinks.SinkUnavailable`).
    Any other failure with one orphan (damage, a file it cannot read or delete) is logged and
    that orphan left alone.

    ``drained``, kept by the caller from pass to pass, remembers orphans shipped to the end and
    when they last changed: until one changes or is due for deletion it is not claimed again,
    since a claim reads every segment (up to ``segmentBytes``, on EFS too).
    """
    shipped = retired = 0
    stop = time.monotonic() + budget_s
    until = stop if deadline is None else min(deadline, stop)
    mine = {p.resolve() for p in own}
    for path in wal_directories(root):
        if path.resolve() in mine:
            continue
        if time.monotonic() >= until:
            break
        if drained is not None and path in drained:
            try:
                changed = _newest_change(path)
            except FileNotFoundError:
                del drained[path]
                continue
            if changed == drained[path] and time.time() - changed < retire_after_s:
                continue  # shipped to the end already, and not due for deletion yet
        try:
            orphan = claim_orphan(path, idle_s=idle_s)
        except (WalError, OSError) as exc:
            log.warning("audit WAL %s was not adopted: %s", path.name, type(exc).__name__)
            continue
        if orphan is None:
            continue
        with orphan:
            shipper = Shipper(
                orphan.reader(),
                sink,
                batch_records=batch_records,
                batch_bytes=batch_bytes,
                idle_s=0.0,
                max_backoff_s=1.0,  # unused: a failed drain is not retried here
                max_rounds=1 << 20,
            )
            try:
                count = shipper.drain_once(until)
                shipped += count
                done = orphan.retire(retire_after_s)
            except SinkUnavailable:
                raise
            except Exception as exc:
                log.warning("audit WAL %s (adopted) failed: %s", path.name, type(exc).__name__)
                continue
            if done:
                retired += 1
                if drained is not None:
                    drained.pop(path, None)
                log.info("audit WAL %s adopted: %d records shipped, directory retired", path.name, count)
                continue
            if count:
                log.info("audit WAL %s adopted: %d records shipped", path.name, count)
            if drained is not None and orphan.reader().acked >= orphan.last_sequence:
                with contextlib.suppress(OSError):
                    drained[path] = _newest_change(path)
    return shipped, retired
