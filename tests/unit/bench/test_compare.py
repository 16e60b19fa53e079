"""The regression guard's metrics and verdicts, and the sweep's knee rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.compare import extract_metrics, find_regressions, main
from bench.run import passes, sweep_knee


def fixed_step(p50_ratio: float, throughput_ratio: float, success: float) -> dict[str, Any]:
    latency = {p: {"added_ms": 1.0, "ratio": p50_ratio} for p in ("p50", "p95", "p99", "p99.9", "max")}
    return {
        "name": "buffered-small",
        "kind": "fixed",
        "comparison": [
            {
                "rate": 500.0,
                "latency": latency,
                "ttft": None,
                "throughput_ratio": throughput_ratio,
                "success_ratio": {"direct": 1.0, "gateway": success},
            }
        ],
    }


def results(p50_ratio: float = 2.0, throughput_ratio: float = 1.0, success: float = 1.0) -> dict[str, Any]:
    sweep = {"name": "sweep", "kind": "sweep", "knee_rps": {"direct": 1000.0, "gateway": 500.0}}
    return {"profile": "fixed-500", "steps": [fixed_step(p50_ratio, throughput_ratio, success), sweep]}


def test_metrics_are_ratios_to_the_same_runs_direct_baseline() -> None:
    metrics = extract_metrics(results())
    assert metrics["buffered-small@500/latency_p50_ratio"] == {"value": 2.0, "better": "lower"}
    assert metrics["buffered-small@500/throughput_ratio"] == {"value": 1.0, "better": "higher"}
    assert metrics["buffered-small@500/success"] == {"value": 1.0, "better": "success"}
    assert metrics["sweep/knee_ratio"] == {"value": 0.5, "better": "higher"}
    assert not any("ttft" in key for key in metrics)


@pytest.mark.parametrize(
    ("current", "regressed"),
    [
        (results(p50_ratio=2.4), []),
        (results(p50_ratio=2.6), ["buffered-small@500/latency_p50_ratio"]),
        (results(throughput_ratio=0.8), []),
        (results(throughput_ratio=0.7), ["buffered-small@500/throughput_ratio"]),
        (results(success=0.9995), []),
        (results(success=0.99), ["buffered-small@500/success"]),
    ],
)
def test_a_metric_regresses_only_beyond_the_margin(current: dict[str, Any], regressed: list[str]) -> None:
    found, missing, lines = find_regressions(extract_metrics(results()), extract_metrics(current), 0.25)
    assert [k for k in found if "p95" not in k and "p99" not in k] == regressed
    assert missing == []
    assert len(lines) == len(extract_metrics(results()))


def test_the_command_exits_1_on_regression_and_2_on_a_missing_metric(tmp_path: Path) -> None:
    base_run, slow_run, short_run = tmp_path / "base.json", tmp_path / "slow.json", tmp_path / "short.json"
    base_run.write_text(json.dumps(results()))
    slow_run.write_text(json.dumps(results(p50_ratio=4.0)))
    short = results()
    short["steps"] = short["steps"][:1]
    short_run.write_text(json.dumps(short))
    baseline = tmp_path / "baseline.json"
    assert main([str(base_run), "--write-baseline", str(baseline)]) == 0
    assert main([str(base_run), "--baseline", str(baseline)]) == 0
    assert main([str(slow_run), "--baseline", str(baseline), "--margin", "0.25"]) == 1
    assert main([str(short_run), "--baseline", str(baseline)]) == 2
    other = results()
    other["profile"] = "sse-200"
    other_run = tmp_path / "other.json"
    other_run.write_text(json.dumps(other))
    assert main([str(other_run), "--baseline", str(baseline)]) == 2


def test_the_knee_is_the_last_passing_rate_before_the_first_failure() -> None:
    assert sweep_knee([(400, True), (200, True), (600, False), (800, True)]) == 400
    assert sweep_knee([(200, False)]) is None
    assert sweep_knee([(200, True), (400, True)]) == 400


def test_a_sweep_point_needs_both_the_success_floor_and_the_p99_bound() -> None:
    good = {"success_ratio": 0.9995, "latency": {"p99_ms": 40.0}}
    assert passes(good, 50.0, 0.999)
    assert not passes({**good, "success_ratio": 0.99}, 50.0, 0.999)
    assert not passes({**good, "latency": {"p99_ms": 60.0}}, 50.0, 0.999)
    assert not passes({"success_ratio": None, "latency": {"p99_ms": None}}, 50.0, 0.999)


def test_only_tollway_is_guarded_not_its_peers() -> None:
    data = results()
    peer = dict(data["steps"][0]["comparison"][0], target="portkey")
    peer["throughput_ratio"] = 0.1
    data["steps"][0]["comparison"].append(peer)
    assert extract_metrics(data) == extract_metrics(results())
