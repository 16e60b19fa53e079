"""Reproducible layer zips: the writer, the digests, the machine-path scan and Lambda's size limits.

A layer zip is a function of its files' paths, contents and executable bits only. Entries are
sorted, every entry carries one fixed timestamp (``SOURCE_DATE_EPOCH`` if set, else 1980-01-01,
the earliest a zip can store), files are 0644 or 0755 (executables), directories 0755, and the
deflate level is fixed. The owner, the umask, the mtime and the order the filesystem lists files
in never reach the archive, so two builds from the same inputs have the same sha256.

``content_sha256`` digests the same (path, mode, content) list without the compressor. The zip's
own sha256 also depends on the zlib that deflated it (zlib-ng, for one, compresses differently);
when two machines disagree on ``sha256`` but agree on ``content_sha256``, the layers are the same.
"""

from __future__ import annotations

import hashlib
import stat
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "MIB",
    "BuildError",
    "DateTime",
    "LayerSizeError",
    "LayerZip",
    "Limits",
    "check_sizes",
    "find_machine_paths",
    "write_zip",
    "zip_date_time",
]

MIB: Final = 1024 * 1024
DOS_EPOCH: Final = 315_532_800
"""1980-01-01T00:00:00Z: the earliest timestamp a zip entry can hold."""
DOS_LAST: Final = 4_354_819_198
"""2107-12-31T23:59:58Z: the latest."""
COMPRESS_LEVEL: Final = 6
FILE_MODE: Final = 0o644
EXEC_MODE: Final = 0o755

DateTime = tuple[int, int, int, int, int, int]
"""A zip entry's timestamp: year, month, day, hour, minute, second."""


class BuildError(Exception):
    """A layer cannot be built as asked; the message says what to change."""


class LayerSizeError(BuildError):
    """A layer (or all of them together) is over one of Lambda's size limits."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Lambda's layer size limits, in bytes.

    ``zip_bytes`` is the direct-upload limit of one zip (50 MiB). ``unzipped_total_bytes`` is the
    250 MiB that a function's code and all its layers may take unzipped, less
    ``reserved_bytes`` for what the function adds beside these layers: its own code, AWS's
    Lambda Web Adapter layer (the streaming deployment) and the WAL-shipper extension layer.
    """

    zip_bytes: int = 50 * MIB
    unzipped_total_bytes: int = 250 * MIB
    reserved_bytes: int = 25 * MIB

    @property
    def layers_unzipped_bytes(self) -> int:
        return self.unzipped_total_bytes - self.reserved_bytes


@dataclass(frozen=True, slots=True)
class LayerZip:
    """One written layer zip and what the manifest says about it."""

    name: str
    path: Path
    sha256: str
    content_sha256: str
    zipped_bytes: int
    unzipped_bytes: int
    files: int


def zip_date_time(source_date_epoch: str | None) -> DateTime:
    """The entries' timestamp: ``SOURCE_DATE_EPOCH`` (UTC) clamped to what a zip can hold."""
    if source_date_epoch is None or source_date_epoch == "":
        epoch = DOS_EPOCH
    else:
        try:
            epoch = int(source_date_epoch)
        except ValueError:
            raise BuildError(f"SOURCE_DATE_EPOCH must be an integer, got {source_date_epoch!r}") from None
    y, mo, d, h, mi, s = time.gmtime(min(max(epoch, DOS_EPOCH), DOS_LAST))[:6]
    return y, mo, d, h, mi, s


def _is_executable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXUSR)


def _directories(arcnames: Iterable[str]) -> set[str]:
    dirs: set[str] = set()
    for name in arcnames:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]) + "/")
    return dirs


def write_zip(name: str, files: Mapping[str, Path], dest: Path, date_time: DateTime) -> LayerZip:
    """Write ``files`` (arcname -> source) to ``dest`` deterministically, with their directories."""
    bad = sorted(a for a in files if a.startswith("/") or a.endswith("/") or ".." in a.split("/") or "\\" in a)
    if bad:
        raise BuildError(f"{name}: invalid archive names {bad[:5]}")
    entries = sorted([*files, *_directories(files)])
    content = hashlib.sha256()
    unzipped = 0
    with zipfile.ZipFile(dest, "w") as zf:
        for arcname in entries:
            info = zipfile.ZipInfo(arcname, date_time)
            info.create_system = 3
            if arcname.endswith("/"):
                info.external_attr = (stat.S_IFDIR | EXEC_MODE) << 16
                zf.writestr(info, b"")
                continue
            source = files[arcname]
            mode = EXEC_MODE if _is_executable(source) else FILE_MODE
            data = source.read_bytes()
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL)
            unzipped += len(data)
            content.update(f"{mode:o} {arcname} {hashlib.sha256(data).hexdigest()}\n".encode())
    return LayerZip(
        name=name,
        path=dest,
        sha256=hashlib.sha256(dest.read_bytes()).hexdigest(),
        content_sha256=content.hexdigest(),
        zipped_bytes=dest.stat().st_size,
        unzipped_bytes=unzipped,
        files=len(files),
    )


def find_machine_paths(zip_path: Path, needles: Iterable[str]) -> list[str]:
    """The entries whose name or content holds one of ``needles`` (absolute paths of this machine)."""
    encoded = sorted({n.encode() for n in needles if n.strip("/")})
    hits = []
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            data = info.filename.encode() + b"\0" + zf.read(info)
            found = [n.decode() for n in encoded if n in data]
            if found:
                hits.append(f"{info.filename} ({', '.join(found)})")
    return hits


def check_sizes(layers: Sequence[LayerZip], limits: Limits) -> None:
    """Raise :class:`LayerSizeError` naming every limit that ``layers`` break, with the numbers."""
    problems = [
        f"{z.name}: {z.path.name} is {z.zipped_bytes / MIB:.1f} MiB zipped; Lambda's direct-upload limit is "
        f"{limits.zip_bytes / MIB:.1f} MiB"
        for z in layers
        if z.zipped_bytes > limits.zip_bytes
    ]
    total = sum(z.unzipped_bytes for z in layers)
    if total > limits.layers_unzipped_bytes:
        problems.append(
            f"the layers take {total / MIB:.1f} MiB unzipped; Lambda allows "
            f"{limits.unzipped_total_bytes / MIB:.1f} MiB for a function and its layers, less "
            f"{limits.reserved_bytes / MIB:.1f} MiB kept for the function's code and other layers, "
            f"so at most {limits.layers_unzipped_bytes / MIB:.1f} MiB"
        )
    if problems:
        raise LayerSizeError("layer size limit exceeded:\n  " + "\n  ".join(problems))
