"""Snapshot versions are content-addressed; documents round-trip and refuse tampering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from tollway.pricing import (
    PricingSnapshot,
    SnapshotCorrupt,
    compile_snapshot,
    decode_snapshot,
    encode_snapshot,
    parse_models_dev,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def build(doc: object, now: datetime = NOW) -> PricingSnapshot:
    return compile_snapshot([parse_models_dev(orjson.dumps(doc), uri="file://c.json")], None, now=now)


A = {"x": {"models": {"m": {"cost": {"input": 1, "output": 2}}, "n": {"cost": {"input": 3, "output": 4}}}}}
A_REORDERED = {"x": {"models": {"n": {"cost": {"output": 4, "input": 3}}, "m": {"cost": {"output": 2, "input": 1.0}}}}}


def test_the_same_prices_give_the_same_version_whatever_the_key_order_or_time() -> None:
    first = build(A)
    again = build(A_REORDERED, now=NOW + timedelta(days=3))
    assert len(first.version) == 16
    assert first.digest.startswith("sha256:" + first.version)
    assert (again.version, again.digest) == (first.version, first.digest)


def test_any_rate_change_gives_another_version() -> None:
    changed = {"x": {"models": {"m": {"cost": {"input": 1, "output": 2}}, "n": {"cost": {"input": 3, "output": 4.5}}}}}
    assert build(changed).version != build(A).version


def test_a_document_round_trips_to_the_same_snapshot(snapshot: PricingSnapshot) -> None:
    body = encode_snapshot(snapshot)
    back = decode_snapshot(body)
    assert (back.version, back.digest, back.effective_from) == (
        snapshot.version,
        snapshot.digest,
        snapshot.effective_from,
    )
    assert back.prices == snapshot.prices
    assert back.by_account == snapshot.by_account
    assert encode_snapshot(back) == body
    assert orjson.loads(body)["unit"] == "micro-USD per 1M tokens"


def test_a_document_whose_rates_were_edited_is_refused(snapshot: PricingSnapshot) -> None:
    doc = orjson.loads(encode_snapshot(snapshot))
    doc["prices"][0]["rates"]["input"] += 1
    with pytest.raises(SnapshotCorrupt, match="does not match its digest"):
        decode_snapshot(orjson.dumps(doc))


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"schema": 2}'])
def test_a_document_that_is_not_a_snapshot_is_refused(body: bytes) -> None:
    with pytest.raises(SnapshotCorrupt):
        decode_snapshot(body)
