"""The smoke profile end to end: real mock, real gateway, both targets, every output file.

It checks that the harness's outputs are complete and consistent, never how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.compare import main as compare_main
from bench.loadgen import OUTCOMES
from bench.stats import PERCENTILES

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "smoke", "--out", str(out), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "# Tollway benchmark: smoke" in done.stdout
    return out


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def test_the_manifest_records_every_input(smoke_run: Path) -> None:
    manifest = read(smoke_run / "manifest.json")
    assert manifest["schema"] == "tollway-bench-manifest/1"
    assert len(manifest["git"]["commit"]) == 40
    assert isinstance(manifest["git"]["dirty"], bool)
    assert manifest["packages"]["tollway"] and manifest["packages"]["httptools"]
    assert manifest["machine"]["cpu_model"] and manifest["machine"]["cores"] >= 1
    assert manifest["profile"]["name"] == "smoke" and len(manifest["profile"]["sha256"]) == 64
    assert manifest["gateway"]["config"]["models"][0]["name"] == "bench-v1"
    assert manifest["gateway"]["workers"] == 1
    assert manifest["mock"]["faults"] == "chunks=3"
    assert len(manifest["payloads"]["small"]["sha256"]) == 64
    assert manifest["loadgen"]["procs"] == 2 and manifest["loadgen"]["client"] == "http1"
    assert manifest["loadgen"]["client_version"].startswith("httptools ")
    assert manifest["finished"]
    assert (smoke_run / "llm-router.yml").is_file()


def test_the_manifest_holds_no_secret(smoke_run: Path) -> None:
    text = (smoke_run / "manifest.json").read_text() + (smoke_run / "llm-router.yml").read_text()
    assert "tw-bench-" not in text
    assert "mock-bench-" not in text


def test_every_step_has_direct_and_gateway_runs_whose_counts_add_up(smoke_run: Path) -> None:
    results = read(smoke_run / "results.json")
    assert results["schema"] == "tollway-bench-results/1"
    assert [s["name"] for s in results["steps"]] == ["buffered-small", "sse-small"]
    for step in results["steps"]:
        assert {run["target"] for run in step["runs"]} == {"direct", "gateway"}
        for run in step["runs"]:
            s = run["summary"]
            assert s["offered"] == 30
            assert sum(s[k] for k in OUTCOMES) == s["offered"]
            assert s["accounted"] is True
            assert s["sent"] == s["offered"] - s["dropped"]
            assert s["failed"] == 0, s["errors"]
            assert s["completed"] + s["late"] >= 1
            assert s["latency"]["count"] == s["completed"] + s["late"]
            assert sum(row["offered"] for row in s["timeline"]) == s["offered"]
            assert (s["ttft"] is not None) is step["stream"]
            assert run["raw"]["counts"]["completed"] == s["completed"]
            assert run["resources"]["gateway"]["processes"] >= 1
            assert run["resources"]["gateway"]["rss_mib_max_process"] > 0
            assert set(run["cpu_ms_per_request"]) == {"gateway", "mock", "loadgen"}


def test_each_step_pools_its_runs_per_target(smoke_run: Path) -> None:
    results = read(smoke_run / "results.json")
    assert results["repeat"] == 1
    assert results["targets"] == {"direct": {"status": "ok"}, "gateway": {"status": "ok"}}
    for step in results["steps"]:
        assert set(step["pooled"]) == {"direct", "gateway"}
        for target, pooled in step["pooled"].items():
            (run,) = [r for r in step["runs"] if r["target"] == target]
            assert pooled["repetitions"] == 1
            assert pooled["summary"]["offered"] == run["summary"]["offered"]
            assert pooled["summary"]["completed"] == run["summary"]["completed"]


def test_gateway_overhead_is_reported_as_difference_and_ratio(smoke_run: Path) -> None:
    results = read(smoke_run / "results.json")
    for step in results["steps"]:
        (cmp,) = step["comparison"]
        sections = ["latency", "ttft"] if step["stream"] else ["latency"]
        for section in sections:
            assert set(cmp[section]) == {k for k, _ in PERCENTILES}
            for entry in cmp[section].values():
                assert set(entry) == {"added_ms", "ratio"}
        assert cmp["throughput_ratio"] is not None
    cold = results["cold_start"]
    assert cold["gateway"]["first_response_s"] >= cold["gateway"]["listening_s"] > 0
    assert cold["mock"]["first_response_s"] > 0


def test_the_summary_has_a_table_per_step(smoke_run: Path) -> None:
    summary = (smoke_run / "summary.md").read_text()
    for heading in ("## Cold start", "## buffered-small", "## sse-small"):
        assert heading in summary
    assert "| latency p99 ms |" in summary
    assert "| TTFT p50 ms |" in summary
    assert "tollway - direct" in summary and "tollway ÷ direct" in summary


def test_a_run_compared_with_itself_as_baseline_passes(smoke_run: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "smoke.json"
    assert compare_main([str(smoke_run), "--write-baseline", str(baseline)]) == 0
    assert read(baseline)["metrics"]
    assert compare_main([str(smoke_run), "--baseline", str(baseline), "--margin", "0.25"]) == 0
