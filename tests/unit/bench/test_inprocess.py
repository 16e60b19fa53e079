"""``bench.inprocess`` serves real requests through the whole app: plain, with the audit trail, with PII.

It checks that the measurement runs and reports what it measured, never how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("flags", [[], ["--audit"], ["--pii"]])
def test_it_serves_every_request_and_reports_cpu_and_wall_time(flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.inprocess", "--requests", "25", "--warmup", "5", "--json", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["audit"] is ("--audit" in flags)
    assert result["pii"] is ("--pii" in flags)
    assert result["payload"] == ("pii-2k" if "--pii" in flags else "small")
    assert result["requests"] == 25
    assert result["cpu_us_per_request"] > 0 and result["wall_us_per_request"] > 0


def test_bad_counts_are_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.inprocess", "--requests", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--requests must be at least 1" in done.stderr
