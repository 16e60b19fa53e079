"""Pooling repetitions exactly, and their spread reported beside the pooled figures."""

from __future__ import annotations

from typing import Any

import pytest

from bench.aggregate import comparison, pool_runs, repetition_stats
from bench.loadgen import LoadResult
from bench.stats import spread


def entry(target: str, repetition: int, latencies_us: list[int], gateway_cpu_s: float = 1.0) -> dict[str, Any]:
    result = LoadResult(1)
    result.offered = len(latencies_us)
    result.counts[0] = len(latencies_us)
    result.timeline[0][0] = result.timeline[0][1] = len(latencies_us)
    for v in latencies_us:
        result.latency[0].record(v)
    resources = {
        "gateway": {"cpu_s": gateway_cpu_s, "cpu_pct_mean": 50.0, "rss_mib_max_process": 60.0 + repetition},
        "other_cpu_pct": 5.0 * repetition,
        "steal_pct": 40.0 - 30.0 * repetition,
        "steal_pct_max": 60.0 + repetition,
    }
    return {
        "target": target,
        "rate": 100.0,
        "repetition": repetition,
        "spec": {"duration_s": 1.0, "stream": False},
        "summary": result.summary(1.0, False),
        "resources": resources,
        "cpu_ms_per_request": {"gateway": 1.0 + repetition},
        "raw": result.to_dict(),
    }


def test_pooling_merges_histograms_instead_of_averaging_percentiles() -> None:
    runs = [entry("gateway", 0, [1000] * 99 + [90_000]), entry("gateway", 1, [1000] * 100)]
    pooled = pool_runs(runs)
    s = pooled["summary"]
    assert pooled["repetitions"] == 2
    assert (s["offered"], s["completed"], s["throughput_rps"]) == (200, 200, 100.0)
    assert s["latency"]["max_ms"] == 90.0
    assert s["latency"]["p99_ms"] == pytest.approx(1.0, rel=0.01)
    assert pooled["resources"]["gateway"]["cpu_s"] == 2.0
    assert pooled["resources"]["gateway"]["rss_mib_max_process"] == 61.0
    assert pooled["resources"]["other_cpu_pct"] == 5.0
    assert (pooled["resources"]["steal_pct"], pooled["resources"]["steal_pct_max"]) == (40.0, 61.0), "the worst"
    assert pooled["cpu_ms_per_request"] == {"gateway": 1.5}


def test_each_repetition_is_compared_with_its_own_direct_run() -> None:
    direct = [entry("direct", 0, [1000] * 10), entry("direct", 1, [2000] * 10)]
    gateway = [entry("gateway", 0, [3000] * 10), entry("gateway", 1, [4000] * 10)]
    stats = repetition_stats(direct, gateway, stream=False)
    assert stats["n"] == 2
    added = stats["metrics"]["latency_p50_added_ms"]
    assert added["min"] == pytest.approx(2.0, rel=0.01) and added["max"] == pytest.approx(2.0, rel=0.01)
    ratio = stats["metrics"]["latency_p50_ratio"]
    assert ratio["min"] == pytest.approx(2.0, rel=0.01) and ratio["max"] == pytest.approx(3.0, rel=0.01)
    assert "ttft_p99_ratio" not in stats["metrics"]


def test_comparison_carries_ttft_only_for_streams() -> None:
    d, g = entry("direct", 0, [1000]), entry("gateway", 0, [2000])
    out = comparison("gateway", 100.0, d["summary"], g["summary"], stream=False)
    assert out["ttft"] is None
    assert out["throughput_ratio"] == 1.0
    assert out["target"] == "gateway"


def test_spread_gives_median_range_and_a_t_interval() -> None:
    out = spread([1.0, 2.0, 3.0, 4.0, None])
    assert out == {"n": 4, "median": 2.5, "min": 1.0, "max": 4.0, "mean": 2.5, "ci95": pytest.approx(2.054, abs=0.001)}
    assert spread([5.0])["ci95"] is None
    assert spread([])["median"] is None
