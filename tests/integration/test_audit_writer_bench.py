"""``python -m bench.audit_writer`` against moto server: it runs end to end, every batch lands, and it
prints its table. No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.audit_writer import EVENTS_PER_MESSAGE, MESSAGES_PER_BATCH, batches, main
from tollway.audit.messages import decode_message

pytestmark = pytest.mark.local_cloud


def test_a_batch_is_the_writers_default_batch_in_the_gateways_append_order() -> None:
    (bodies,) = batches(1, rps=300, latency_ms=250, t0_ms=1_764_400_000_000)
    events = [e for body in bodies for e in decode_message(body)]
    assert len(bodies) == MESSAGES_PER_BATCH and len(events) == MESSAGES_PER_BATCH * EVENTS_PER_MESSAGE
    assert [e.ts_ms for e in events] == sorted(e.ts_ms for e in events)
    assert len({e.event_id for e in events}) == len(events)
    kinds = {e.kind for e in events}
    assert kinds == {"request_admitted", "attempt_started", "attempt_finished", "request_finished"}


def test_bench_writes_every_batch_and_prints_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batches", "1", "--latencies", "250,0", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) ms \| (\d+) \| (\d+) \| ([\d.]+) s \| ([\d.]+) s \| ([\d,]+) \|", out, re.M)
    assert [r[0] for r in rows] == ["250", "0"]
    for _, events, writes, *_ in rows:
        assert events == "640"
        assert int(writes) < 640  # merged: fewer writes than events
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"
