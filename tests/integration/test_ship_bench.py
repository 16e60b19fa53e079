"""``python -m bench.ship`` against the real queue services (moto server, a Tansu broker): it runs
end to end, ships every event of every drain, and prints its table. No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.ship import main, request_events
from tollway.audit.events import EVENT_KINDS, decode_event

pytestmark = pytest.mark.local_cloud


def test_a_request_is_the_gateways_four_events_in_order() -> None:
    decoded = [decode_event(payload) for payload in request_events(2)]
    assert [e.kind for e in decoded] == list(EVENT_KINDS) * 2
    assert len({e.event_id for e in decoded}) == 8
    assert {e.request_id for e in decoded[:4]} == {"req-bench-0000000000"}


def test_bench_ships_every_event_to_both_sinks_and_prints_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--requests", "40", "--repeat", "1", "--reads", "64,16", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (sqs|kafka) \| (\d+) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \| ([\d.na]+) \|", out, re.M)
    assert [(sink, read) for sink, read, *_ in rows] == [("sqs", "64"), ("sqs", "16"), ("kafka", "64"), ("kafka", "16")]
    for _, _, events, messages, shipper_us, service_us in rows:
        assert events == "160"  # 40 requests' four events, all shipped (ship_once raises otherwise)
        assert int(messages) >= 3  # at most 64 events a message
        assert float(shipper_us) > 0
        assert service_us == "nan" or float(service_us) >= 0
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"
