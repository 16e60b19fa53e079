"""Histogram buckets, percentiles against exact samples, merging, and the direct/gateway comparison."""

from __future__ import annotations

import random

import pytest

from bench.stats import (
    PERCENTILES,
    Histogram,
    bucket_bounds,
    bucket_index,
    compare,
    exact_percentile,
    summarize,
)


def filled(values: list[int]) -> Histogram:
    hist = Histogram()
    for v in values:
        hist.record(v)
    return hist


def test_buckets_are_exact_below_256_us_and_within_one_percent_above() -> None:
    for value in [*range(300), *random.Random(1).sample(range(300, 600_000_000), 5000)]:
        low, high = bucket_bounds(bucket_index(value))
        assert low <= value <= high
        if value < 256:
            assert low == high == value
        else:
            assert (high - low + 1) / low <= 1 / 128


def test_buckets_tile_the_integers_without_gaps_or_overlaps() -> None:
    for index in range(20_000):
        assert bucket_bounds(index + 1)[0] == bucket_bounds(index)[1] + 1
        assert bucket_index(bucket_bounds(index)[0]) == index


def test_percentiles_stay_within_bucket_precision_of_exact_nearest_rank() -> None:
    rng = random.Random(7)
    samples = [int(rng.lognormvariate(7.5, 1.2)) for _ in range(20_000)]
    hist = filled(samples)
    for _, q in PERCENTILES:
        exact = exact_percentile(samples, q)
        got = hist.percentile(q)
        assert got is not None
        assert abs(got - exact) <= max(1, exact / 128), (q, got, exact)


def test_max_and_min_are_exact_and_the_extremes_of_q() -> None:
    hist = filled([1_234_567, 5, 999_999])
    assert hist.percentile(1.0) == hist.max == 1_234_567
    assert hist.percentile(0.0) == hist.min == 5
    assert hist.count == 3
    assert hist.total == 1_234_567 + 5 + 999_999


def test_an_empty_histogram_reports_none_rather_than_zero() -> None:
    hist = Histogram()
    assert hist.percentile(0.5) is None
    assert hist.mean is None
    assert summarize(hist)["p99_ms"] is None


def test_a_quantile_outside_zero_to_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        filled([1]).percentile(1.5)


def test_negative_values_clamp_to_zero() -> None:
    hist = filled([-5])
    assert hist.min == hist.max == 0
    assert hist.percentile(0.5) == 0


def test_merging_parts_equals_recording_everything_in_one() -> None:
    rng = random.Random(3)
    parts = [[rng.randrange(0, 5_000_000) for _ in range(1000)] for _ in range(3)]
    whole = filled([v for part in parts for v in part])
    merged = Histogram.merged(filled(part) for part in parts)
    assert merged.buckets == whole.buckets
    assert (merged.count, merged.total, merged.min, merged.max) == (whole.count, whole.total, whole.min, whole.max)
    assert merged.merge(Histogram()).count == whole.count


def test_merging_into_an_empty_histogram_takes_the_other_minimum() -> None:
    merged = Histogram().merge(filled([700, 900]))
    assert merged.min == 700


def test_serialization_round_trips() -> None:
    hist = filled([3, 300, 30_000, 3_000_000])
    back = Histogram.from_dict(hist.to_dict())
    assert back.buckets == hist.buckets
    assert back.percentile(0.99) == hist.percentile(0.99)
    assert (back.count, back.total, back.min, back.max) == (4, hist.total, 3, 3_000_000)


def test_deserializing_inconsistent_counts_or_other_precision_fails() -> None:
    data = filled([1, 2]).to_dict()
    with pytest.raises(ValueError, match="add up"):
        Histogram.from_dict({**data, "count": 5})
    with pytest.raises(ValueError, match="precision"):
        Histogram.from_dict({**data, "sub_bits": 7})


def test_summarize_reports_milliseconds_for_every_percentile() -> None:
    summary = summarize(filled([1000] * 99 + [50_000]))
    assert summary["count"] == 100
    assert summary["p50_ms"] == pytest.approx(1.0, rel=1 / 128)
    assert summary["p99_ms"] == pytest.approx(1.0, rel=1 / 128)
    assert summary["max_ms"] == 50.0
    assert set(summary) == {"count", "mean_ms", *(f"{k}_ms" for k, _ in PERCENTILES)}


def test_compare_gives_both_the_difference_and_the_ratio() -> None:
    direct = summarize(filled([1000] * 100))
    gateway = summarize(filled([3000] * 100))
    out = compare(direct, gateway)
    assert out["p50"]["added_ms"] == pytest.approx(2.0, rel=0.01)
    assert out["p50"]["ratio"] == pytest.approx(3.0, rel=0.01)
    assert out["max"] == {"added_ms": 2.0, "ratio": 3.0}
    assert set(out) == {k for k, _ in PERCENTILES}


def test_compare_refuses_to_invent_numbers_for_missing_or_zero_baselines() -> None:
    empty = summarize(Histogram())
    some = summarize(filled([1000]))
    assert compare(empty, some)["p99"] == {"added_ms": None, "ratio": None}
    zero = summarize(filled([0]))
    assert compare(zero, some)["max"] == {"added_ms": 1.0, "ratio": None}


def test_exact_percentile_is_nearest_rank() -> None:
    values = list(range(1, 11))
    assert exact_percentile(values, 0.5) == 5
    assert exact_percentile(values, 0.9) == 9
    assert exact_percentile(values, 0.99) == 10
    with pytest.raises(ValueError):
        exact_percentile([], 0.5)
