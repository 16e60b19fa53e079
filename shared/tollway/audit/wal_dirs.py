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
   operator, :class:`~tollway.audit.wal_format.WalCorrupt`);
3. drain with a :class:`~tollway.audit.shipper.Shipper`, then :meth:`OrphanWal.retire`: once the
   acknowledgement checkpoint covers the last record, the files and the directory are deleted.

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

from tollway.audit.shipper import Shipper
from tollway.audit.sinks import AuditSink, SinkUnavailable
from tollway.audit.wal_format import LOCK_FILE, WalError
from tollway.audit.wal_fs import OsFileSystem, WalFileSystem
from tollway.audit.wal_reader import WalReader
from tollway.audit.wal_recovery import recover

__all__ = [
    "ENVIRONMENT_ID_FILE",
    "ORPHAN_IDLE_S",
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

_DIRECTORY: Final = re.compile(r"(worker-\d+|env-[0-9a-f]{32})")
_ID: Final = re.compile(r"[0-9a-f]{32}")


def environment_id(scratch: Path | None = None) -> str:
    """This execution environment's id (32 hex digits), made on first use and kept in ``scratch``.

    ``scratch`` (default: the temporary directory, ``/tmp`` on Lambda) must be private to the
    environment. The file is created whole with ``link``, so two processes asking at once get the
    same id, and neither can read a half-written one.
    """
    path = (scratch or Path(tempfile.gettempdir())) / ENVIRONMENT_ID_FILE
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
    return [root / name for name in names if _DIRECTORY.fullmatch(name) and (root / name).is_dir()]


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
            lock = (self.directory / SHIP_LOCK_FILE).open("ab")
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return False
        self._file = lock
        return True

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class OrphanWal:
    """A WAL directory whose writer and shipper are gone, held by this process until released."""

    def __init__(self, path: Path, fs: WalFileSystem, ship: ShipLock, wal_lock_fd: int, last_sequence: int) -> None:
        self.path = path
        self.last_sequence = last_sequence
        """The highest sequence the directory held when it was claimed (nothing appends after)."""
        self._fs = fs
        self._ship = ship
        self._wal_lock_fd: int | None = wal_lock_fd

    def reader(self) -> WalReader:
        return WalReader(self.path, fs=self._fs)

    def retire(self) -> bool:
        """Delete the directory if its checkpoint covers every record; whether it was deleted."""
        if self.reader().acked < self.last_sequence:
            return False
        for name in os.listdir(self.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / name)
        self.release()
        try:
            os.rmdir(self.path)
        except OSError:
            return False  # someone created a file meanwhile (another adopter's lock): it retires it
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


def _idle_for(path: Path, now: float) -> float:
    """Seconds since anything in ``path`` (or the directory itself) last changed."""
    newest = path.stat().st_mtime
    for name in os.listdir(path):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, (path / name).stat().st_mtime)
    return now - newest


def claim_orphan(
    path: Path, *, idle_s: float = ORPHAN_IDLE_S, fs: WalFileSystem | None = None, now: float | None = None
) -> OrphanWal | None:
    """Adopt ``path`` if nobody writes or ships it (see the module docstring); ``None`` otherwise.

    Raises :class:`~tollway.audit.wal_format.WalCorrupt` (locks released) when recovery finds
    damage it must not repair.
    """
    fs = fs or OsFileSystem()
    try:
        if idle_s > 0 and _idle_for(path, time.time() if now is None else now) < idle_s:
            return None
    except FileNotFoundError:
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
    return OrphanWal(path, fs, ship, wal_lock, report.last_sequence)


def ship_orphans(
    root: Path,
    sink: AuditSink,
    *,
    own: Collection[Path],
    batch_records: int,
    batch_bytes: int,
    deadline: float | None = None,
    idle_s: float = ORPHAN_IDLE_S,
) -> tuple[int, int]:
    """Adopt, drain and retire every orphan under ``root`` but ``own``; (records shipped, directories retired).

    Stops at the ``time.monotonic()`` ``deadline`` (an orphan not drained by then is let go, and
    the next pass resumes from its checkpoint) and at the first sink failure, which it raises
    (:class:`~tollway.audit.sinks.SinkUnavailable`). A damaged orphan is logged and left alone.
    """
    shipped = retired = 0
    mine = {p.resolve() for p in own}
    for path in wal_directories(root):
        if path.resolve() in mine:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
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
                count = shipper.drain_once(deadline)
            except SinkUnavailable:
                raise
            except (WalError, OSError) as exc:
                log.warning("audit WAL %s (adopted) could not be read: %s", path.name, type(exc).__name__)
                continue
            shipped += count
            if orphan.retire():
                retired += 1
                log.info("audit WAL %s adopted: %d records shipped, directory retired", path.name, count)
            elif count:
                log.info("audit WAL %s adopted: %d records shipped so far", path.name, count)
    return shipped, retired
