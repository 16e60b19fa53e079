"""``python -m bench.dashboard``: the Grafana dashboard in docs/grafana/tollway.json, drawn from real scrapes.

    python -m bench.dashboard [--seconds 60] [--rate 10] [--out docs/img/dashboard.png]
    python -m bench.dashboard --from bench/results/dashboard/<run>   # re-draw a kept run

Neither Grafana nor Prometheus can be installed where this was written, so this module stands in
for both, to show what the dashboard looks like on the gateway's own numbers:

1. it starts the real stack, ``python -m tollway.cli up --port 0 --cloud-port 0 --mock-port N``
   (mock providers, local cloud, gateway on its bundled config) in a process group of its own,
   and reads the base URL and the demo key from its banner. The mock's port is a free one picked
   here rather than 0, because ``up`` does not print it and the faults below are set there;
2. it drives a bounded open-loop load for ``--seconds``, Poisson arrivals at ``--rate`` (default
   10/s: the demo tenant's limit is 600 requests a minute), 18 in 20 buffered and streamed chat
   completions to ``chat-fast-v1`` and ``chat-claude-v1``, 1 in 20 for an unknown model (404) and
   1 in 20 with a bad key (401). Unless ``--no-faults``, the mock providers answer after 20-100 ms
   and the Anthropic route of ``chat-claude-v1`` answers 503 for 15 s from 40 % of the run, so
   the retry, fallback, attempt and circuit panels have something to show;
3. it scrapes ``GET /metrics`` every 2 s (the demo config serves it without a key) and keeps every
   scrape in ``bench/results/dashboard/<run>/`` (git-ignored), with the load's counts;
4. it evaluates every panel's PromQL over the scrapes at each scrape's time, with Grafana's
   variables replaced: ``$alias`` and ``$environment`` by ``.*`` (the "All" value),
   ``$__rate_interval`` by ``--window``;
5. it draws the dashboard's grid (gridPos, titles, legends, units, the right-axis override)
   with matplotlib in a dark theme close to Grafana's, into one PNG whose footer says that
   it is a rendering of the JSON, not a Grafana screenshot.

**The evaluator** knows exactly the PromQL subset the dashboard is written in, and refuses
anything else (:class:`UnsupportedQuery`) rather than draw what Prometheus would not:
``sum [by (…)] (rate(M{…}[W]))``, ``histogram_quantile(Q, sum by (le[, …]) (rate(M_bucket{…}[W])))``,
``sum [by (…)] (M{…})`` for gauges, the four label matchers, and a number times any of them.
The queries are parsed with ``promql-parser`` (PyPI, ``promql-parser==0.12.0``, a binding of the
Rust ``promql-parser`` crate, which follows Prometheus 2.45's grammar), so a query this accepts
is one Prometheus parses the same way. Where it differs from Prometheus:

- ``rate`` is the increase between the first and the last sample in ``(t - W, t]`` (a counter
  reset counts the value after it as the increase) over the seconds between those two samples.
  Prometheus also extrapolates that increase towards the window's edges; this does not, which
  reads the same for a steady rate and at most one scrape interval's share lower at a step.
- Like Prometheus, a series that first appears inside the window starts at its first sample: a
  counter created at 1 (a circuit's first transition to a state) shows no increase until it
  moves again.
- ``histogram_quantile`` is Prometheus' ``bucketQuantile`` for classic buckets (promql/quantile.go):
  buckets merged by upper bound and made monotonic, linear interpolation inside the bucket that
  holds the rank, the lower bound of the +Inf bucket when the rank falls in it, NaN without
  observations.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import httpx
import matplotlib
import orjson
import promql_parser
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, DateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "DASHBOARD",
    "Evaluator",
    "Labels",
    "PanelSeries",
    "Scrape",
    "UnsupportedQuery",
    "Vector",
    "dashboard_queries",
    "evaluate_panel",
    "expand",
    "histogram_quantile",
    "load_run",
    "main",
    "metric_names",
    "parse_query",
    "parse_scrape",
    "render",
]

ROOT: Final = Path(__file__).resolve().parent.parent
DASHBOARD: Final = ROOT / "docs" / "grafana" / "tollway.json"
DEFAULT_OUT: Final = ROOT / "docs" / "img" / "dashboard.png"
RESULTS: Final = ROOT / "bench" / "results" / "dashboard"

Labels = tuple[tuple[str, str], ...]
"""A series' labels, sorted by name, without the metric name (PromQL drops it from every result
this subset can produce)."""
Vector = dict[Labels, float]
"""An instant vector: one value per series."""

# -- scrapes -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """One ``GET /metrics``: the Unix time it started (Prometheus stamps a scrape's samples with
    its start) and every sample, by sample name (``…_total``, ``…_bucket``, a gauge's name)."""

    t: float
    samples: Mapping[str, Sequence[tuple[Labels, float]]]


def parse_scrape(text: str, t: float) -> Scrape:
    """Parse one scrape with prometheus-client's own text parser, the format's reference reader."""
    samples: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((tuple(sorted(sample.labels.items())), float(sample.value)))
    return Scrape(t, samples)


# -- the PromQL subset ---------------------------------------------------------------------


class UnsupportedQuery(ValueError):
    """A query outside the subset this evaluator knows: an error, never a guess."""


_VARIABLE: Final = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_LEGEND: Final = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LOOKBACK_S: Final = 300.0
"""Prometheus' default lookback: an instant selector reads a sample at most this old."""
_EPSILON_S: Final = 1e-6


def expand(expr: str, variables: Mapping[str, str]) -> str:
    """Replace Grafana's ``$name`` and ``${name}`` as Grafana does before it sends the query."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise UnsupportedQuery(f"no value for the variable ${name} in {expr!r}")
        return variables[name]

    return _VARIABLE.sub(value, expr)


def parse_query(expr: str) -> promql_parser.Expr:
    """Parse with promql-parser; its ``ValueError`` becomes :class:`UnsupportedQuery`."""
    try:
        return promql_parser.parse(expr)
    except ValueError as exc:
        raise UnsupportedQuery(f"{expr!r} does not parse: {exc}") from exc


def metric_names(node: promql_parser.Expr) -> list[str]:
    """The metric names a parsed query selects, in order (to check them against the docs)."""
    names: list[str] = []

    def visit(expr: promql_parser.Expr) -> None:
        if isinstance(expr, promql_parser.VectorSelector) and expr.name:
            names.append(expr.name)

    promql_parser.walk(node, pre_visit=visit)
    return names


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``bucketQuantile`` over classic buckets: ``(upper bound, cumulative count)`` pairs.

    Written from promql/quantile.go so that a figure drawn here is the one Prometheus would
    give for the same bucket rates: the buckets are merged by upper bound, sorted and made
    monotonic (rates of separately scraped buckets can disagree by a little); the rank
    ``q * count`` is found in the first bucket whose count reaches it and interpolated linearly
    between that bucket's bounds (0 below the first bucket, unless its bound is not positive);
    a rank in the +Inf bucket answers the highest finite bound.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return math.nan
    bounds = [upper for upper, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:
        counts.append(max(count, counts[-1]) if counts else count)
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = bisect_left(counts, rank)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def _matches(labels: Labels, matchers: Sequence[promql_parser.Matcher]) -> bool:
    values = dict(labels)
    for matcher in matchers:
        value = values.get(matcher.name, "")  # a missing label matches as the empty string
        op = matcher.op
        if op == promql_parser.MatchOp.Equal:
            ok = value == matcher.value
        elif op == promql_parser.MatchOp.NotEqual:
            ok = value != matcher.value
        elif op == promql_parser.MatchOp.Re:
            ok = re.fullmatch(matcher.value, value) is not None  # Prometheus anchors its regexes
        elif op == promql_parser.MatchOp.NotRe:
            ok = re.fullmatch(matcher.value, value) is None
        else:
            raise UnsupportedQuery(f"matcher {matcher.name}{op}{matcher.value!r}")
        if not ok:
            return False
    return True


def _sum(vector: Vector, by: Sequence[str] | None) -> Vector:
    """``sum [by (…)]``: a label missing and a label empty are one group, and an empty label is
    left out of the result's labels, as in Prometheus."""
    out: Vector = {}
    names = sorted(by or ())
    for labels, value in vector.items():
        values = dict(labels)
        key = tuple((name, values[name]) for name in names if values.get(name))
        out[key] = out.get(key, 0.0) + value
    return out


class Evaluator:
    """Instant queries of the subset at any time, over a run's scrapes (sorted by time)."""

    def __init__(self, scrapes: Sequence[Scrape]) -> None:
        self.scrapes = sorted(scrapes, key=lambda s: s.t)
        self._times = [s.t for s in self.scrapes]

    def query(self, expr: str | promql_parser.Expr, t: float) -> Vector:
        """The instant vector ``expr`` gives at Unix time ``t``."""
        node = parse_query(expr) if isinstance(expr, str) else expr
        return self._eval(node, t)

    def _eval(self, node: promql_parser.Expr, t: float) -> Vector:
        if isinstance(node, promql_parser.ParenExpr):
            return self._eval(node.expr, t)
        if isinstance(node, promql_parser.AggregateExpr):
            return self._aggregate(node, t)
        if isinstance(node, promql_parser.Call):
            return self._call(node, t)
        if isinstance(node, promql_parser.BinaryExpr):
            return self._scale(node, t)
        if isinstance(node, promql_parser.VectorSelector):
            return self._instant(node, t)
        raise UnsupportedQuery(f"{type(node).__name__} is outside the subset: {node}")

    def _aggregate(self, node: promql_parser.AggregateExpr, t: float) -> Vector:
        if str(node.op) != "sum" or node.param is not None:
            raise UnsupportedQuery(f"only sum aggregates: {node}")
        modifier = node.modifier
        if modifier is not None and modifier.type != promql_parser.AggModifierType.By:
            raise UnsupportedQuery(f"only sum by (…): {node}")
        return _sum(self._eval(node.expr, t), modifier.labels if modifier is not None else None)

    def _call(self, node: promql_parser.Call, t: float) -> Vector:
        name, args = node.func.name, list(node.args)
        if name == "rate" and len(args) == 1 and isinstance(args[0], promql_parser.MatrixSelector):
            return self._rate(args[0], t)
        if (
            name == "histogram_quantile"
            and len(args) == 2
            and isinstance(args[0], promql_parser.NumberLiteral)
            and isinstance(args[1], promql_parser.Expr)
        ):
            return self._quantile(args[0].val, self._eval(args[1], t))
        raise UnsupportedQuery(f"only rate(M[W]) and histogram_quantile(Q, …): {node}")

    def _scale(self, node: promql_parser.BinaryExpr, t: float) -> Vector:
        lhs, rhs = node.lhs, node.rhs
        if str(node.op) != "*" or node.modifier is not None:
            raise UnsupportedQuery(f"only a number times a vector: {node}")
        if isinstance(lhs, promql_parser.NumberLiteral) and not isinstance(rhs, promql_parser.NumberLiteral):
            factor, vector = lhs.val, self._eval(rhs, t)
        elif isinstance(rhs, promql_parser.NumberLiteral) and not isinstance(lhs, promql_parser.NumberLiteral):
            factor, vector = rhs.val, self._eval(lhs, t)
        else:
            raise UnsupportedQuery(f"only a number times a vector: {node}")
        return {labels: factor * value for labels, value in vector.items()}

    def _quantile(self, q: float, vector: Vector) -> Vector:
        groups: dict[Labels, list[tuple[float, float]]] = {}
        for labels, value in vector.items():
            values = dict(labels)
            le = values.pop("le", None)
            if le is None:
                continue  # Prometheus ignores a series without `le` here too
            groups.setdefault(tuple(sorted(values.items())), []).append((float(le), value))
        return {labels: histogram_quantile(q, buckets) for labels, buckets in groups.items()}

    def _selector(self, node: promql_parser.VectorSelector) -> tuple[str, list[promql_parser.Matcher]]:
        if not node.name or node.offset is not None or node.at is not None or node.matchers.or_matchers:
            raise UnsupportedQuery(f"only a named selector without offset, @ or `or`: {node}")
        return node.name, list(node.matchers.matchers)

    def _select(self, scrape: Scrape, name: str, matchers: Sequence[promql_parser.Matcher]) -> Iterator[Labels]:
        for labels, _ in scrape.samples.get(name, ()):
            if _matches(labels, matchers):
                yield labels

    def _instant(self, node: promql_parser.VectorSelector, t: float) -> Vector:
        """The latest scrape at or before ``t``: a series missing from it is stale, as in Prometheus."""
        name, matchers = self._selector(node)
        i = bisect_left(self._times, t + _EPSILON_S) - 1
        if i < 0 or t - self._times[i] > _LOOKBACK_S:
            return {}
        return {labels: value for labels, value in self.scrapes[i].samples.get(name, ()) if _matches(labels, matchers)}

    def _rate(self, node: promql_parser.MatrixSelector, t: float) -> Vector:
        name, matchers = self._selector(node.vector_selector)
        window = node.range.total_seconds()
        lo = bisect_left(self._times, t - window + _EPSILON_S)  # (t - W, t], left-open as in Prometheus 3
        hi = bisect_left(self._times, t + _EPSILON_S)
        points: dict[Labels, list[tuple[float, float]]] = {}
        for scrape in self.scrapes[lo:hi]:
            for labels, value in scrape.samples.get(name, ()):
                if _matches(labels, matchers):
                    points.setdefault(labels, []).append((scrape.t, value))
        out: Vector = {}
        for labels, series in points.items():
            if len(series) < 2:
                continue
            increase, previous = 0.0, series[0][1]
            for _, value in series[1:]:
                increase += value - previous if value >= previous else value  # a reset restarts at 0
                previous = value
            out[labels] = increase / (series[-1][0] - series[0][0])
        return out


# -- panels --------------------------------------------------------------------------------


@dataclass(slots=True)
class PanelSeries:
    """One line of a panel: its legend, the target it came from, its value at each time (NaN: none)."""

    legend: str
    ref_id: str
    values: list[float]


def dashboard_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Every ``(panel, target)`` with an ``expr``, rows' nested panels included."""
    for panel in dashboard.get("panels", ()):
        for inner in (panel, *panel.get("panels", ())):
            for target in inner.get("targets", ()):
                if target.get("expr"):
                    yield inner, target


def _legend(fmt: str | None, labels: Labels) -> str:
    values = dict(labels)
    if not fmt or fmt == "__auto":
        return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"
    return " ".join(_LEGEND.sub(lambda m: values.get(m.group(1), ""), fmt).split())


def evaluate_panel(
    panel: Mapping[str, Any], evaluator: Evaluator, times: Sequence[float], variables: Mapping[str, str]
) -> list[PanelSeries]:
    """Each target's query at each time, one :class:`PanelSeries` per result series, in target
    order and then by legend (the order Grafana gives the palette's colours)."""
    out: list[PanelSeries] = []
    for target in panel.get("targets", ()):
        if not target.get("expr") or target.get("hide"):
            continue
        node = parse_query(expand(target["expr"], variables))
        by_labels: dict[Labels, list[float]] = {}
        for i, t in enumerate(times):
            for labels, value in evaluator.query(node, t).items():
                by_labels.setdefault(labels, [math.nan] * len(times))[i] = value
        series = [
            PanelSeries(_legend(target.get("legendFormat"), labels), str(target.get("refId", "")), values)
            for labels, values in by_labels.items()
        ]
        out.extend(sorted(series, key=lambda s: s.legend))
    return out


# -- drawing -------------------------------------------------------------------------------

DPI: Final = 100
WIDTH_PX: Final = 1800
CELL_PX: Final = 38
"""One gridPos row: Grafana's 30 px cell and its 8 px margin."""
GAP_PX: Final = 8
HEADER_PX: Final = 78
FOOTER_PX: Final = 34
PAGE: Final = "#111217"
PANEL: Final = "#181b1f"
BORDER: Final = "#2c3235"
TEXT: Final = "#ccccdc"
TEXT_DIM: Final = "#8e8e9e"
GRID: Final = "#26292e"
CLASSIC: Final = (
    "#7EB26D",
    "#EAB839",
    "#6ED0E0",
    "#EF843C",
    "#E24D42",
    "#1F78C1",
    "#BA43A6",
    "#705DA0",
    "#508642",
    "#CCA300",
    "#447EBC",
    "#C15C17",
)
"""Grafana's palette-classic, in its order."""


def _si(value: float, digits: int = 3) -> str:
    for factor, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " K")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def _seconds(value: float) -> str:
    magnitude = abs(value)
    if magnitude == 0:
        return "0 s"
    if magnitude < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if magnitude < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def _bytes(value: float) -> str:
    for factor, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {suffix}"
    return f"{value:.3g} B"


_UNITS: Final[dict[str, Callable[[float], str]]] = {
    "s": _seconds,
    "reqps": lambda v: f"{_si(v)} req/s",
    "ops": lambda v: f"{_si(v)} ops/s",
    "bytes": _bytes,
    "currencyUSD": lambda v: f"${v:.3g}",
    "short": _si,
    "none": _si,
}


def _unit_formatter(unit: str) -> FuncFormatter:
    fmt = _UNITS.get(unit, _si)
    return FuncFormatter(lambda value, _pos: "0" if value == 0 and unit != "s" else fmt(value))


def _overrides(panel: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``byFrameRefID`` overrides by refId: the only matcher the renderer knows (unit, axis side, label)."""
    out: dict[str, dict[str, Any]] = {}
    for override in panel.get("fieldConfig", {}).get("overrides", ()):
        matcher = override.get("matcher", {})
        if matcher.get("id") != "byFrameRefID":
            continue
        props = out.setdefault(str(matcher.get("options")), {})
        for prop in override.get("properties", ()):
            props[prop["id"]] = prop.get("value")
    return out


def _style_axes(ax: Axes, unit: str, label: str) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors=TEXT_DIM, labelsize=8, length=0, pad=4)
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, min_n_ticks=3))
    ax.yaxis.set_major_formatter(_unit_formatter(unit))
    if label:
        ax.set_ylabel(label, color=TEXT_DIM, fontsize=8)


def _draw_panel(
    fig: Figure,
    box: tuple[float, float, float, float],
    panel: Mapping[str, Any],
    series: Sequence[PanelSeries],
    x: Sequence[float],
    span: tuple[float, float],
) -> None:
    """One timeseries panel in ``box`` (left, top, width, height in pixels from the top left)."""
    width, height = (float(v) for v in fig.get_size_inches() * DPI)
    left, top, w, h = box

    def fx(px: float) -> float:
        return px / width

    def fy(px: float) -> float:
        return 1 - px / height

    fig.add_artist(
        Rectangle(
            (fx(left), fy(top + h)),
            w / width,
            h / height,
            transform=fig.transFigure,
            facecolor=PANEL,
            edgecolor=BORDER,
            linewidth=1,
            zorder=-1,  # under the axes, which the figure draws at zorder 0
        )
    )
    fig.text(
        fx(left + 10),
        fy(top + 16),
        panel.get("title", ""),
        color=TEXT,
        fontsize=10.5,
        fontweight="bold",
        va="center",
    )
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    unit = str(defaults.get("unit", "short"))
    custom = defaults.get("custom", {})
    overrides = _overrides(panel)
    on_right = [overrides.get(s.ref_id, {}).get("custom.axisPlacement") == "right" for s in series]
    drawn = [i for i, s in enumerate(series) if any(not math.isnan(v) for v in s.values)]
    if not drawn:
        fig.text(
            fx(left + w / 2), fy(top + h / 2 + 8), "No data", color=TEXT_DIM, fontsize=12, ha="center", va="center"
        )
        return
    widest = max(len(series[i].legend) for i in drawn)
    legend_cols = max(1, int((w - 24) // (widest * 6.3 + 36)))
    legend_rows = math.ceil(len(drawn) / legend_cols)
    pad_left, pad_right = 64, 64 if any(on_right) else 14
    pad_top, pad_bottom = 34, 28 + legend_rows * 17
    ax = fig.add_axes(
        (
            fx(left + pad_left),
            fy(top + h - pad_bottom),
            (w - pad_left - pad_right) / width,
            (h - pad_top - pad_bottom) / height,
        )
    )
    _style_axes(ax, unit, str(custom.get("axisLabel", "")))
    axes = [ax]
    if any(on_right):
        props = overrides[series[on_right.index(True)].ref_id]
        twin = ax.twinx()
        _style_axes(twin, str(props.get("unit", unit)), str(props.get("custom.axisLabel", "")))
        twin.grid(False)
        axes.append(twin)
    fill = float(custom.get("fillOpacity", 0)) / 100
    line_width = float(custom.get("lineWidth", 1)) + 0.3
    handles: list[Line2D] = []
    for i in drawn:
        s, color = series[i], CLASSIC[i % len(CLASSIC)]
        target = axes[-1] if on_right[i] else ax
        target.plot(x, s.values, color=color, linewidth=line_width)
        if fill:
            target.fill_between(x, s.values, 0, color=color, alpha=fill, linewidth=0)
        handles.append(Line2D([], [], color=color, linewidth=3, label=s.legend or " "))
    for side, target in enumerate(axes):
        target.set_xlim(*span)
        if defaults.get("min") is not None:
            target.set_ylim(bottom=float(defaults["min"]))
        bottom = target.get_ylim()[0]
        values = [v for i in drawn if on_right[i] == bool(side) for v in series[i].values if not math.isnan(v)]
        peak = max(values, default=bottom)
        if peak <= bottom:  # a flat line at the minimum (a counter that never moved): Grafana shows 0 to 1
            target.set_ylim(bottom, bottom + 1)
    ax.xaxis.set_major_locator(AutoDateLocator(minticks=3, maxticks=6))  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=dt.UTC))  # type: ignore[no-untyped-call]
    fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(fx(left + 10), fy(top + h - pad_bottom + 24)),
        bbox_transform=fig.transFigure,
        ncol=legend_cols,
        frameon=False,
        fontsize=8,
        labelcolor=TEXT,
        handlelength=1.0,
        handletextpad=0.5,
        columnspacing=1.6,
        borderaxespad=0,
    )


def _panel_boxes(panels: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], tuple[float, ...]]]:
    column = WIDTH_PX / 24
    for panel in panels:
        pos = panel.get("gridPos", {})
        x, y, w, h = (int(pos.get(k, 0)) for k in ("x", "y", "w", "h"))
        yield panel, (x * column + GAP_PX / 2, HEADER_PX + y * CELL_PX, w * column - GAP_PX, h * CELL_PX - GAP_PX)


def _text(fig: Figure, x_px: float, y_px: float, text: str, **style: Any) -> None:
    """Text at pixels from the figure's top left, vertically centred there."""
    width, height = (float(v) for v in fig.get_size_inches() * DPI)
    fig.text(x_px / width, 1 - y_px / height, text, va="center", **style)


def render(
    dashboard: Mapping[str, Any],
    scrapes: Sequence[Scrape],
    out: Path,
    *,
    window: str = "20s",
    notes: Sequence[str] = (),
) -> dict[str, str]:
    """Draw ``dashboard`` over ``scrapes`` into ``out`` (PNG), with ``notes`` (about the run) under the
    footer; returns each panel's state by title: ``data``, ``zero`` (every value 0) or ``no data``
    (no series at all), for the run's report."""
    evaluator = Evaluator(scrapes)
    times = [s.t for s in evaluator.scrapes]
    variables = {"alias": ".*", "environment": ".*", "__rate_interval": window}
    for var in dashboard.get("templating", {}).get("list", ()):
        variables.setdefault(str(var.get("name")), str(var.get("allValue") or ".*"))
    x = [float(date2num(dt.datetime.fromtimestamp(t, tz=dt.UTC))) for t in times]  # type: ignore[no-untyped-call]
    panels = [p for top in dashboard.get("panels", ()) for p in (top, *top.get("panels", ()))]
    rows = max((int(p["gridPos"]["y"]) + int(p["gridPos"]["h"]) for p in panels if "gridPos" in p), default=0)
    height = HEADER_PX + rows * CELL_PX + FOOTER_PX + 16 * len(notes)
    states: dict[str, str] = {}
    start, end = (dt.datetime.fromtimestamp(t, tz=dt.UTC) for t in (times[0], times[-1]))
    with matplotlib.rc_context({"font.family": "DejaVu Sans", "path.simplify": False, "text.parse_math": False}):
        fig = Figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI, facecolor=PAGE)
        FigureCanvasAgg(fig)
        _text(fig, 12, 24, str(dashboard.get("title", "")), color=TEXT, fontsize=15, fontweight="bold")
        chips = [f"{v.get('label') or v.get('name')}: All" for v in dashboard.get("templating", {}).get("list", ())]
        chips.append(f"$__rate_interval: {window}")
        chip_box = {"facecolor": PANEL, "edgecolor": BORDER, "boxstyle": "round,pad=0.45"}
        _text(fig, 12, 56, "     ".join(chips), color=TEXT, fontsize=9.5, bbox=chip_box)
        span_text = f"{start:%Y-%m-%d %H:%M:%S} to {end:%H:%M:%S} UTC, {len(times)} scrapes"
        _text(fig, WIDTH_PX - 12, 24, span_text, color=TEXT_DIM, fontsize=9.5, ha="right")
        for panel, (left, top, w, h) in _panel_boxes(panels):
            title = str(panel.get("title", ""))
            if panel.get("type") == "row":
                _text(fig, left + 2, top + CELL_PX / 2, title, color=TEXT, fontsize=11.5, fontweight="bold")
                continue
            series = evaluate_panel(panel, evaluator, times, variables)
            values = [v for s in series for v in s.values if not math.isnan(v)]
            states[title] = "no data" if not values else "zero" if not any(values) else "data"
            _draw_panel(fig, (left, top, w, h), panel, series, x, (x[0], x[-1]))
        footer_top = HEADER_PX + rows * CELL_PX
        footer = (
            f"Rendered by bench/dashboard.py from docs/grafana/tollway.json over real scrapes of tollway up, "
            f"{start:%Y-%m-%d}. Not a Grafana screenshot: bench/dashboard.py evaluated each panel's PromQL over the "
            "scrapes ($alias = $environment = .*) and drew it with matplotlib."
        )
        _text(fig, 12, footer_top + 18, footer, color=TEXT, fontsize=9.5)
        for i, note in enumerate(notes):
            _text(fig, 12, footer_top + 38 + 16 * i, note, color=TEXT_DIM, fontsize=8.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=DPI, facecolor=PAGE, metadata={"Software": None})
    return states


# -- a kept run ----------------------------------------------------------------------------


def load_run(run_dir: Path) -> tuple[list[Scrape], dict[str, Any]]:
    """The scrapes and the run description (``run.json``) of a run directory."""
    run = orjson.loads((run_dir / "run.json").read_bytes())
    scrapes = [parse_scrape((run_dir / entry["file"]).read_text(), float(entry["t"])) for entry in run["scrapes"]]
    return scrapes, run


def _notes(run: Mapping[str, Any]) -> list[str]:
    """What the run did, for the picture's footer."""
    load = run.get("load", {})
    lines = [
        f"Load: {load.get('sent', 0)} requests, Poisson at {run.get('rate')}/s for {run.get('seconds')} s: buffered "
        "and streamed chat completions to chat-fast-v1 and chat-claude-v1, 1 in 20 for an unknown model (404), "
        f"1 in 20 with a bad key (401). Scraped every {run.get('scrape_every_s')} s.",
    ]
    if run.get("faults"):
        lines.append(
            "Mock providers answer after 20-100 ms (stream deltas 10 ms apart); chat-claude-v1's Anthropic route "
            f"(mock-anthropic) answers 503 for {run['faults']['down_s']} s from +{run['faults']['at_s']:.0f} s "
            "into the load. Reproduce: python -m bench.dashboard"
        )
    return lines


# -- the live run --------------------------------------------------------------------------

MAX_REQUESTS: Final = 20_000
MAX_IN_FLIGHT: Final = 256
REQUEST_TIMEOUT_S: Final = 30.0
START_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 90.0
"""``up`` bounds its own stop (gateway 10 s, audit shipper 15 s, local cloud 40 s, mock 5 s, each
SIGKILLed past its bound): this waits that long and a little more before it kills ``up``."""
TAIL_S: Final = 6.0
"""Scrapes after the load ends: the counters' last increments, the gauges back at rest."""
DOWN_S: Final = 15
PROMPTS: Final = (
    "hi",
    "Summarise the quarterly report in two sentences.",
    " ".join(["Explain, step by step, how a circuit breaker protects a gateway from a failing provider."] * 2),
    " ".join(["List the trade-offs of retries against fallbacks for an LLM gateway under load."] * 5),
)
# (name, model, stream, good key): request j is MIX[j % 20], so every kind recurs every 20 requests.
MIX: Final = (
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("chat-claude-v1 stream", "chat-claude-v1", True, True),
    ("chat-fast-v1 stream", "chat-fast-v1", True, True),
    ("chat-claude-v1", "chat-claude-v1", False, True),
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("chat-claude-v1 stream", "chat-claude-v1", True, True),
    ("chat-fast-v1 stream", "chat-fast-v1", True, True),
    ("chat-claude-v1", "chat-claude-v1", False, True),
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("unknown model", "chat-unknown-v9", False, True),
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("chat-claude-v1 stream", "chat-claude-v1", True, True),
    ("chat-fast-v1 stream", "chat-fast-v1", True, True),
    ("chat-claude-v1", "chat-claude-v1", False, True),
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("chat-claude-v1 stream", "chat-claude-v1", True, True),
    ("chat-fast-v1 stream", "chat-fast-v1", True, True),
    ("chat-claude-v1", "chat-claude-v1", False, True),
    ("chat-fast-v1", "chat-fast-v1", False, True),
    ("bad key", "chat-fast-v1", False, False),
)


@dataclass
class _Banner:
    """``tollway up``'s banner, read off its stdout by a thread that then keeps draining it into
    ``up.out``: ``up`` forwards its children's output there, and a full pipe would stall them."""

    values: dict[str, str] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)

    def read(self, stream: IO[str], copy: IO[str]) -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under us at the end
            for line in stream:
                copy.write(line)
                copy.flush()
                name, sep, value = line.partition(" : ")
                if sep and name.startswith("  "):
                    self.values[name.strip()] = value.strip()
                if line.startswith("Press Ctrl-C"):
                    self.ready.set()
        self.ready.set()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_up(run_dir: Path, mock_port: int) -> tuple[subprocess.Popen[str], _Banner, list[IO[str]]]:
    """``tollway up`` in the run directory (its .tollway/ state, WAL and moto log stay there), in a
    process group of its own: a Ctrl-C here reaches this process alone, which then stops ``up``
    once, as tests/e2e/test_lifecycle.py does, rather than ``up`` seeing two."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "TOLLWAY_DEMO_KEY"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    err = (run_dir / "up.log").open("w")
    out = (run_dir / "up.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.cli", "up", "--port", "0", "--cloud-port", "0", "--mock-port", str(mock_port)],
        stdout=subprocess.PIPE,
        stderr=err,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=run_dir,
        process_group=0,
    )
    banner = _Banner()
    assert proc.stdout is not None
    threading.Thread(target=banner.read, args=(proc.stdout, out), daemon=True, name="up-stdout").start()
    return proc, banner, [err, out]


def _stop_up(proc: subprocess.Popen[str]) -> None:
    """SIGINT (``up``'s Ctrl-C: it stops its children in order), bounded; SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_healthy(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 before the deadline")


def _body(model: str, stream: bool, j: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPTS[j % len(PROMPTS)]}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def _one(client: httpx.AsyncClient, api: str, key: str, j: int, counts: Counter[str]) -> None:
    name, model, stream, good_key = MIX[j % len(MIX)]
    headers = {"authorization": f"Bearer {key if good_key else 'tw-not-a-key'}"}
    try:
        async with client.stream("POST", f"{api}/chat/completions", json=_body(model, stream, j), headers=headers) as r:
            async for _ in r.aiter_bytes():
                pass
        counts[f"{name} {r.status_code}"] += 1
    except httpx.HTTPError as exc:
        counts[f"{name} {type(exc).__name__}"] += 1


async def _scrape(
    client: httpx.AsyncClient, url: str, run_dir: Path, every: float, stop: asyncio.Event, limit: int
) -> list[dict[str, Any]]:
    """Scrape every ``every`` s until ``stop`` (or ``limit`` scrapes), keeping each as it came."""
    kept: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    for k in range(limit):
        t = time.time()
        with contextlib.suppress(httpx.HTTPError):
            response = await client.get(url, timeout=5.0)
            if response.status_code == 200:
                name = f"scrapes/{k:04d}.prom"
                (run_dir / name).write_text(response.text)
                kept.append({"file": name, "t": t})
        if stop.is_set():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start + (k + 1) * every - loop.time()))
            # stopped: one last scrape, at its due time, so the run ends on a full interval
            await asyncio.sleep(max(0.0, start + (k + 1) * every - loop.time()))
    return kept


async def _drive(
    root: str, key: str, mock: str, seconds: float, rate: float, every: float, faults: bool, run_dir: Path
) -> dict[str, Any]:
    """The load and the scrapes, on one event loop; returns what ``run.json`` records of them."""
    api = f"{root}/v1"
    cap = min(int(seconds * rate * 2) + 10, MAX_REQUESTS)  # Poisson: about seconds * rate, never more than this
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
    counts: Counter[str] = Counter()
    sent = dropped = 0
    fault_at = seconds * 0.4
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        if faults:
            await _post(client, f"{mock}/_mock/faults", {"delay_ms": 20, "jitter_ms": 80, "chunk_gap_ms": 10})
        stop = asyncio.Event()
        limit = int((seconds + TAIL_S) / every) + 4
        scraper = asyncio.create_task(_scrape(client, f"{root}/metrics", run_dir, every, stop, limit))
        await asyncio.sleep(every)  # a scrape before the first request: every rate starts from rest
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks: set[asyncio.Task[None]] = set()
        outage_set = not faults
        # Poisson arrivals (seeded): a metronome at 10/s phase-locks with the gateway's once-a-second
        # gauge sampler, which then reads the same instant of every request's life (0 in flight).
        arrivals, due = random.Random(20), start
        for j in range(cap):
            due += arrivals.expovariate(rate)
            if due - start > seconds:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not outage_set and loop.time() - start >= fault_at:
                outage_set = True
                body = {"model": "mock-claude-small", "down_for_ms": DOWN_S * 1000}
                await _post(client, f"{mock}/_mock/faults", body)
            if len(tasks) >= MAX_IN_FLIGHT:
                dropped += 1  # the generator's own cap: counted, never queued behind the schedule
                continue
            sent += 1
            task = asyncio.create_task(_one(client, api, key, j, counts))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=REQUEST_TIMEOUT_S + 5)
            for task in pending:
                task.cancel()
        await asyncio.sleep(TAIL_S)
        stop.set()
        kept = await asyncio.wait_for(scraper, timeout=30)
    load = {"sent": sent, "dropped": dropped, "answers": dict(sorted(counts.items()))}
    return {"scrapes": kept, "load": load, "faults": {"at_s": fault_at, "down_s": DOWN_S} if faults else None}


async def _post(client: httpx.AsyncClient, url: str, body: Mapping[str, Any]) -> None:
    response = await client.post(url, json=body)
    response.raise_for_status()


def run_live(seconds: float, rate: float, every: float, faults: bool) -> Path:
    """Start ``tollway up``, drive and scrape it, stop it; returns the run directory."""
    run_dir = RESULTS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (run_dir / "scrapes").mkdir(parents=True, exist_ok=False)
    mock_port = _free_port()
    proc, banner, files = _start_up(run_dir, mock_port)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        banner.ready.wait(START_TIMEOUT_S)
        if "base URL" not in banner.values or "demo key" not in banner.values:
            raise SystemExit(f"tollway up printed no base URL and demo key; see {run_dir / 'up.log'}")
        root = banner.values["base URL"].removesuffix("/v1")
        _wait_healthy(f"{root}/healthz", deadline)
        print(f"tollway up at {root}; {seconds:.0f} s at {rate}/s, scraping every {every} s", file=sys.stderr)
        mock = f"http://127.0.0.1:{mock_port}"
        result = asyncio.run(_drive(root, banner.values["demo key"], mock, seconds, rate, every, faults, run_dir))
    finally:
        _stop_up(proc)
        for f in files:
            f.close()
    run = {"seconds": seconds, "rate": rate, "scrape_every_s": every, "up_exit": proc.returncode, **result}
    (run_dir / "run.json").write_bytes(orjson.dumps(run, option=orjson.OPT_INDENT_2))
    return run_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dashboard", description="Draw docs/grafana/tollway.json from real scrapes of tollway up."
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration, 5 to 600 (default 60)")
    parser.add_argument(
        "--rate",
        type=float,
        default=10.0,
        help="requests per second, 0.5 to 50 (default 10: the demo tenant's limit is 600 a minute; "
        "above about 11/s part of the load is answered 429 rate_limited)",
    )
    parser.add_argument("--scrape-every", type=float, default=2.0, help="seconds between scrapes (default 2)")
    parser.add_argument("--window", default="20s", help="what $__rate_interval stands for (default 20s)")
    parser.add_argument("--no-faults", action="store_true", help="no mock latency and no outage")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG (default docs/img/dashboard.png)")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the dashboard JSON")
    parser.add_argument("--from", dest="run_dir", type=Path, help="re-draw a kept run instead of running one")
    args = parser.parse_args(argv)
    if not 5 <= args.seconds <= 600 or not 0.5 <= args.rate <= 50 or not 0.5 <= args.scrape_every <= 30:
        parser.error("--seconds 5-600, --rate 0.5-50, --scrape-every 0.5-30")
    run_dir = args.run_dir or run_live(args.seconds, args.rate, args.scrape_every, not args.no_faults)
    scrapes, run = load_run(run_dir)
    if len(scrapes) < 2:
        print(f"{run_dir}: fewer than two scrapes; nothing to draw", file=sys.stderr)
        return 1
    dashboard = orjson.loads(args.dashboard.read_bytes())
    states = render(dashboard, scrapes, args.out, window=args.window, notes=_notes(run))
    print(f"run: {run_dir}")
    print(f"load: {orjson.dumps(run.get('load')).decode()}")
    for title, state in states.items():
        print(f"  {state:8} {title}")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
