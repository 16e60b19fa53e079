"""Optional sampling profiles of the gateway with py-spy, summarized by where the time goes.

``python -m bench.run PROFILE --py-spy`` attaches ``py-spy record --subprocesses`` (a dev
tool, pinned py-spy==0.4.3, not a harness dependency) to the gateway for each gateway run
and keeps the raw collapsed stacks next to the results. Idle threads are excluded, so a
sample is time a worker spent running Python or native code, not waiting in the event loop.
A profiled run is slower than an unprofiled one: its latency figures are marked as such.

The summary attributes every sample's leaf frame (self time) to a package (``tollway.server``,
``starlette``, ``httpx``, ``httpcore``, ``uvicorn``, ``asyncio``, ...) and lists the heaviest
functions by self and by inclusive time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

__all__ = ["find_py_spy", "start_py_spy", "summarize_collapsed"]

_FRAME: Final = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
_TOP: Final = 15


def find_py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.is_file() else shutil.which("py-spy")


def start_py_spy(executable: str, pid: int, seconds: float, output: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            executable,
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--nonblocking",
            "--rate",
            "100",
            "--duration",
            str(max(1, round(seconds))),
            "--format",
            "raw",
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _package(file: str) -> str:
    path = file.replace("\\", "/")
    for marker in ("site-packages/", "/shared/", "lib/python3"):
        at = path.rfind(marker)
        if at >= 0:
            path = path[at + len(marker) :]
            break
    parts = [p for p in path.split("/") if p and not p.startswith("python3")]
    if not parts:
        return "<unknown>"
    if parts[0] == "tollway" and len(parts) > 2:
        return "tollway." + parts[1]
    if parts[0] == "tollway":
        return "tollway." + parts[1].removesuffix(".py") if len(parts) > 1 else "tollway"
    return parts[0].removesuffix(".py")


def _frames(stack: list[str]) -> list[tuple[str, str]]:
    """Python frames, root first; process and thread labels (which may contain ``;``) are dropped."""
    out = []
    for text in stack:
        match = _FRAME.match(text.strip())
        if match is not None and not text.startswith(("process ", "thread ")):
            out.append((match["func"], match["file"]))
    return out


def _ours(package: str) -> bool:
    return package.startswith("tollway.") and package != "tollway.cli"


def _stacks(lines: Iterable[str]) -> Iterable[tuple[list[str], int]]:
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def summarize_collapsed(path: Path) -> dict[str, Any]:
    """Samples, self time by package, and the top functions by self and inclusive samples."""
    by_package: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with path.open(errors="replace") as fh:
        for frames, count in _stacks(fh):
            py_frames = _frames(frames) or [("<native>", "<native>")]
            total += count
            func, file = py_frames[-1]
            by_package[_package(file)] += count
            self_time[f"{func} ({_package(file)})"] += count
            # Inclusive time only for Tollway's own frames: what each step of the request path
            # costs with everything it calls; the server and event-loop roots would be ~100 %.
            for name in {f"{fn} ({pkg})" for fn, fl in py_frames if _ours(pkg := _package(fl))}:
                inclusive[name] += count

    def share(counter: Counter[str], n: int) -> list[dict[str, Any]]:
        return [{"name": k, "samples": v, "pct": round(v * 100 / total, 1)} for k, v in counter.most_common(n)]

    if total == 0:
        return {"samples": 0, "by_package": [], "self": [], "inclusive": []}
    return {
        "samples": total,
        "by_package": share(by_package, _TOP),
        "self": share(self_time, _TOP),
        "inclusive": share(inclusive, _TOP),
    }
