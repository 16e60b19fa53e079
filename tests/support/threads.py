"""The scheduling policies of another process's threads (Linux ``/proc``)."""

from __future__ import annotations

import contextlib
import os

__all__ = ["idle_threads"]


def idle_threads(pid: int) -> list[int]:
    """The threads of ``pid`` at ``SCHED_IDLE``."""
    idle = []
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        with contextlib.suppress(ProcessLookupError):
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                idle.append(tid)
    return idle
