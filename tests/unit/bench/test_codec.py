"""The codec microbenchmark measures decoders that all accept the same payloads."""

from __future__ import annotations

import orjson
import pytest

from bench import codec


@pytest.mark.parametrize("payload", ["small", "10kib", "tools"])
def test_every_decoder_accepts_every_payload_with_the_same_messages(payload: str) -> None:
    raw = codec.payload_bytes(payload)
    expected = len(orjson.loads(raw)["messages"])
    decoded = {label: fn(raw) for label, fn in codec.decoders().items()}
    assert set(decoded) == {"tollway", "pydantic", "msgspec"}
    assert len(decoded["tollway"].messages) == expected
    assert len(decoded["pydantic"].messages) == expected
    assert len(decoded["msgspec"].messages) == expected


def test_run_reports_a_positive_time_per_decoder_and_payload() -> None:
    results = codec.run(seconds=0.02)
    assert set(results) == {"small", "10kib", "tools"}
    for row in results.values():
        assert set(row) == {"tollway", "pydantic", "msgspec"}
        assert all(v > 0 for v in row.values())
