"""Latency histograms and percentiles that merge across load-generator processes.

A :class:`Histogram` counts integer microseconds in log-linear buckets, as HdrHistogram
does: values below 256 µs are exact, larger values fall into buckets whose width is at
most 1/128 of their lower bound, so any reported percentile is within 0.8 % of the true
sample. Recording is a few integer operations and one dict update, cheap enough to run
on every request, and two histograms merge by adding bucket counts, which is how the
per-process results of a multi-process load run become one distribution.

Percentiles use the nearest-rank definition (the smallest recorded value with at least
``q`` of the samples at or below it); ``max`` and ``min`` are exact.

:func:`compare` puts two summaries side by side per percentile, as a difference *and*
a ratio: the seed forbids reporting gateway overhead by subtraction alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "PERCENTILES",
    "Histogram",
    "compare",
    "exact_percentile",
    "spread",
    "summarize",
]

SUB_BITS: Final = 8
_SUB: Final = 1 << SUB_BITS
_HALF: Final = _SUB >> 1

PERCENTILES: Final[tuple[tuple[str, float], ...]] = (
    ("p50", 0.50),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("max", 1.0),
)
"""The percentiles every report gives, by key."""


def bucket_index(value: int) -> int:
    """The bucket of a non-negative integer: exact below 256, log-linear above."""
    if value < _SUB:
        return value if value > 0 else 0
    shift = value.bit_length() - SUB_BITS
    return (shift << (SUB_BITS - 1)) + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The inclusive ``(low, high)`` range of values that land in bucket ``index``."""
    if index < _SUB:
        return index, index
    shift = index // _HALF - 1
    mantissa = index - shift * _HALF
    return mantissa << shift, ((mantissa + 1) << shift) - 1


class Histogram:
    """Counts of integer microseconds in log-linear buckets; see the module docstring."""

    __slots__ = ("buckets", "count", "max", "min", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0

    def record(self, value_us: int) -> None:
        if value_us < _SUB:
            if value_us < 0:
                value_us = 0
            index = value_us
        else:
            shift = value_us.bit_length() - SUB_BITS
            index = (shift << (SUB_BITS - 1)) + (value_us >> shift)
        buckets = self.buckets
        buckets[index] = buckets.get(index, 0) + 1
        if self.count == 0 or value_us < self.min:
            self.min = value_us
        if value_us > self.max:
            self.max = value_us
        self.count += 1
        self.total += value_us

    def record_seconds(self, seconds: float) -> None:
        self.record(int(seconds * 1_000_000))

    def merge(self, other: Histogram) -> Histogram:
        """Add ``other``'s samples to this histogram; returns ``self``."""
        if other.count == 0:
            return self
        buckets = self.buckets
        for index, n in other.buckets.items():
            buckets[index] = buckets.get(index, 0) + n
        if self.count == 0 or other.min < self.min:
            self.min = other.min
        self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total
        return self

    @classmethod
    def merged(cls, parts: Iterable[Histogram]) -> Histogram:
        out = cls()
        for part in parts:
            out.merge(part)
        return out

    def percentile(self, q: float) -> int | None:
        """The nearest-rank ``q`` quantile in microseconds (``0 < q <= 1``), or None when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"a quantile is between 0 and 1, not {q}")
        if self.count == 0:
            return None
        if q >= 1.0:
            return self.max
        if q <= 0.0:
            return self.min
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                low, high = bucket_bounds(index)
                return min(max((low + high) // 2, self.min), self.max)
        return self.max

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": "us",
            "sub_bits": SUB_BITS,
            "count": self.count,
            "sum": self.total,
            "min": self.min,
            "max": self.max,
            "buckets": [[index, self.buckets[index]] for index in sorted(self.buckets)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        if data.get("unit", "us") != "us" or data.get("sub_bits", SUB_BITS) != SUB_BITS:
            raise ValueError("histogram was recorded with a different unit or bucket precision")
        out = cls()
        out.buckets = {int(index): int(n) for index, n in data.get("buckets", [])}
        out.count = int(data.get("count", 0))
        out.total = int(data.get("sum", 0))
        out.min = int(data.get("min", 0))
        out.max = int(data.get("max", 0))
        if sum(out.buckets.values()) != out.count:
            raise ValueError("histogram bucket counts do not add up to its count")
        return out

    def __repr__(self) -> str:
        return f"Histogram(count={self.count}, min={self.min}, max={self.max})"


def summarize(hist: Histogram) -> dict[str, float | int | None]:
    """``count``, ``mean_ms`` and each of :data:`PERCENTILES` in milliseconds (None when empty)."""
    out: dict[str, float | int | None] = {"count": hist.count}
    mean = hist.mean
    out["mean_ms"] = None if mean is None else round(mean / 1000, 3)
    for key, q in PERCENTILES:
        value = hist.percentile(q)
        out[f"{key}_ms"] = None if value is None else round(value / 1000, 3)
    return out


def compare(
    baseline: Mapping[str, float | int | None], candidate: Mapping[str, float | int | None]
) -> dict[str, dict[str, float | None]]:
    """Per percentile: ``added_ms`` (candidate - baseline) and ``ratio`` (candidate / baseline).

    Both inputs are :func:`summarize` outputs. A percentile missing on either side, or a
    zero baseline for the ratio, gives None rather than a made-up number.
    """
    out: dict[str, dict[str, float | None]] = {}
    for key, _ in PERCENTILES:
        base = baseline.get(f"{key}_ms")
        cand = candidate.get(f"{key}_ms")
        if base is None or cand is None:
            out[key] = {"added_ms": None, "ratio": None}
            continue
        ratio = round(cand / base, 3) if base > 0 else None
        out[key] = {"added_ms": round(cand - base, 3), "ratio": ratio}
    return out


def exact_percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of raw samples; the reference the histogram is tested against."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    if q >= 1.0:
        return ordered[-1]
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


# Two-sided 95 % Student t quantiles by degrees of freedom; 1.96 beyond the table.
_T95: Final = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Median, range, mean and the 95 % confidence half-width of the mean across repetitions.

    ``None`` values (a metric a repetition could not produce) are left out and counted in ``n``
    only when present. With one value the half-width is None: one run has no spread to report.
    """
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "mean": None, "ci95": None}
    n = len(xs)
    mean = sum(xs) / n
    mid = n // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    ci95 = None
    if n > 1:
        variance = sum((x - mean) ** 2 for x in xs) / (n - 1)
        t = _T95[n - 2] if n - 2 < len(_T95) else 1.96
        ci95 = round(t * math.sqrt(variance / n), 4)
    return {
        "n": n,
        "median": round(median, 4),
        "min": round(xs[0], 4),
        "max": round(xs[-1], 4),
        "mean": round(mean, 4),
        "ci95": ci95,
    }
