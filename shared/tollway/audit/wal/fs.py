"""The WAL's file-system seam: every byte the WAL reads or writes goes through one small Protocol.

The real implementation is a thin layer over ``os``. It exists so tests can put the failures a
volume really produces (EIO from fdatasync, ENOSPC from write, EROFS from open, a stalled fsync)
exactly where the WAL meets the disk, instead of simulating them inside the WAL's own logic.

Files are addressed by raw descriptors, as ``os`` does, so a fault wrapper needs no file objects.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["OpenMode", "OsFileSystem", "WalFileSystem"]

OpenMode = Literal["read", "rw", "create", "replace"]
"""``read``: read-only. ``rw``: an existing file, for recovery's truncation. ``create``: a new file
that must not exist (a segment). ``replace``: create or truncate (the checkpoint's temp file)."""

_FLAGS: dict[str, int] = {
    "read": os.O_RDONLY,
    "rw": os.O_RDWR,
    "create": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "replace": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
}
DIR_MODE = 0o700
FILE_MODE = 0o600


class WalFileSystem(Protocol):
    """What the WAL needs from a file system; errors are ``OSError`` with the OS's errno."""

    def makedirs(self, path: Path) -> None: ...
    def listdir(self, path: Path) -> list[str]: ...
    def open(self, path: Path, mode: OpenMode) -> int: ...
    def write(self, fd: int, data: bytes | memoryview) -> int: ...
    def pread(self, fd: int, size: int, offset: int) -> bytes: ...
    def size(self, fd: int) -> int: ...
    def truncate(self, fd: int, size: int) -> None: ...
    def fdatasync(self, fd: int) -> None: ...
    def close(self, fd: int) -> None: ...
    def stat_size(self, path: Path) -> int: ...
    def rename(self, src: Path, dst: Path) -> None: ...
    def unlink(self, path: Path) -> None: ...
    def fsync_dir(self, path: Path) -> None: ...
    def lock(self, path: Path) -> int:
        """Take an exclusive, non-blocking lock on ``path`` (created if missing); ``close`` releases it."""
        ...


class OsFileSystem:
    """The real file system: directories 0700, files 0600, descriptors close-on-exec."""

    def makedirs(self, path: Path) -> None:
        os.makedirs(path, mode=DIR_MODE, exist_ok=True)

    def listdir(self, path: Path) -> list[str]:
        return os.listdir(path)

    def open(self, path: Path, mode: OpenMode) -> int:
        return os.open(path, _FLAGS[mode] | os.O_CLOEXEC, FILE_MODE)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def stat_size(self, path: Path) -> int:
        return os.stat(path).st_size

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return fd
