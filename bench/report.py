"""The Markdown summary of a run: one table per step, direct beside gateway.

Gateway overhead is shown two ways per percentile: the difference of the two percentiles
(``gateway - direct``) and their ratio (``gateway ÷ direct``). The difference of percentiles
is not a percentile of per-request overhead, which no external measurement can observe, so
the ratio is always printed next to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from bench.stats import PERCENTILES

__all__ = ["render_summary"]

_LAG_WARN_MS: Final = 2.0
_OTHER_CPU_WARN_PCT: Final = 10.0


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}"


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _header(manifest: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    git = manifest.get("git", {})
    machine = manifest.get("machine", {})
    packages = manifest.get("packages", {})
    load = manifest.get("loadgen", {})
    mock = manifest.get("mock", {})
    profile = manifest.get("profile", {})
    command = " ".join(manifest.get("command", []))
    commit = (git.get("commit") or "unknown")[:12]
    rows = [
        ["Reproduce", f"`{command}`"],
        ["Commit", f"`{commit}`" + (" (dirty tree)" if git.get("dirty") else "")],
        [
            "Machine",
            f"{machine.get('cpu_model')}, {machine.get('usable_cores')} cores, "
            f"Linux {machine.get('kernel')} {machine.get('arch')}, Python {machine.get('python')}",
        ],
        [
            "Gateway",
            f"{manifest.get('gateway', {}).get('workers')} worker(s); tollway {packages.get('tollway')}, "
            f"uvicorn {packages.get('uvicorn')}, httpx {packages.get('httpx')}",
        ],
        ["Mock", f"{mock.get('workers')} worker(s), faults `{mock.get('faults') or 'none'}`"],
        [
            "Load generator",
            f"open-loop, {load.get('client')} client ({load.get('client_version')}) on {load.get('loop')}, "
            f"{load.get('procs')} process(es), "
            f"warm-up {load.get('warmup_s')} s, window {load.get('duration_s')} s, timeout {load.get('timeout_s')} s",
        ],
        ["Profile", f"`{profile.get('file')}` sha256 `{str(profile.get('sha256'))[:12]}`"],
        ["Run", f"{results.get('created')} → {results.get('finished')}"],
    ]
    lines = [f"# Tollway benchmark: {results.get('profile')}", ""]
    description = profile.get("settings", {}).get("description")
    if description:
        lines += [description.strip(), ""]
    lines += _table(["", ""], rows)
    cold = results.get("cold_start", {})
    lines += ["", "## Cold start (process start → first 2xx chat completion)", ""]
    lines += _table(
        ["process", "listening s", "first 2xx s"],
        [[name, _fmt(c.get("listening_s"), 3), _fmt(c.get("first_response_s"), 3)] for name, c in cold.items()],
    )
    return lines


def _resource(entry: Mapping[str, Any] | None, group: str, key: str) -> Any:
    if entry is None:
        return None
    value = entry.get("resources", {}).get(group)
    return value.get(key) if isinstance(value, dict) else None


def _counts(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return "-"
    return f"{s['late']} / {s['rejected']} / {s['failed']} / {s['timed_out']} / {s['dropped']}"


def _fixed_rows(direct: Mapping[str, Any] | None, gateway: Mapping[str, Any] | None, cmp: Any) -> list[list[Any]]:
    ds = direct["summary"] if direct else None
    gs = gateway["summary"] if gateway else None

    def both(fn: Any) -> list[Any]:
        return [fn(ds) if ds else "-", fn(gs) if gs else "-"]

    rows: list[list[Any]] = [
        ["offered / sent", *both(lambda s: f"{s['offered']} / {s['sent']}"), "", ""],
        ["completed in window", *both(lambda s: s["completed"]), "", ""],
        ["late / rejected / failed / timed out / dropped", _counts(ds), _counts(gs), "", ""],
        ["success % (2xx of offered)", *both(lambda s: _pct(s["success_ratio"])), "", ""],
        [
            "throughput RPS (completed in window)",
            *both(lambda s: _fmt(s["throughput_rps"], 1)),
            "",
            _fmt(cmp["throughput_ratio"], 3) if cmp else "-",
        ],
    ]
    sections = [("latency", "latency")]
    if (ds and ds.get("ttft")) or (gs and gs.get("ttft")):
        sections.append(("ttft", "TTFT"))
    for key, label in sections:
        for pkey, _ in PERCENTILES:
            diff = cmp[key][pkey] if cmp and cmp.get(key) else {"added_ms": None, "ratio": None}
            added = diff["added_ms"]
            rows.append(
                [
                    f"{label} {pkey} ms",
                    *both(lambda s, k=key, p=pkey: _fmt((s.get(k) or {}).get(f"{p}_ms"), 3)),
                    "-" if added is None else f"{added:+.3f}",
                    "-" if diff["ratio"] is None else f"{diff['ratio']:.2f}x",
                ]
            )
    rows += [
        [
            "gateway CPU % mean / max (100 = one core)",
            *(
                f"{_fmt(_resource(e, 'gateway', 'cpu_pct_mean'), 1)} / "
                f"{_fmt(_resource(e, 'gateway', 'cpu_pct_max'), 1)}"
                for e in (direct, gateway)
            ),
            "",
            "",
        ],
        [
            "CPU ms per request: gateway / mock / load generator",
            *(_cpu_ms(e) for e in (direct, gateway)),
            "",
            "",
        ],
        [
            "gateway RSS MiB max: all processes / largest",
            *(
                f"{_fmt(_resource(e, 'gateway', 'rss_mib_max_total'), 1)} / "
                f"{_fmt(_resource(e, 'gateway', 'rss_mib_max_process'), 1)}"
                for e in (direct, gateway)
            ),
            "",
            "",
        ],
        ["load generator send lag p99 ms", *both(lambda s: _fmt(s["send_lag"]["p99_ms"], 3)), "", ""],
        [
            "other CPU on the machine %",
            *(_fmt((e or {}).get("resources", {}).get("other_cpu_pct"), 1) for e in (direct, gateway)),
            "",
            "",
        ],
    ]
    return rows


def _cpu_ms(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "-"
    cpu = entry.get("cpu_ms_per_request", {})
    return " / ".join(_fmt(cpu.get(k), 3) for k in ("gateway", "mock", "loadgen"))


def _warnings(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for e in entries:
        s = e["summary"]
        label = f"{e['target']} @ {e['rate']:g} RPS"
        if not s.get("accounted", True):
            out.append(f"- **{label}: outcomes do not add up to offered requests (harness bug).**")
        lag = s["send_lag"].get("p99_ms")
        if lag is not None and lag > _LAG_WARN_MS:
            out.append(f"- {label}: load generator send lag p99 {lag:.1f} ms; latency includes generator delay.")
        other = e.get("resources", {}).get("other_cpu_pct")
        if other is not None and other > _OTHER_CPU_WARN_PCT:
            out.append(f"- {label}: other processes used {other:.0f} % CPU during the window; numbers are noisy.")
        if s.get("errors"):
            errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items())
            out.append(f"- {label}: failures: {errors}.")
    return out


def _sweep(step: Mapping[str, Any]) -> list[str]:
    rows = []
    for e in step["runs"]:
        s = e["summary"]
        lat = s["latency"]
        rows.append(
            [
                e["target"],
                _fmt(float(e["rate"]), 0),
                _fmt(s["throughput_rps"], 1),
                _pct(s["success_ratio"]),
                _fmt(lat["p50_ms"], 3),
                _fmt(lat["p99_ms"], 3),
                _fmt(lat["p99.9_ms"], 3),
                _fmt(lat["max_ms"], 3),
                _fmt(_resource(e, "gateway", "cpu_pct_mean"), 1),
                "yes" if e.get("pass") else "**no**",
            ]
        )
    header = ["target", "offered RPS", "throughput RPS", "success %", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
    lines = _table([*header, "gateway CPU %", "pass"], rows)
    sweep = step.get("sweep", {})
    knees = step.get("knee_rps", {})
    bound = f"p99 ≤ {sweep.get('p99_bound_ms')} ms and success ≥ {_pct(sweep.get('min_success'), 1)} %"
    all_passed = {target: all(e.get("pass") for e in step["runs"] if e["target"] == target) for target in knees}
    parts = []
    for target, knee in knees.items():
        if not knee:
            parts.append(f"{target} below the lowest rate")
        elif all_passed[target]:
            parts.append(f"{target} ≥ {knee:.0f} (the highest rate tried)")
        else:
            parts.append(f"{target} {knee:.0f}")
    knee_text = ", ".join(parts)
    lines += ["", f"Knee (highest rate with {bound}): {knee_text} RPS."]
    return lines


def _timeline(entry: Mapping[str, Any]) -> list[str]:
    keys = ["offered", "completed", "late", "rejected", "failed", "timed_out", "dropped", "p50_ms", "p99_ms", "max_ms"]
    rows = [[row["t"], *(_fmt(row.get(k), 3) for k in keys)] for row in entry["summary"]["timeline"]]
    return [f"Per second of intended send, {entry['target']} @ {entry['rate']:g} RPS:", "", *_table(["s", *keys], rows)]


def _profile(entry: Mapping[str, Any]) -> list[str]:
    prof = entry.get("py_spy") or {}
    title = f"Where the gateway's time goes (py-spy, {entry['target']} @ {entry['rate']:g} RPS"
    if not prof.get("file"):
        return [f"{title}): profiling failed: {prof.get('error', 'no output')}"]
    lines = [f"{title}, {prof['samples']} samples, raw stacks in `{prof['file']}`):", ""]
    rows = []
    for i in range(max(len(prof["by_package"]), len(prof["self"]))):
        cells = []
        for key in ("by_package", "self", "inclusive"):
            item = prof[key][i] if i < len(prof[key]) else None
            cells.append(f"{item['name']} {item['pct']} %" if item else "")
        rows.append(cells)
    lines += _table(["self time by package", "self time by function", "inclusive, Tollway functions"], rows[:12])
    lines += ["", "This run was profiled: its latency is higher than an unprofiled run's."]
    return lines


def render_summary(manifest: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    lines = _header(manifest, results)
    for step in results.get("steps", []):
        mode = "SSE" if step["stream"] else "buffered"
        lines += ["", f"## {step['name']}: payload `{step['payload']}`, {mode}", ""]
        if step["kind"] == "sweep":
            lines += _sweep(step)
        else:
            by_target = {e["target"]: e for e in step["runs"]}
            rate = next(iter(by_target.values()))["rate"] if by_target else 0
            cmp = step["comparison"][0] if step["comparison"] else None
            lines += [f"Offered rate: {rate:g} RPS.", ""]
            rows = _fixed_rows(by_target.get("direct"), by_target.get("gateway"), cmp)
            lines += _table(["", "direct", "gateway", "gateway - direct", "gateway ÷ direct"], rows)
            if step.get("timeline"):
                for entry in step["runs"]:
                    lines += ["", *_timeline(entry)]
        for entry in step["runs"]:
            if "py_spy" in entry:
                lines += ["", *_profile(entry)]
        warnings = _warnings(step["runs"])
        if warnings:
            lines += ["", *warnings]
    lines += [
        "",
        "`gateway - direct` is the difference of the two percentiles, not a percentile of per-request "
        "overhead; read it with the ratio. Latency runs from each request's intended send time.",
        "",
    ]
    return "\n".join(lines)
