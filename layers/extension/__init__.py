"""The WAL-shipper Lambda extension layer: what goes into its zip (see ``README.md``).

A package so the layer build, the tests and mypy reach it; Lambda itself never imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["EXTENSION_NAME", "layer_files"]

EXTENSION_NAME: Final = "tollway-wal-shipper"
SOURCE: Final = Path(__file__).resolve().parent


def layer_files(source: Path = SOURCE) -> dict[str, Path]:
    """The layer's entries, archive name to source file, as Lambda unpacks them under ``/opt``.

    The launcher must stay executable (the zip keeps a source's exec bit) and keep its name, which
    is the name the extension registers with. ``tollway`` comes from the core layer.
    """
    return {
        f"extensions/{EXTENSION_NAME}": source / "extensions" / EXTENSION_NAME,
        f"{EXTENSION_NAME}/wal_shipper.py": source / "wal_shipper.py",
    }
