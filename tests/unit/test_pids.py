"""``tollway.pids.alive``: the one check of whether a process still runs."""

from __future__ import annotations

import os
import subprocess
import sys

from tollway.pids import alive


def test_a_running_process_is_alive_and_a_reaped_one_is_not() -> None:
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now (until the kernel reuses it)
    assert not alive(child.pid)


def test_no_pid_at_or_below_zero_is_a_process() -> None:
    # os.kill(0, 0) would signal this process group and os.kill(-1, 0) every process we may signal.
    assert not alive(0) and not alive(-1)


def test_init_counts_as_alive_whoever_asks() -> None:
    # pid 1 always runs; for a user other than root the signal is refused (PermissionError),
    # which still means the process exists.
    assert alive(1)
