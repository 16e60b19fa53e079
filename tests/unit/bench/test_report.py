"""The summary's tables, from synthetic results: every target beside direct, difference and ratio."""

from __future__ import annotations

from typing import Any

from bench.aggregate import comparison, pool_runs
from bench.loadgen import LoadResult
from bench.report import render_summary


def entry(target: str, latency_us: int, rejected: int = 0) -> dict[str, Any]:
    result = LoadResult(1)
    result.offered = 10 + rejected
    result.counts[0] = 10
    result.counts[2] = rejected
    result.timeline[0][0] = result.offered
    for _ in range(10):
        result.latency[0].record(latency_us)
    for _ in range(rejected):
        result.reject_latency.record(500)
    if rejected:
        result.status[503] = rejected
        result.codes["503 overloaded"] = rejected
    group = "mock" if target == "direct" else target
    return {
        "target": target,
        "server_group": group,
        "rate": 10.0,
        "spec": {"duration_s": 1.0, "stream": False},
        "summary": result.summary(1.0, False),
        "resources": {
            group: {"cpu_s": 0.1, "cpu_pct_mean": 10.0, "cpu_pct_max": 12.0},
            "other_cpu_pct": 40.0,
            "steal_pct": 30.0 if target == "portkey" else 1.0,
            "steal_pct_max": 55.0 if target == "portkey" else 2.0,
        },
        "cpu_ms_per_request": {group: 1.0, "mock": 0.2, "loadgen": 0.3},
        "raw": result.to_dict(),
    }


def results() -> dict[str, Any]:
    runs = [entry("direct", 1000), entry("gateway", 3000), entry("portkey", 5000, rejected=2)]
    pooled = {e["target"]: pool_runs([e]) for e in runs}
    d = pooled["direct"]["summary"]
    step = {
        "name": "buffered-small",
        "payload": "small",
        "stream": False,
        "kind": "fixed",
        "timeline": False,
        "runs": runs,
        "pooled": pooled,
        "comparison": [comparison(t, 10.0, d, pooled[t]["summary"], False) for t in ("gateway", "portkey")],
    }
    targets: dict[str, dict[str, Any]] = {"direct": {"status": "ok"}, "gateway": {"status": "ok"}}
    targets["portkey"] = {"status": "ok", "version": "1.15.2", "workers": 1}
    targets["litellm"] = {"status": "failed", "reason": "not installed"}
    return {"profile": "peers", "targets": targets, "cold_start": {}, "steps": [step]}


def test_every_target_gets_a_column_and_a_difference_and_ratio_against_direct() -> None:
    text = render_summary({"command": ["python", "-m", "bench.run", "peers"]}, results())
    header = next(line for line in text.splitlines() if line.startswith("|  | direct"))
    assert header.split(" | ")[1:4] == ["direct", "tollway", "portkey"]
    assert "tollway - direct" in header and "tollway ÷ direct" in header and "portkey ÷ direct" in header
    p50 = next(line for line in text.splitlines() if line.startswith("| latency p50 ms"))
    assert "3.00x" in p50 and "5.00x" in p50


def test_failed_peers_rejections_and_noise_are_reported() -> None:
    text = render_summary({}, results())
    assert "| litellm | failed | not installed |" in text
    assert "| rejected (429/503) answer time" in text
    assert "other processes used 40 % CPU" in text
    assert "- portkey @ 10 RPS: non-2xx answers by error code: 503 overloaded: 2." in text
    assert "- portkey @ 10 RPS: the hypervisor stole 30 % CPU during the window; numbers are noisy." in text
    assert "- tollway @ 10 RPS: the hypervisor stole" not in text, "1 % is below the warning"
    steal = next(line for line in text.splitlines() if line.startswith("| hypervisor steal %"))
    assert "1.0 / 2.0" in steal and "30.0 / 55.0" in steal


def test_header_names_the_server_and_upstream_client_the_run_used() -> None:
    packages = {"tollway": "0.1.0", "uvicorn": "0.54.0", "granian": "2.8.7", "aiohttp": "3.13.2", "httpx": "0.28.1"}
    packages["httptools"] = "0.7.1"
    granian = {"packages": packages, "gateway": {"workers": 2, "server": "granian", "config": {}}}
    line = next(x for x in render_summary(granian, results()).splitlines() if x.startswith("| Gateway"))
    assert "granian 2.8.7" in line and "upstream client h1 httptools 0.7.1" in line and "uvicorn" not in line
    aiohttp = {"packages": packages, "gateway": {"workers": 2, "config": {"httpClient": "aiohttp"}}}
    line = next(x for x in render_summary(aiohttp, results()).splitlines() if x.startswith("| Gateway"))
    assert "upstream client aiohttp 3.13.2" in line
    httpx = {"packages": packages, "gateway": {"workers": 2, "config": {"httpClient": "httpx"}}}
    line = next(x for x in render_summary(httpx, results()).splitlines() if x.startswith("| Gateway"))
    assert "uvicorn 0.54.0" in line and "upstream client httpx 0.28.1" in line


def step_title(data: dict[str, Any]) -> str:
    return next(x for x in render_summary({}, data).splitlines() if x.startswith("## buffered-small"))


def test_a_step_heading_names_the_apis_called_unless_both_are_chat_completions() -> None:
    data = results()
    assert step_title(data) == "## buffered-small: payload `small`, buffered"
    data["steps"][0].update(endpoint="chat", direct_endpoint="chat")
    assert step_title(data) == "## buffered-small: payload `small`, buffered"
    data["steps"][0].update(direct_endpoint="gemini")
    assert step_title(data).endswith(
        "gateway `POST /v1/chat/completions`, direct `POST /v1beta/models/mock-gemini-flash:generateContent`"
    )
    data["steps"][0].update(endpoint="messages", direct_endpoint="messages")
    assert step_title(data).endswith("gateway `POST /v1/messages`, direct `POST /v1/messages`")
