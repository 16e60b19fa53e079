"""What the audit microbenchmarks' command lines share (``bench.wal``, ``bench.ship``, ``bench.audit_writer``).

Each takes comma-separated lists of whole numbers and prints what it measured under a line that
says how it ran and on what machine; these are those pieces, so that the three read and fail alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Final

__all__ = ["int_list", "machine", "non_negative_ints", "positive_ints", "print_table"]


def int_list(minimum: int, what: str) -> Callable[[str], list[int]]:
    """An ``argparse`` type: one or more comma-separated integers, none below ``minimum``.

    ``what`` names such numbers in the error (``positive integers``, ``whole numbers``).
    """

    def parse(text: str) -> list[int]:
        values = [int(v) for v in text.split(",") if v.strip()]
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"a comma-separated list of {what}")
        return values

    return parse


positive_ints: Final = int_list(1, "positive integers")
non_negative_ints: Final = int_list(0, "whole numbers")


def machine() -> str:
    """The interpreter and the CPU count, for the line under which a result is printed."""
    return f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs"


def print_table(command: str, setting: str, layout: tuple[str, str], rows: Iterable[Mapping[str, object]]) -> None:
    """Print ``rows`` as a markdown table under one line: the command that measured them, how it ran,
    and on what machine.

    ``layout`` is the header's cells, then a row's, each joined by `` | ``; a row's cells are
    :meth:`str.format` templates over its keys, such as ``{wall_s:.2f} s``.
    """
    header, row = layout
    lines = [f"`{command}`: {setting}; {machine()}.", "", f"| {header} |", "|" + "---|" * (header.count(" | ") + 1)]
    lines += [f"| {row.format_map(r)} |" for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
