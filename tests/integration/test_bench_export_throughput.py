"""``bench.export_throughput`` runs the export job over what it stored and reports every record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local_cloud

ROOT = Path(__file__).resolve().parents[2]


def test_it_exports_every_record_it_stored_and_reports_a_rate() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.export_throughput", "--records", "12", "--repeat", "2", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["records"] for r in result["runs"]] == [12, 12]
    assert result["median_records_per_second"] > 0
