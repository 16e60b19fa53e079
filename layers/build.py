"""Build the gateway's Lambda layers: ``python -m layers.build [--out DIR] [--only deps|core]``.

- ``deps.zip``: the ``[project] dependencies`` of ``pyproject.toml``, resolved through the lock
  ``constraints.txt`` and installed by pip for Lambda's platform (manylinux2014 x86_64, CPython
  3.13), under ``python/``.
- ``core.zip``: ``shared/tollway`` as ``python/tollway``, without what Lambda never runs.

boto3 stays out of the deps layer. The gateway calls it once per config publication, for
Secrets Manager's ``GetSecretValue``, which every boto3 the Python 3.13 runtime has shipped
supports, and the runtime provides one. Measured with this recipe for Python 3.13 and the lock's
boto3 1.44.5 and botocore 1.44.8: the layer is 14.4 MB zipped, 49.0 MB unzipped, 1,493 files
without them, and 32.1 MB, 72.8 MB, 3,711 files with them (botocore alone is 21.2 MB unzipped).
Bundling would multiply by 2.2 the zip that every new execution environment fetches, for one call
that is off the request path. The cost is that Lambda runs the runtime's boto3, not the lock's.

Downloaded wheels stay in ``layers/.cache/wheels`` (git-ignored). pip installs from that folder
alone, offline; only when the cache lacks a wheel does ``pip download`` fetch it first. A warm
build therefore needs no network and installs exactly the cached bytes.

The zips are written beside ``manifest.json`` only once every check has passed: the lock pins
every installed distribution, no absolute path of this machine is inside, and the sizes are
within Lambda's limits. A failed build leaves ``--out`` as it was.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from email.parser import HeaderParser
from pathlib import Path
from typing import Any, Final

from layers.archive import (
    MIB,
    BuildError,
    LayerZip,
    Limits,
    check_sizes,
    find_machine_paths,
    write_zip,
    zip_date_time,
)
from layers.extension import EXTENSION_NAME, layer_files

__all__ = ["LAYERS", "build", "core_files", "main", "project_requirements", "read_lock"]

ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_OUT: Final = ROOT / "layers" / "dist"
DEFAULT_CACHE: Final = ROOT / "layers" / ".cache"
LAYERS: Final = ("deps", "core", "extension")

TARGET: Final = {"platform": "manylinux2014_x86_64", "implementation": "cp", "python-version": "3.13"}
"""Lambda's python3.13 runtime (``infra.constructs.function.RUNTIME``): CPython 3.13 on Amazon Linux
2023 (glibc 2.34), x86_64. manylinux2014 (glibc 2.17) wheels run there, and every binary dependency
of the lock publishes one for CPython 3.13."""
PLATFORM_ARGS: Final = tuple(arg for key, value in TARGET.items() for arg in (f"--{key}", value))
RUNTIME_PROVIDED: Final = frozenset({"boto3", "botocore"})
"""Distributions the Lambda runtime already has; see the module docstring for why they stay out."""
CORE_EXCLUDED: Final = frozenset({"mock", "cloud"})
"""``tollway`` subpackages Lambda never runs: the mock providers (a local and benchmark server) and
``tollway.cloud`` (the resource spec the CDK app and the local cloud read at build and bootstrap
time, and the moto server launcher). Nothing on the gateway's import path imports either."""
INSTALLER_FILES: Final = frozenset({"INSTALLER", "REQUESTED", "direct_url.json"})
"""pip's notes about this install (who, on request, from which local path), not the package's."""
PIP_TIMEOUT_S: Final = 900


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise BuildError(f"cannot read a package name from requirement {requirement!r}")
    return _norm(match.group(1))


def project_requirements(pyproject: Path) -> list[str]:
    """``[project] dependencies`` of ``pyproject``, less what the Lambda runtime provides."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [r for r in deps if _requirement_name(r) not in RUNTIME_PROVIDED]


def read_lock(constraints: Path) -> dict[str, str]:
    """The lock as ``{normalized name: version}``; every line of it is ``name==version``."""
    pins: dict[str, str] = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise BuildError(f"{constraints.name}: {line!r} is not pinned with ==")
        pins[_norm(name)] = version.strip()
    return pins


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pip", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"pip did not finish in {PIP_TIMEOUT_S} s: {' '.join(cmd)}") from None


def _install_deps(site: Path, wheels: Path, requirements: Sequence[str], constraints: Path) -> None:
    common = (*PLATFORM_ARGS, "--only-binary=:all:", "-c", str(constraints))

    def install() -> subprocess.CompletedProcess[str]:
        """From the cache alone: ``--isolated`` keeps the machine's pip config (its indexes and
        find-links) from offering other files for the same versions."""
        shutil.rmtree(site, ignore_errors=True)
        offline = ("--isolated", "--no-index", "--find-links", str(wheels), "--no-compile")
        return _pip("install", "--target", str(site), *common, *offline, *requirements)

    if install().returncode == 0:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    fetched = _pip("download", "--dest", str(wheels), *common, *requirements)
    if fetched.returncode != 0:
        raise BuildError(f"pip download failed:\n{fetched.stderr.strip()[-3000:]}")
    done = install()
    if done.returncode != 0:
        raise BuildError(f"pip install failed:\n{done.stderr.strip()[-3000:]}")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _rewrite_record(site: Path, dist_info: Path) -> None:
    """Drop the rows of files that are not in the layer, and check every row left.

    RECORD is kept (``importlib.metadata.files`` reads it), and kept true: each row that stays names
    a file of the layer with its real hash and size, so a removed file leaves no dangling row.
    """
    record = dist_info / "RECORD"
    rows = []
    for row in csv.reader(io.StringIO(record.read_text())):
        if not row:
            continue
        target = (site / row[0]).resolve()
        if target == record.resolve():
            rows.append([row[0], "", ""])
        elif target.is_relative_to(site.resolve()) and target.is_file():
            data = target.read_bytes()
            if row[1] and (row[1] != _record_hash(data) or row[2] != str(len(data))):
                raise BuildError(f"{dist_info.name}/RECORD: {row[0]} does not match its hash or size")
            rows.append(row[:3])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(sorted(rows))
    record.write_text(out.getvalue())


def _scrub(site: Path) -> None:
    """Remove what pip wrote about this machine and this install, and all bytecode."""
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts: their shebang is this venv's python
    for cache in sorted(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    for path in sorted(site.rglob("*")):
        if path.is_file() and (path.suffix in (".pyc", ".pyo") or path.name in INSTALLER_FILES):
            path.unlink()
    for dist_info in sorted(site.glob("*.dist-info")):
        _rewrite_record(site, dist_info)


def _installed(site: Path, lock: Mapping[str, str]) -> dict[str, str]:
    """``{name: version}`` of the layer's distributions; each must be exactly what the lock pins."""
    versions: dict[str, str] = {}
    for metadata in sorted(site.glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(metadata.read_text(encoding="utf-8"))
        versions[headers["Name"]] = headers["Version"]
    unpinned = sorted(f"{n}=={v}" for n, v in versions.items() if lock.get(_norm(n)) != v)
    if unpinned:
        raise BuildError(f"not pinned by the lock (add them to constraints.txt): {', '.join(unpinned)}")
    bundled = sorted(n for n in versions if _norm(n) in RUNTIME_PROVIDED)
    if bundled:
        raise BuildError(f"{', '.join(bundled)} came in as a dependency, but the layer relies on the runtime's copy")
    return dict(sorted(versions.items(), key=lambda kv: kv[0].lower()))


def _tree(root: Path, prefix: str, excluded: frozenset[str] = frozenset()) -> dict[str, Path]:
    """Every file under ``root`` as ``prefix/<relative path>``, less bytecode and ``excluded`` top-level names."""
    files: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (
            not path.is_file()
            or rel.parts[0] in excluded
            or "__pycache__" in rel.parts
            or path.suffix in (".pyc", ".pyo")
        ):
            continue
        files[f"{prefix}/{rel.as_posix()}"] = path
    return files


def core_files(source: Path) -> dict[str, Path]:
    """The core layer's entries: ``source`` (the ``tollway`` package) under ``python/tollway``."""
    return _tree(source, "python/tollway", CORE_EXCLUDED)


def _project_version(pyproject: Path) -> str:
    version: str = tomllib.loads(pyproject.read_text())["project"]["version"]
    return version


def _build_deps(work: Path, cache: Path) -> tuple[Path, dict[str, Any]]:
    site = work / "stage" / "python"
    constraints = ROOT / "constraints.txt"
    _install_deps(site, cache / "wheels", project_requirements(ROOT / "pyproject.toml"), constraints)
    _scrub(site)
    packages = _installed(site, read_lock(constraints))
    return site, {"packages": packages, "runtime_provided": sorted(RUNTIME_PROVIDED)}


Entry = tuple[LayerZip, dict[str, Any]]
"""A layer's zip and the manifest fields that only its recipe knows."""


def build(
    out: Path = DEFAULT_OUT,
    only: Sequence[str] = LAYERS,
    *,
    cache: Path = DEFAULT_CACHE,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Build ``only`` into ``out`` and return the manifest written beside the zips.

    A layer that this call does not rebuild stays in the manifest, and in the unzipped-total
    check, while its zip in ``out`` is still the one the previous manifest describes.
    """
    unknown = sorted(set(only) - set(LAYERS))
    if unknown:
        raise BuildError(f"unknown layer(s) {unknown}; choose from {list(LAYERS)}")
    limits = limits or Limits()
    date_time = zip_date_time(os.environ.get("SOURCE_DATE_EPOCH"))
    stamp = "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}Z".format(*date_time)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out) as tmp:
        work = Path(tmp)
        needles = [str(ROOT), str(out), str(cache.resolve()), sys.prefix, tmp]
        built: list[Entry] = []
        for name in (n for n in LAYERS if n in only):
            if name == "deps":
                site, extra = _build_deps(work, cache)
                files = _tree(site, "python")
            elif name == "core":
                files = core_files(ROOT / "shared" / "tollway")
                extra = {"packages": {"tollway": _project_version(ROOT / "pyproject.toml")}}
            else:  # the WAL-shipper extension: its launcher and module; tollway comes from the core layer
                files = layer_files()
                extra = {"packages": {EXTENSION_NAME: _project_version(ROOT / "pyproject.toml")}}
            layer = write_zip(name, files, work / f"{name}.zip", date_time)
            hits = find_machine_paths(layer.path, needles)
            if hits:
                raise BuildError(f"{layer.path.name} holds absolute paths of this machine: {hits[:10]}")
            built.append((layer, {**extra, "zip_timestamp": stamp}))
        layers = sorted([*_unchanged(out, set(only)), *built], key=lambda e: e[0].name)
        check_sizes([layer for layer, _ in layers], limits)
        manifest = _manifest(layers, limits)
        for layer, _ in built:
            os.replace(layer.path, out / layer.path.name)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


_ZIP_FIELDS: Final = ("file", "sha256", "content_sha256", "zipped_bytes", "unzipped_bytes", "files")


def _unchanged(out: Path, rebuilt: set[str]) -> list[Entry]:
    """The layers of the manifest in ``out`` that are not rebuilt and whose zip has not changed.

    None when that manifest was built for another :data:`TARGET`: its deps zip holds wheels that
    the runtime's Python cannot load.
    """
    try:
        manifest = json.loads((out / "manifest.json").read_text())
        previous = manifest["layers"] if manifest.get("target") == TARGET else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return []
    kept = []
    for name, entry in sorted(previous.items()):
        try:
            path, digest = out / entry["file"], entry["sha256"]
            if name in rebuilt or name not in LAYERS or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                continue
            layer = LayerZip(name, path, *(entry[k] for k in _ZIP_FIELDS[1:]))
        except (OSError, KeyError, TypeError):
            continue
        kept.append((layer, {k: v for k, v in entry.items() if k not in _ZIP_FIELDS}))
    return kept


def _manifest(layers: Sequence[Entry], limits: Limits) -> dict[str, Any]:
    return {
        "layers": {
            z.name: {
                "file": z.path.name,
                "sha256": z.sha256,
                "content_sha256": z.content_sha256,
                "zipped_bytes": z.zipped_bytes,
                "unzipped_bytes": z.unzipped_bytes,
                "files": z.files,
                **extra,
            }
            for z, extra in layers
        },
        "unzipped_total_bytes": sum(z.unzipped_bytes for z, _ in layers),
        "limits": {
            "zip_bytes": limits.zip_bytes,
            "unzipped_total_bytes": limits.unzipped_total_bytes,
            "reserved_for_function_bytes": limits.reserved_bytes,
        },
        "target": TARGET,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m layers.build", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the zips and manifest.json go")
    parser.add_argument("--only", choices=LAYERS, help="build one layer")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="downloaded wheels (git-ignored)")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out, [args.only] if args.only else LAYERS, cache=args.cache)
    except BuildError as exc:
        print(f"layers.build: error: {exc}", file=sys.stderr)
        return 1
    for name, layer in manifest["layers"].items():
        print(
            f"{name:5} {layer['zipped_bytes'] / MIB:6.1f} MiB zipped {layer['unzipped_bytes'] / MIB:6.1f} MiB unzipped "
            f"{layer['files']:5} files  sha256 {layer['sha256']}"
        )
    print(f"wrote {args.out.resolve() / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
