"""``python -m bench.plot RUN_DIR [--out DIR]``: PNG plots of one run's ``results.json``.

Written for ``docs/`` (default ``--out docs/img``), named after the run directory:

``<run>-latency.png``     sweep steps: P50 and P99 latency against offered RPS, per target (log y),
                          with the sweep's P99 bound, the rates that failed it, and windows where
                          other processes used > 10 % CPU ringed as noisy
``<run>-throughput.png``  sweep steps: completed throughput against offered RPS, per target, each
                          target's knee marked with the throughput it completed there
``<run>-timeline.png``    fixed-rate steps with a per-second timeline (the overload profile): per
                          second of intended send, completed / rejected (and late, failed) requests
                          and the P50 / P99 of the 2xx answers, per target, steps laid end to end
``<run>-percentiles.png`` fixed-rate steps without a timeline (peers, fixed-500, ...): P50 / P95 /
                          P99 per target (TTFT for SSE), with success % per target

Only what the run measured is drawn; a run with nothing to plot writes nothing and exits 1.
Output is deterministic for a given ``results.json``: fixed size and DPI, matplotlib's default
style whatever the local matplotlibrc says, and no version or date in the PNG metadata. The
footer names the command that produced the numbers (from ``manifest.json`` when present).

matplotlib is a dev dependency (``matplotlib==3.11.2``); nothing else in ``bench`` imports it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, cast

import matplotlib
import orjson
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

__all__ = ["main", "plot_run"]

DPI: Final = 100
SIZE: Final = (11.0, 6.5)
"""Inches; at :data:`DPI` every PNG is 1100 x 650 pixels per panel row."""
_FOOTER_IN: Final = 0.32
ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_OUT: Final = ROOT / "docs" / "img"

_COLORS: Final = {"direct": "#555555", "gateway": "#1f77b4", "portkey": "#ff7f0e", "litellm": "#2ca02c"}
_SPARE_COLORS: Final = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_ORDER: Final = ("gateway", "portkey", "litellm", "direct")
_STYLE: Final = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.facecolor": "white",
    "path.simplify": False,
}


# -- inputs -------------------------------------------------------------------------------


def _load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    file = run_dir / "results.json" if run_dir.is_dir() else run_dir
    results = orjson.loads(file.read_bytes())
    if not isinstance(results, dict) or "steps" not in results:
        raise ValueError(f"{file}: not a bench results file")
    manifest_file = file.parent / "manifest.json"
    manifest = orjson.loads(manifest_file.read_bytes()) if manifest_file.is_file() else {}
    return results, manifest if isinstance(manifest, dict) else {}


def _targets_in(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = list(dict.fromkeys(str(e["target"]) for e in runs))
    return sorted(seen, key=lambda t: (_ORDER.index(t) if t in _ORDER else len(_ORDER), t))


def _color(target: str, targets: Sequence[str]) -> str:
    if target in _COLORS:
        return _COLORS[target]
    spare = [t for t in targets if t not in _COLORS]
    return _SPARE_COLORS[spare.index(target) % len(_SPARE_COLORS)] if target in spare else _SPARE_COLORS[0]


def _label(target: str, results: Mapping[str, Any]) -> str:
    """Report names: ``gateway`` is Tollway; a peer carries its version."""
    if target == "gateway":
        return "tollway"
    version = (results.get("targets", {}).get(target) or {}).get("version")
    return f"{target} {version}" if version else target


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def _footer(fig: Figure, results: Mapping[str, Any], manifest: Mapping[str, Any]) -> None:
    """Two lines under the axes: the command that produced the numbers, then where and when."""
    command = manifest.get("command")
    parts = []
    git = manifest.get("git") or {}
    if git.get("commit"):
        parts.append(f"commit {str(git['commit'])[:7]}" + (" (dirty tree)" if git.get("dirty") else ""))
    machine = manifest.get("machine") or {}
    if machine.get("cpu_model"):
        parts.append(f"{machine['cpu_model']}, {machine.get('usable_cores')} cores")
    workers = (manifest.get("gateway") or {}).get("workers")
    if workers:
        parts.append(f"tollway {workers} worker(s)")
    if results.get("created"):
        parts.append(f"run started {results['created']}")
    lines = [f"Reproduce: {' '.join(str(c) for c in command)}"] if command else []
    lines.append("  |  ".join(parts))
    fig.text(0.01, 0.004, "\n".join(lines), fontsize=7.5, color="#555555", ha="left", va="bottom", linespacing=1.3)


@contextmanager
def _style() -> Iterator[None]:
    """matplotlib's defaults plus :data:`_STYLE`, whatever the local matplotlibrc says."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        cast(Any, matplotlib.rcParams).update(_STYLE)
        yield


def _figure(rows: int, height: float | None = None) -> Figure:
    inches = height or SIZE[1] * rows
    fig = Figure(figsize=(SIZE[0], inches), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    footer = _FOOTER_IN / inches  # keep the footer line clear of the axes' labels
    fig.get_layout_engine().set(h_pad=0.12, w_pad=0.08, rect=(0, footer, 1, 1 - footer))  # type: ignore[union-attr,call-arg]
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


def _ms_axis(ax: Axes, label: str) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel(label)


def _mode(step: Mapping[str, Any]) -> str:
    return f"payload {step.get('payload')}, {'SSE' if step.get('stream') else 'buffered'}"


# -- sweeps -------------------------------------------------------------------------------


def _by_target(step: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    runs = step["runs"]
    return {t: sorted((e for e in runs if e["target"] == t), key=lambda e: e["rate"]) for t in _targets_in(runs)}


def _rate_axis(ax: Axes, rates: Sequence[float]) -> None:
    ax.set_xscale("log")
    ticks = sorted(set(rates))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{r:g}" for r in ticks], rotation=45 if len(ticks) > 10 else 0)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("offered load, requests per second (open loop, log scale)")


def _knee_text(target: str, knee: float | None, entries: Sequence[Mapping[str, Any]], results: Any) -> str:
    name = _label(target, results)
    if not knee:
        return f"{name}: knee below {entries[0]['rate']:g} RPS" if entries else f"{name}: not measured"
    if all(e.get("pass") for e in entries):
        return f"{name}: knee ≥ {knee:g} RPS (every rate tried passed)"
    return f"{name}: knee {knee:g} RPS"


def _fail_text(step: Mapping[str, Any]) -> str:
    sweep = step.get("sweep") or {}
    bound, min_success = sweep.get("p99_bound_ms"), sweep.get("min_success")
    if bound is None or min_success is None:
        return "failed the sweep bound"
    return f"failed the sweep bound:\nP99 > {bound:g} ms or success < {min_success * 100:g} %"


_NOISY_PCT: Final = 10.0
"""Above this much CPU used by processes the run did not start, a window is noisy (as in the summary)."""


def _other_cpu(entry: Mapping[str, Any]) -> float | None:
    value = (entry.get("resources") or {}).get("other_cpu_pct")
    return None if value is None else float(value)


def _noisy(entry: Mapping[str, Any]) -> bool:
    other = _other_cpu(entry)
    return other is not None and other > _NOISY_PCT


def _noise_marks(ax: Axes, points: Sequence[tuple[float, float]]) -> None:
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "o", mfc="none", mec="#9467bd", mew=1.6, ms=13, zorder=4)


def _fail_marks(ax: Axes, points: Sequence[tuple[float, float]]) -> None:
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "X", color="#d62728", ms=11, mec="white", mew=0.8, zorder=5)


def sweep_latency_figure(results: Mapping[str, Any], manifest: Mapping[str, Any], run: str) -> Figure | None:
    steps = [s for s in results["steps"] if s.get("kind") == "sweep" and s["runs"]]
    if not steps:
        return None
    fig = _figure(len(steps))
    for ax, step in zip(fig.subplots(len(steps), 1, squeeze=False)[:, 0], steps, strict=True):
        by_target = _by_target(step)
        targets = list(by_target)
        bound = (step.get("sweep") or {}).get("p99_bound_ms")
        any_noisy = False
        for target, entries in by_target.items():
            color = _color(target, targets)
            rates = [float(e["rate"]) for e in entries]
            p50 = [_nan(e["summary"]["latency"].get("p50_ms")) for e in entries]
            p99 = [_nan(e["summary"]["latency"].get("p99_ms")) for e in entries]
            name = _label(target, results)
            ax.plot(rates, p99, "-o", color=color, lw=1.8, ms=5, label=f"{name} P99")
            ax.plot(rates, p50, "--s", color=color, lw=1.2, ms=4, alpha=0.85, label=f"{name} P50")
            _fail_marks(ax, [(r, v) for r, v, e in zip(rates, p99, entries, strict=True) if not e.get("pass")])
            noisy = [e for e in entries if _noisy(e)]
            _noise_marks(
                ax,
                [(float(e["rate"]), _nan(e["summary"]["latency"].get(k))) for e in noisy for k in ("p50_ms", "p99_ms")],
            )
            any_noisy = any_noisy or bool(noisy)
        if bound:
            ax.axhline(bound, color="#d62728", lw=1, ls=":", zorder=1)
            ax.annotate(
                f"P99 bound {bound:g} ms",
                (0.005, bound),
                xycoords=("axes fraction", "data"),
                xytext=(2, 3),
                textcoords="offset points",
                color="#d62728",
                fontsize=8,
            )
        _rate_axis(ax, [float(e["rate"]) for e in step["runs"]])
        _ms_axis(ax, "latency, ms (log scale; from intended send time)")
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], ls="", marker="X", color="#d62728", ms=9, mec="white"))
        labels.append(_fail_text(step))
        if any_noisy:
            handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="#9467bd", mew=1.6, ms=11))
            labels.append(f"noisy: other processes used\n> {_NOISY_PCT:g} % CPU in that window")
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9)
        ax.set_title(f"{run}: {step['name']} ({_mode(step)}): latency percentiles against offered load")
    _footer(fig, results, manifest)
    return fig


def sweep_throughput_figure(results: Mapping[str, Any], manifest: Mapping[str, Any], run: str) -> Figure | None:
    steps = [s for s in results["steps"] if s.get("kind") == "sweep" and s["runs"]]
    if not steps:
        return None
    fig = _figure(len(steps))
    for ax, step in zip(fig.subplots(len(steps), 1, squeeze=False)[:, 0], steps, strict=True):
        by_target = _by_target(step)
        targets = list(by_target)
        knees = step.get("knee_rps") or {}
        all_rates = sorted({float(e["rate"]) for e in step["runs"]})
        ax.plot(all_rates, all_rates, color="#bbbbbb", lw=1, ls="--", zorder=1, label="throughput = offered")
        for target, entries in by_target.items():
            color = _color(target, targets)
            rates = [float(e["rate"]) for e in entries]
            done = [float(e["summary"]["throughput_rps"]) for e in entries]
            knee = knees.get(target)
            label = _knee_text(target, knee, entries, results)
            at_knee = next((e for e in entries if knee and float(e["rate"]) == float(knee)), None)
            if at_knee is not None:
                label += f", {at_knee['summary']['throughput_rps']:g} RPS completed there"
            ax.plot(rates, done, "-o", color=color, lw=1.6, ms=5, label=label)
            _fail_marks(ax, [(r, v) for r, v, e in zip(rates, done, entries, strict=True) if not e.get("pass")])
            if at_knee is not None:
                ax.plot(
                    [float(knee or 0)],
                    [float(at_knee["summary"]["throughput_rps"])],
                    "*",
                    color=color,
                    ms=18,
                    mec="black",
                    mew=0.8,
                    zorder=6,
                )
        _rate_axis(ax, all_rates)
        ax.set_yscale("log")
        ax.set_yticks(all_rates)
        ax.set_yticklabels([f"{r:g}" for r in all_rates])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("completed in window, requests per second (log scale)")
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], ls="", marker="*", color="#999999", ms=13, mec="black", mew=0.8))
        labels.append("knee: highest rate passing the bound, every lower rate passing too")
        handles.append(Line2D([], [], ls="", marker="X", color="#d62728", ms=9, mec="white"))
        labels.append(_fail_text(step).replace("\n", " "))
        ax.legend(handles, labels, loc="upper left", framealpha=0.9)
        ax.set_title(f"{run}: {step['name']} ({_mode(step)}): completed throughput against offered load")
    _footer(fig, results, manifest)
    return fig


# -- timelines ----------------------------------------------------------------------------


def _follows(manifest: Mapping[str, Any]) -> dict[str, bool]:
    steps = (((manifest.get("profile") or {}).get("settings") or {}).get("steps")) or []
    return {str(s.get("name")): bool(s.get("follows_previous")) for s in steps}


def _timeline_entry(step: Mapping[str, Any], target: str) -> tuple[Mapping[str, Any], int] | None:
    """The pooled entry (repetitions merged) when there is one, with its repetition count."""
    pooled = (step.get("pooled") or {}).get(target)
    if pooled is not None:
        return pooled, int(pooled.get("repetitions") or 1)
    entries = [e for e in step["runs"] if e["target"] == target]
    return (entries[0], 1) if entries else None


_EXTRA_OUTCOMES: Final = (
    ("rejected", "rejected (429/503)", "--"),
    ("late", "late (2xx after the window)", ":"),
    ("failed+", "failed / timed out / dropped", "-."),
)


def _outcome(row: Mapping[str, Any], key: str) -> int:
    if key == "failed+":
        return int(row.get("failed", 0)) + int(row.get("timed_out", 0)) + int(row.get("dropped", 0))
    return int(row.get(key, 0))


_Series = dict[tuple[str, str], tuple[list[float], list[float]]]


def _add_timeline(series: _Series, step: Mapping[str, Any], targets: Sequence[str], offset: float) -> int:
    """Append ``step``'s per-second rows to ``series`` (by target and key); returns its repetitions."""
    reps_seen = 1
    for target in targets:
        found = _timeline_entry(step, target)
        if found is None:
            continue
        entry, reps = found
        reps_seen = max(reps_seen, reps)
        for row in entry["summary"]["timeline"]:
            x = offset + int(row["t"]) + 0.5
            for key in ("completed", *(k for k, _, _ in _EXTRA_OUTCOMES)):
                xs, ys = series.setdefault((target, key), ([], []))
                xs.append(x)
                ys.append(_outcome(row, key) / reps)
            for key in ("p50_ms", "p99_ms"):
                xs, ys = series.setdefault((target, key), ([], []))
                xs.append(x)
                ys.append(_nan(row.get(key)))
    return reps_seen


def timeline_figure(results: Mapping[str, Any], manifest: Mapping[str, Any], run: str) -> Figure | None:
    steps = [s for s in results["steps"] if s.get("kind") != "sweep" and s.get("timeline") and s["runs"]]
    if not steps:
        return None
    follows = _follows(manifest)
    targets = _targets_in([e for s in steps for e in s["runs"]])
    fig = _figure(2, SIZE[1] * 1.55)
    counts_ax, lat_ax = fig.subplots(2, 1, sharex=True, height_ratios=(1.0, 1.0))
    offset = 0.0
    offered_x: list[float] = []
    offered_y: list[float] = []
    series: _Series = {}
    boundaries: list[tuple[float, str]] = []
    reps_seen = 1
    for i, step in enumerate(steps):
        duration = float(step["runs"][0]["spec"]["duration_s"])
        if i:
            gap = "no gap" if follows.get(step["name"]) else "after a pause (warm-up not shown)"
            boundaries.append((offset, gap))
            for xs, ys in series.values():  # no line across a step boundary
                xs.append(offset)
                ys.append(math.nan)
        reps_seen = max(reps_seen, _add_timeline(series, step, targets, offset))
        rate = float(step["runs"][0]["rate"])
        offered_x += [offset, offset + duration]
        offered_y += [rate, rate]
        counts_ax.annotate(
            f"{step['name']}\n{rate:g} RPS offered, {duration:g} s",
            (offset + duration / 2, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -4),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=9,
            fontweight="bold",
        )
        offset += duration
    counts_ax.plot(offered_x, offered_y, color="#999999", lw=2.5, alpha=0.6, label="offered", zorder=1)
    for target in targets:
        color = _color(target, targets)
        name = _label(target, results)
        xs, ys = series.get((target, "completed"), ([], []))
        counts_ax.plot(xs, ys, "-o", color=color, lw=1.8, ms=4, label=f"{name} completed")
        for key, text, ls in _EXTRA_OUTCOMES:
            xs, ys = series.get((target, key), ([], []))
            if any(y > 0 for y in ys):  # NaN (a step boundary) is not > 0
                marker = "^" if key == "rejected" else "v"
                counts_ax.plot(xs, ys, ls=ls, marker=marker, color=color, lw=1.4, ms=4, label=f"{name} {text}")
        xs, ys = series.get((target, "p99_ms"), ([], []))
        lat_ax.plot(xs, ys, "-o", color=color, lw=1.8, ms=4, label=f"{name} P99")
        xs, ys = series.get((target, "p50_ms"), ([], []))
        lat_ax.plot(xs, ys, "--s", color=color, lw=1.1, ms=3.5, alpha=0.85, label=f"{name} P50")
    for ax in (counts_ax, lat_ax):
        for x, _ in boundaries:
            ax.axvline(x, color="black", lw=1, ls="-", alpha=0.6, zorder=1)
    for x, gap in boundaries:
        lat_ax.annotate(
            f"next step starts, {gap}",
            (x, 0.98),
            xycoords=("data", "axes fraction"),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=8,
            va="top",
        )
    per = f"mean per second over {reps_seen} repetitions" if reps_seen > 1 else "requests"
    counts_ax.set_ylabel(f"{per} per second of intended send")
    counts_ax.set_ylim(0, max(offered_y, default=1) * 1.25)
    counts_ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), framealpha=0.9)
    _ms_axis(lat_ax, "2xx latency, ms (log scale)")
    lat_ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), framealpha=0.9)
    lat_ax.set_xlabel("seconds of intended send time since the first measured request (requests binned by when due)")
    lat_ax.set_xlim(0, offset)
    lat_ax.set_xticks(range(int(offset) + 1))
    counts_ax.set_title(f"{run}: per second, outcome of the requests due in that second")
    lat_ax.set_title("P50 and P99 of the 2xx answers to the requests due in that second (latency from intended send)")
    _footer(fig, results, manifest)
    return fig


# -- fixed-rate steps without a timeline --------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def percentiles_figure(results: Mapping[str, Any], manifest: Mapping[str, Any], run: str) -> Figure | None:
    steps = [s for s in results["steps"] if s.get("kind") != "sweep" and not s.get("timeline") and s["runs"]]
    if not steps:
        return None
    fig = _figure(len(steps), SIZE[1] * 0.8 * len(steps))
    pcts = (("p50", 0.95), ("p95", 0.65), ("p99", 0.4))
    for ax, step in zip(fig.subplots(len(steps), 1, squeeze=False)[:, 0], steps, strict=True):
        targets = _targets_in(step["runs"])
        key = "ttft" if step.get("stream") else "latency"
        width = 0.8 / len(pcts)
        top = 0.0
        ticks: list[str] = []
        for i, target in enumerate(targets):
            found = _timeline_entry(step, target)
            if found is None:
                ticks.append(_label(target, results))
                continue
            entry, reps = found
            summary = entry["summary"]
            values = [_nan((summary.get(key) or {}).get(f"{p}_ms")) for p, _ in pcts]
            color = _color(target, targets)
            for j, ((p, alpha), value) in enumerate(zip(pcts, values, strict=True)):
                x = i + (j - 1) * width
                ax.bar(x, value, width * 0.95, color=color, alpha=alpha, edgecolor=color)
                if not math.isnan(value):
                    ax.annotate(
                        f"{p.upper()}\n{_ms(value)}",
                        (x, value),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        fontsize=7.5,
                    )
                    top = max(top, value)
            success = summary.get("success_ratio")
            ok = "-" if success is None else f"{success * 100:.2f} %"
            ticks.append(f"{_label(target, results)}\nsuccess {ok}" + (f", {reps} runs pooled" if reps > 1 else ""))
        ax.set_xticks(range(len(targets)))
        ax.set_xticklabels(ticks)
        ax.set_xlim(-0.6, len(targets) - 0.4)
        what = "time to first token" if key == "ttft" else "latency"
        _ms_axis(ax, f"{what}, ms (log scale)")
        if top:
            ax.set_ylim(top=top * 4)
        rate = float(step["runs"][0]["rate"])
        ax.set_title(f"{run}: {step['name']} ({_mode(step)}) at {rate:g} RPS: {what} P50 / P95 / P99 per target")
        ax.grid(axis="x", visible=False)
    _footer(fig, results, manifest)
    return fig


# -- entry points -------------------------------------------------------------------------

_FIGURES: Final[tuple[tuple[str, Callable[[Mapping[str, Any], Mapping[str, Any], str], Figure | None]], ...]] = (
    ("latency", sweep_latency_figure),
    ("throughput", sweep_throughput_figure),
    ("timeline", timeline_figure),
    ("percentiles", percentiles_figure),
)


def plot_run(run_dir: Path, out: Path, name: str | None = None) -> list[Path]:
    """Write every plot that ``run_dir``'s results support into ``out``; returns the files written."""
    results, manifest = _load(run_dir)
    run = name or (run_dir if run_dir.is_dir() else run_dir.parent).resolve().name
    written = []
    with _style():
        for suffix, make in _FIGURES:
            fig = make(results, manifest, run)
            if fig is not None:
                written.append(_save(fig, out / f"{run}-{suffix}.png"))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description="PNG plots of a benchmark run.")
    parser.add_argument("run_dir", type=Path, help="a run directory (or its results.json)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: docs/img)")
    parser.add_argument("--name", help="file name prefix (default: the run directory's name)")
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.run_dir, args.out, args.name)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot plot {args.run_dir}: {exc!r}", file=sys.stderr)
        return 2
    if not written:
        print(f"{args.run_dir}: no sweep or fixed-rate step to plot", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
