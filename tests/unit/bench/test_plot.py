"""PNG plots from synthetic results in the shape ``bench.run`` writes: sweeps, a timeline, fixed steps."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import plot
from bench.aggregate import pool_runs
from bench.loadgen import OUTCOMES, LoadResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def entry(
    target: str,
    rate: float,
    latency_us: int,
    seconds: int = 2,
    rejected: int = 0,
    late: int = 0,
    stream: bool = False,
) -> dict[str, Any]:
    """One measured run: ``rate`` requests per second for ``seconds``, some rejected or late."""
    result = LoadResult(seconds)
    per_second = int(rate)
    for second in range(seconds):
        ok = per_second - rejected - late
        result.offered += per_second
        result.timeline[second][0] += per_second
        for name, n in (("completed", ok), ("late", late), ("rejected", rejected)):
            index = OUTCOMES.index(name)
            result.counts[index] += n
            result.timeline[second][index + 1] += n
        for i in range(ok + late):
            result.latency[second].record(latency_us * (second + 1) + i)
            if stream:
                result.ttft.record(latency_us // 2 + i)
        for _ in range(rejected):
            result.reject_latency.record(900)
    group = "mock" if target == "direct" else target
    return {
        "target": target,
        "server_group": group,
        "rate": float(rate),
        "spec": {"duration_s": float(seconds), "warmup_s": 1.0, "stream": stream},
        "summary": result.summary(float(seconds), stream),
        "resources": {group: {"cpu_s": 0.1, "cpu_pct_mean": 10.0}, "other_cpu_pct": 2.0},
        "cpu_ms_per_request": {group: 1.0},
        "raw": result.to_dict(),
    }


def sweep_results() -> dict[str, Any]:
    runs = []
    for target, latency_us, fails_at in (("direct", 500, None), ("gateway", 2000, 40), ("portkey", 3000, 10)):
        for rate in (10, 20, 40):
            e = entry(target, rate, latency_us * (20 if rate == fails_at else 1), late=2 if rate == fails_at else 0)
            e["pass"] = rate != fails_at
            if target == "direct" and rate == 40:
                e["resources"]["other_cpu_pct"] = 40.0  # a noisy window is ringed
            runs.append(e)
            if not e["pass"]:
                break
    step = {
        "name": "sweep-buffered-small",
        "payload": "small",
        "stream": False,
        "kind": "sweep",
        "timeline": False,
        "runs": runs,
        "comparison": [],
        "sweep": {"p99_bound_ms": 50.0, "min_success": 0.999},
        "knee_rps": {"gateway": 20.0, "portkey": None, "direct": 40.0},
    }
    targets = {"direct": {"status": "ok"}, "gateway": {"status": "ok"}, "portkey": {"status": "ok", "version": "1.2"}}
    return {"profile": "sweep-peers", "created": "2026-01-01T00:00:00Z", "targets": targets, "steps": [step]}


def overload_results() -> dict[str, Any]:
    steps = []
    for name, rate, rejected in (("overload-2x", 40, 25), ("recovery-0.5x", 10, 0)):
        runs = [entry("direct", rate, 700, seconds=3), entry("gateway", rate, 9000, seconds=3, rejected=rejected)]
        steps.append(
            {
                "name": name,
                "payload": "small",
                "stream": False,
                "kind": "fixed",
                "timeline": True,
                "runs": runs,
                "pooled": {e["target"]: pool_runs([e]) for e in runs},
                "comparison": [],
            }
        )
    return {"profile": "overload", "targets": {}, "steps": steps}


def fixed_results() -> dict[str, Any]:
    steps = []
    for name, stream in (("buffered-small", False), ("sse-small", True)):
        runs = [entry(t, 10, us, stream=stream) for t, us in (("direct", 800), ("gateway", 2500), ("litellm", 90000))]
        pooled = {t: pool_runs([e for e in runs if e["target"] == t]) for t in ("direct", "gateway", "litellm")}
        steps.append(
            {
                "name": name,
                "payload": "small",
                "stream": stream,
                "kind": "fixed",
                "timeline": False,
                "runs": runs,
                "pooled": pooled,
                "comparison": [],
            }
        )
    return {"profile": "peers", "targets": {}, "steps": steps}


def write_run(root: Path, name: str, results: dict[str, Any], manifest: dict[str, Any] | None = None) -> Path:
    run = root / name
    run.mkdir()
    (run / "results.json").write_bytes(orjson.dumps(results))
    if manifest is not None:
        (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert len(data) > 20_000, f"{path.name} is suspiciously small ({len(data)} bytes)"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == plot.SIZE[0] * plot.DPI and height >= 500
    assert b"Software" not in data and b"Matplotlib version" not in data, "the PNG embeds the matplotlib version"


MANIFEST = {
    "command": ["python", "-m", "bench.run", "sweep-peers"],
    "git": {"commit": "0123456789abcdef", "dirty": True},
    "machine": {"cpu_model": "Test CPU", "usable_cores": 2},
    "gateway": {"workers": 2},
}


def test_a_sweep_gives_latency_and_throughput_plots_named_after_the_run(tmp_path: Path) -> None:
    run = write_run(tmp_path, "sweep-peers-x", sweep_results(), MANIFEST)
    written = plot.plot_run(run, tmp_path / "img")
    assert [p.name for p in written] == ["sweep-peers-x-latency.png", "sweep-peers-x-throughput.png"]
    for path in written:
        assert_png(path)


def test_an_overload_run_gives_a_timeline_across_the_step_boundary(tmp_path: Path) -> None:
    manifest = {
        "profile": {
            "settings": {"steps": [{"name": "overload-2x"}, {"name": "recovery-0.5x", "follows_previous": True}]}
        }
    }
    run = write_run(tmp_path, "overload", overload_results(), manifest)
    written = plot.plot_run(run, tmp_path / "img")
    assert [p.name for p in written] == ["overload-timeline.png"]
    assert_png(written[0])


def test_fixed_steps_without_a_timeline_give_a_percentile_chart(tmp_path: Path) -> None:
    run = write_run(tmp_path, "peers", fixed_results())
    written = plot.plot_run(run, tmp_path / "img")
    assert [p.name for p in written] == ["peers-percentiles.png"]
    assert_png(written[0])


def test_the_same_results_give_the_same_bytes(tmp_path: Path) -> None:
    run = write_run(tmp_path, "sweep", sweep_results(), MANIFEST)
    first = [p.read_bytes() for p in plot.plot_run(run, tmp_path / "a")]
    second = [p.read_bytes() for p in plot.plot_run(run, tmp_path / "b")]
    assert first == second


def test_the_command_line_writes_into_out_and_reports_nothing_to_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path, "sweep", sweep_results())
    assert plot.main([str(run / "results.json"), "--out", str(tmp_path / "img")]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "img" / f"sweep-{k}.png") for k in ("latency", "throughput")
    ]
    empty = write_run(tmp_path, "empty", {"profile": "smoke", "steps": []})
    assert plot.main([str(empty), "--out", str(tmp_path / "img2")]) == 1
    assert not (tmp_path / "img2").exists()
    assert plot.main([str(tmp_path / "missing"), "--out", str(tmp_path / "img3")]) == 2
