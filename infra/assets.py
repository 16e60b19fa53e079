"""What the stack ships: the staged function code and the prebuilt layer zips.

The code asset is staged into a fresh directory rather than pointed at ``functions/``, so it
holds exactly the function's files (no ``__pycache__``, no other function) plus the published
config, and its content hash, which CDK uses as the asset's identity, depends only on those
bytes: paths are copied in sorted order and file modes are normalised to 0644/0755.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "CONFIG_NAME",
    "DEFAULT_CONFIG",
    "DEFAULT_LAYERS_DIR",
    "LAYERS_BUILD_COMMAND",
    "REPO_ROOT",
    "LayerZips",
    "MissingAssetError",
    "layer_zips",
    "stage_function_code",
]

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG: Final = "shared/tollway/examples/llm-router.yml"
DEFAULT_LAYERS_DIR: Final = "layers/dist"
CONFIG_NAME: Final = "llm-router.yml"
"""The config's name at the root of the code asset (``/var/task/llm-router.yml`` on Lambda)."""
LAYERS_BUILD_COMMAND: Final = "python -m layers.build --out {out}"
_SKIPPED_DIRS: Final = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES: Final = (".pyc", ".pyo")


class MissingAssetError(FileNotFoundError):
    """A file the stack needs is absent; the message says how to produce it."""


@dataclass(frozen=True, slots=True)
class LayerZips:
    """The layer zips ``python -m layers.build`` writes: dependencies, core library, WAL-shipper extension."""

    deps: Path
    core: Path
    extension: Path


def layer_zips(layers_dir: Path) -> LayerZips:
    """The layer zips in ``layers_dir``, or a :class:`MissingAssetError` naming the build command."""
    zips = LayerZips(deps=layers_dir / "deps.zip", core=layers_dir / "core.zip", extension=layers_dir / "extension.zip")
    missing = [p for p in (zips.deps, zips.core, zips.extension) if not p.is_file()]
    if missing:
        names = ", ".join(str(p) for p in missing)
        build = LAYERS_BUILD_COMMAND.format(out=layers_dir)
        raise MissingAssetError(f"layer zip not found: {names}; build the layers first: {build}")
    return zips


def stage_function_code(
    dest: Path, source_dir: str, *, repo_root: Path = REPO_ROOT, config: Path | None = None
) -> Path:
    """Copy ``functions/__init__.py`` and ``source_dir`` (and ``config`` as ``llm-router.yml``) to ``dest``.

    ``source_dir`` is relative to ``repo_root`` and must lie under ``functions/``, whose package
    marker the handler's dotted path needs.
    """
    package = repo_root / "functions"
    source = (repo_root / source_dir).resolve()
    if not source.is_dir():
        raise MissingAssetError(f"function source folder not found: {source}")
    if package.resolve() not in source.parents:
        raise ValueError(f"function source {source_dir!r} must be a folder under functions/")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _copy_file(package / "__init__.py", dest / "functions" / "__init__.py")
    target = dest / source.relative_to(repo_root.resolve())
    for path in _tree(source):
        _copy_file(path, target / path.relative_to(source))
    if config is not None:
        if not config.is_file():
            raise MissingAssetError(f"config file not found: {config}")
        _copy_file(config, dest / CONFIG_NAME)
    return dest


def _tree(root: Path) -> list[Path]:
    files: list[Path] = []
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        files.extend(Path(here) / n for n in sorted(names) if not n.endswith(_SKIPPED_SUFFIXES))
    return files


def _copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    dst.chmod(0o755 if src.stat().st_mode & 0o111 else 0o644)
