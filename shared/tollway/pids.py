"""Whether a process still runs, by pid, for the code that outlives or adopts another process's work."""

from __future__ import annotations

import os

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists: another user's counts (the signal is refused, not missing),
    and so does a killed child until its parent reaps it. A pid of 0 or below is never one process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
