"""``bench.servers``: a stopped server takes the processes it started with it."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from bench.servers import start_server

# Prints its helper's pid, then the ready line, then waits; the helper holds the same stdout.
_SERVER = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"helper {helper.pid}", flush=True)
print("listening on http://127.0.0.1:9", flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_stop_ends_a_helper_that_holds_the_stdout_pipe(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = start_server("scripted", [sys.executable, "-c", _SERVER], r"listening on (\S+)", log)
    helper = int(log.read_text().split("helper ", 1)[1].split()[0])
    assert server.url == "http://127.0.0.1:9"
    assert _running(helper)

    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=30)  # before the fix, closing the pipe waited for the helper's 120 s sleep
    assert not stopper.is_alive(), "Server.stop hung on a pipe a helper process still held"

    deadline = time.monotonic() + 10
    while _running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(helper), "the server's helper process outlived Server.stop"
    assert server.proc.returncode is not None
