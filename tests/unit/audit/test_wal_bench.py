"""``python -m bench.wal`` runs end to end and prints its tables (a smoke test: no timing is asserted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.wal import PAYLOAD_BYTES, audit_payload, main
from tollway.audit.events import decode_event


def test_the_payload_is_a_real_audit_event_of_the_stated_size() -> None:
    payload = audit_payload()
    assert len(payload) == PAYLOAD_BYTES
    assert decode_event(payload).kind == "request_finished"


def test_bench_prints_throughput_and_commit_wait_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seconds", "0.1", "--appenders", "1,4", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (bounded-async|local-durable) \| ([\d,]+) \|", out, re.M)}
    assert set(rows) == {"bounded-async", "local-durable"}
    assert all(int(v.replace(",", "")) > 0 for v in rows.values())
    waits = re.findall(r"^\| (\d+) \| ([\d,]+) \| [\d.]+ \| ([\d.]+) \|", out, re.M)
    assert [n for n, _, _ in waits] == ["1", "4"]
    assert all(int(rate.replace(",", "")) > 0 and float(p50) > 0 for _, rate, p50 in waits)
    assert "| inf | 100.0 % | 100.0 % |" in out
    assert list(tmp_path.iterdir()) == [], "the scratch WAL directories are removed"
