"""The e2e helpers read a server's log while it writes: only complete lines count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import Proc


def _proc(tmp_path: Path, text: str) -> Proc:
    log_path = tmp_path / "server.log"
    log_path.write_text(text)
    popen = subprocess.Popen([sys.executable, "-c", "pass"], text=True)
    popen.wait()
    return Proc(popen, "http://127.0.0.1:1", log_path, log_path.open("a"))


def test_a_line_still_being_written_is_left_out(tmp_path: Path) -> None:
    proc = _proc(tmp_path, '{"a":1}\n{"b":2}\n{"c":"cut sh')
    try:
        assert proc.log_lines() == ['{"a":1}', '{"b":2}']
        assert proc.wait_log_line(lambda line: '"b"' in line, timeout=0) == '{"b":2}'
        with pytest.raises(AssertionError, match="no log line matched"):
            proc.wait_log_line(lambda line: '"c"' in line, timeout=0)
        proc.log_file.write('ort"}\n')
        proc.log_file.flush()
        assert proc.wait_log_line(lambda line: '"c"' in line, timeout=0) == '{"c":"cut short"}'
    finally:
        proc.stop()


def test_an_empty_log_has_no_lines(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "")
    try:
        assert proc.log_lines() == []
    finally:
        proc.stop()
