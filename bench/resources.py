"""CPU and RSS of process trees, sampled from ``/proc`` in a background thread.

Read straight from ``/proc`` rather than through psutil: it is a few lines, Linux is the only
platform the benchmarks run on, and it keeps the harness free of another dependency.

Each sample reads every ``/proc/<pid>/stat`` once (parent pid, user+system CPU ticks, resident
pages) and ``/proc/stat`` (machine-wide busy ticks). A named *group* is a root pid and all of
its descendants, found afresh at each sample, so worker processes that a supervisor spawns or
respawns are counted. The runner's own tree contains the mock, the gateway and the load
generator, so ``other_cpu_pct`` (CPU time of every other process, summed between consecutive
samples) shows whether something else on the machine competed with the measurement. It misses
processes that live shorter than one sampling interval and kernel work charged to no process;
machine-wide ``/proc/stat`` busy counters are not used because on this tickless VM they disagree
with per-process times over windows of a few seconds.

What no process on the machine can show is the hypervisor taking CPU from the VM: ``steal_pct``
(``/proc/stat``'s steal ticks, the time a virtual CPU was ready to run and the host ran something
else) is that. On these VMs it comes in bursts of 25-50 % of the machine, which is enough to make
a gateway shed load (docs/benchmarks.md, *Method*).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["ResourceSampler", "Sample", "read_steal"]

_TICK: Final = os.sysconf("SC_CLK_TCK")
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    groups: Mapping[str, tuple[int, int, tuple[int, ...]]]
    """Group name → (CPU ticks of its live processes, total RSS bytes, RSS bytes per process)."""
    others: Mapping[int, int]
    """CPU ticks of every process outside the ``all`` group (other users of the machine), by pid."""
    steal: int | None = None
    """The machine's steal ticks so far (``/proc/stat``), ``None`` where the kernel does not report them."""


def read_steal(text: str | None = None) -> int | None:
    """Steal ticks from the ``cpu`` line of ``/proc/stat`` (its 8th value), or ``None``."""
    if text is None:
        try:
            with open("/proc/stat") as fh:
                text = fh.readline()
        except OSError:
            return None
    fields = text.split()
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    try:
        return int(fields[8])
    except ValueError:
        return None


def _read_procs() -> dict[int, tuple[int, int, int]]:
    """pid → (ppid, utime + stime ticks, rss bytes) for every process we can read."""
    out: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, rss 24.
        out[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE)
    return out


def _descendants(root: int, children: Mapping[int, list[int]]) -> list[int]:
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def take_sample(roots: Mapping[str, int]) -> Sample:
    procs = _read_procs()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    groups = {}
    ours: set[int] = set()
    for name, root in roots.items():
        pids = [pid for pid in _descendants(root, children) if pid in procs]
        if name == "all":
            ours.update(pids)
        rss = tuple(procs[pid][2] for pid in pids)
        groups[name] = (sum(procs[pid][1] for pid in pids), sum(rss), rss)
    others = {pid: info[1] for pid, info in procs.items() if pid not in ours} if "all" in roots else {}
    return Sample(time.monotonic(), groups, others, read_steal())


class ResourceSampler:
    """Samples named process trees every ``interval_s`` until stopped; bounded by ``max_samples``."""

    def __init__(self, roots: Mapping[str, int], interval_s: float = 0.5, max_samples: int = 20_000) -> None:
        self.roots = dict(roots)
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ResourceSampler:
        self._thread = threading.Thread(target=self._loop, name="bench-resources", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample_now(self) -> None:
        if len(self.samples) < self.max_samples:
            self.samples.append(take_sample(self.roots))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self.interval_s)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """CPU and RSS per group over samples taken in ``[start, end]`` (monotonic seconds).

        ``cpu_pct`` is per core (200 % is both cores of a 2-core machine); ``cpu_s`` is the
        CPU time spent in the window; RSS figures are maxima over the window's samples.
        ``steal_pct`` (mean) and ``steal_pct_max`` (between two samples) are the hypervisor's
        steal, per core like ``cpu_pct``.
        """
        inside = [s for s in self.samples if start <= s.t <= end]
        if len(inside) < 2:
            return {"samples": len(inside)}
        first, last = inside[0], inside[-1]
        elapsed = last.t - first.t
        out: dict[str, Any] = {"samples": len(inside), "seconds": round(elapsed, 3)}
        for name in self.roots:
            steps = [
                (b.groups[name][0] - a.groups[name][0]) / _TICK / (b.t - a.t) * 100
                for a, b in itertools.pairwise(inside)
                if b.t > a.t
            ]
            cpu_s = max(0, last.groups[name][0] - first.groups[name][0]) / _TICK
            out[name] = {
                "cpu_s": round(cpu_s, 3),
                "cpu_pct_mean": round(cpu_s / elapsed * 100, 1),
                "cpu_pct_max": round(max(steps), 1) if steps else None,
                "rss_mib_max_total": round(max(s.groups[name][1] for s in inside) / _MIB, 1),
                "rss_mib_max_process": round(max(max(s.groups[name][2], default=0) for s in inside) / _MIB, 1),
                "processes": max(len(s.groups[name][2]) for s in inside),
            }
        if "all" in self.roots:
            other_ticks = sum(
                max(0, b.others[pid] - a.others[pid])
                for a, b in itertools.pairwise(inside)
                for pid in b.others.keys() & a.others.keys()
            )
            out["other_cpu_pct"] = round(other_ticks / _TICK / elapsed * 100, 1)
        if first.steal is not None and last.steal is not None:
            steps = [
                (b.steal - a.steal) / _TICK / (b.t - a.t) * 100
                for a, b in itertools.pairwise(inside)
                if b.t > a.t and a.steal is not None and b.steal is not None
            ]
            out["steal_pct"] = round(max(0, last.steal - first.steal) / _TICK / elapsed * 100, 1)
            out["steal_pct_max"] = round(max(steps), 1) if steps else None
        return out
