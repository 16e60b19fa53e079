"""Putting runs together: gateway against direct, and repetitions pooled into one result.

A fixed-rate step may run several times (``repeat`` in the profile). Its repetitions are
pooled by merging their raw histograms and counts, which is exact: the pooled P99 is the P99
of every request of every repetition, not an average of P99s. Run-to-run variation is
reported beside it as the median, range and 95 % confidence interval of each repetition's
own gateway/direct figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.loadgen import LoadResult
from bench.stats import compare, spread

__all__ = ["comparison", "pool_runs", "repetition_stats"]

_GROUP_KEYS = ("cpu_s", "cpu_pct_mean", "cpu_pct_max", "rss_mib_max_total", "rss_mib_max_process", "processes")


def comparison(
    target: str, rate: float, direct: Mapping[str, Any], gateway: Mapping[str, Any], stream: bool
) -> dict[str, Any]:
    """``target`` against direct at one rate: per-percentile difference and ratio, throughput ratio."""
    d_thr, g_thr = direct["throughput_rps"], gateway["throughput_rps"]
    ttft = None
    if stream and direct.get("ttft") and gateway.get("ttft"):
        ttft = compare(direct["ttft"], gateway["ttft"])
    return {
        "target": target,
        "rate": rate,
        "latency": compare(direct["latency"], gateway["latency"]),
        "ttft": ttft,
        "throughput_ratio": round(g_thr / d_thr, 4) if d_thr else None,
        "success_ratio": {"direct": direct["success_ratio"], "gateway": gateway["success_ratio"]},
    }


def _pool_resources(resources: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups = sorted({name for r in resources for name, value in r.items() if isinstance(value, dict)})
    for group in groups:
        parts = [r[group] for r in resources if isinstance(r.get(group), dict)]
        pooled: dict[str, Any] = {}
        for key in _GROUP_KEYS:
            values = [p[key] for p in parts if p.get(key) is not None]
            if not values:
                continue
            if key == "cpu_s":
                pooled[key] = round(sum(values), 3)
            elif key == "cpu_pct_mean":
                pooled[key] = round(statistics.fmean(values), 1)
            else:
                pooled[key] = max(values)
        out[group] = pooled
    for key in ("other_cpu_pct", "steal_pct", "steal_pct_max"):  # the worst repetition: these flag noise
        values = [r[key] for r in resources if r.get(key) is not None]
        if values:
            out[key] = max(values)
    return out


def pool_runs(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One entry for several repetitions of the same target, step and rate."""
    first = entries[0]
    merged = LoadResult.from_dict(first["raw"])
    for entry in entries[1:]:
        merged.merge(LoadResult.from_dict(entry["raw"]))
    spec = first["spec"]
    cpu_keys = {k for e in entries for k in e.get("cpu_ms_per_request", {})}
    cpu_ms = {
        k: round(statistics.fmean(e["cpu_ms_per_request"][k] for e in entries if k in e["cpu_ms_per_request"]), 3)
        for k in sorted(cpu_keys)
    }
    return {
        "target": first["target"],
        "rate": first["rate"],
        "repetitions": len(entries),
        "summary": merged.summary(spec["duration_s"] * len(entries), spec["stream"]),
        "resources": _pool_resources([e.get("resources", {}) for e in entries]),
        "cpu_ms_per_request": cpu_ms,
    }


def repetition_stats(
    direct: Sequence[Mapping[str, Any]], gateway: Sequence[Mapping[str, Any]], stream: bool
) -> dict[str, Any]:
    """Per repetition gateway-against-direct figures, and their spread across repetitions."""
    by_rep = {e.get("repetition", 0): e for e in direct}
    per_rep = [
        comparison(g["target"], g["rate"], by_rep[g.get("repetition", 0)]["summary"], g["summary"], stream)
        for g in gateway
        if g.get("repetition", 0) in by_rep
    ]
    sections = ["latency", "ttft"] if stream else ["latency"]
    metrics: dict[str, list[float | None]] = {}
    for section in sections:
        for pct in ("p50", "p99"):
            metrics[f"{section}_{pct}_added_ms"] = [(c[section] or {}).get(pct, {}).get("added_ms") for c in per_rep]
            metrics[f"{section}_{pct}_ratio"] = [(c[section] or {}).get(pct, {}).get("ratio") for c in per_rep]
    metrics["throughput_ratio"] = [c["throughput_ratio"] for c in per_rep]
    metrics["gateway_success_ratio"] = [c["success_ratio"]["gateway"] for c in per_rep]
    return {"n": len(per_rep), "metrics": {name: spread(values) for name, values in metrics.items()}}
