"""The Markdown summary of a run: one table per step, direct beside gateway.

Gateway overhead is shown two ways per percentile: the difference of the two percentiles
(``gateway - direct``) and their ratio (``gateway ÷ direct``). The difference of percentiles
is not a percentile of per-request overhead, which no external measurement can observe, so
the ratio is always printed next to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from bench.endpoints import ENDPOINTS
from bench.servers import PROVIDER_MODELS
from bench.stats import PERCENTILES

__all__ = ["render_summary"]

_LAG_WARN_MS: Final = 2.0
_OTHER_CPU_WARN_PCT: Final = 10.0
_STEAL_WARN_PCT: Final = 5.0


def _label(target: str) -> str:
    """Report names: the ``gateway`` target is Tollway, beside its peers."""
    return "tollway" if target == "gateway" else target


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


def _gateway_line(gateway: Mapping[str, Any], packages: Mapping[str, Any]) -> str:
    """Workers, and the versions of the ASGI server and upstream client this run actually used."""
    server = gateway.get("server") or "uvicorn"
    config = gateway.get("config")
    client = (config.get("httpClient") if isinstance(config, Mapping) else None) or "h1"
    library = "httptools" if client == "h1" else client  # h1 is Tollway's own client on httptools
    version = f"{library} {packages.get(library)}" if client == "h1" else str(packages.get(library))
    return (
        f"{gateway.get('workers')} worker(s); tollway {packages.get('tollway')}, "
        f"{server} {packages.get(server)}, upstream client {client} {version}"
    )


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
        ["Gateway", _gateway_line(manifest.get("gateway", {}), packages)],
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


def _group(entry: Mapping[str, Any]) -> str:
    """The process group that served ``entry``: the mock for direct, else the target itself."""
    return str(entry.get("server_group") or ("mock" if entry["target"] == "direct" else entry["target"]))


def _served(entry: Mapping[str, Any], key: str, digits: int = 1) -> str:
    return _fmt(_resource(entry, _group(entry), key), digits)


def _reject_times(s: Mapping[str, Any]) -> str:
    if not s["rejected"]:
        return "-"
    return " / ".join(_fmt(s["reject_latency"][f"{k}_ms"], 3) for k in ("p50", "p99", "max"))


def _cpu_ms(entry: Mapping[str, Any]) -> str:
    cpu = entry.get("cpu_ms_per_request", {})
    return " / ".join(_fmt(cpu.get(k), 3) for k in (_group(entry), "mock", "loadgen"))


_PLAIN_ROWS: Final = (
    ("offered / sent", lambda e: f"{e['summary']['offered']} / {e['summary']['sent']}"),
    ("completed in window", lambda e: e["summary"]["completed"]),
    ("late / rejected / failed / timed out / dropped", lambda e: _counts(e["summary"])),
    ("success % (2xx of offered)", lambda e: _pct(e["summary"]["success_ratio"])),
)
_RESOURCE_ROWS: Final = (
    (
        "server CPU % mean / max (100 = one core; direct: the mock)",
        lambda e: f"{_served(e, 'cpu_pct_mean')} / {_served(e, 'cpu_pct_max')}",
    ),
    ("CPU ms per request: server / mock / load generator", _cpu_ms),
    (
        "server RSS MiB max: all processes / largest",
        lambda e: f"{_served(e, 'rss_mib_max_total')} / {_served(e, 'rss_mib_max_process')}",
    ),
    ("load generator send lag p99 ms", lambda e: _fmt(e["summary"]["send_lag"]["p99_ms"], 3)),
    ("other CPU on the machine %", lambda e: _fmt(e.get("resources", {}).get("other_cpu_pct"), 1)),
    (
        "hypervisor steal % mean / max (100 = one core)",
        lambda e: (
            f"{_fmt(e.get('resources', {}).get('steal_pct'), 1)} / "
            f"{_fmt(e.get('resources', {}).get('steal_pct_max'), 1)}"
        ),
    ),
)


def _fixed_table(columns: Sequence[Mapping[str, Any]], cmps: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One row per metric; per target after direct, its value then ``- direct`` and ``÷ direct``."""
    others = [e["target"] for e in columns if e["target"] != "direct"]
    header = ["", *(_label(e["target"]) for e in columns)]
    for name in others:
        header += [f"{_label(name)} - direct", f"{_label(name)} ÷ direct"]

    def row(label: str, fn: Any, extra: Any = None) -> list[Any]:
        cells = [label, *(fn(e) for e in columns)]
        for name in others:
            cells += extra(cmps.get(name)) if extra else ["", ""]
        return cells

    rows = [row(label, fn) for label, fn in _PLAIN_ROWS]
    rows.append(
        row(
            "throughput RPS (completed in window)",
            lambda e: _fmt(e["summary"]["throughput_rps"], 1),
            lambda c: ["", _fmt(c["throughput_ratio"], 3) if c else "-"],
        )
    )
    sections = [("latency", "latency")]
    if any(e["summary"].get("ttft") for e in columns):
        sections.append(("ttft", "TTFT"))
    for key, label in sections:
        for pkey, _ in PERCENTILES:

            def diff(c: Any, k: str = key, p: str = pkey) -> list[str]:
                d = c[k][p] if c and c.get(k) else {"added_ms": None, "ratio": None}
                added, ratio = d["added_ms"], d["ratio"]
                return ["-" if added is None else f"{added:+.3f}", "-" if ratio is None else f"{ratio:.2f}x"]

            value = lambda e, k=key, p=pkey: _fmt((e["summary"].get(k) or {}).get(f"{p}_ms"), 3)  # noqa: E731
            rows.append(row(f"{label} {pkey} ms", value, diff))
    if any(e["summary"]["rejected"] for e in columns):
        rows.append(row("rejected (429/503) answer time p50 / p99 / max ms", lambda e: _reject_times(e["summary"])))
    rows += [row(label, fn) for label, fn in _RESOURCE_ROWS]
    return _table(header, rows)


def _warnings(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    repeated = any(e.get("repetition", 0) > 0 for e in entries)
    for e in entries:
        s = e["summary"]
        label = f"{_label(e['target'])} @ {e['rate']:g} RPS"
        if repeated:
            label += f", repetition {e.get('repetition', 0) + 1}"
        if not s.get("accounted", True):
            out.append(f"- **{label}: outcomes do not add up to offered requests (harness bug).**")
        lag = s["send_lag"].get("p99_ms")
        if lag is not None and lag > _LAG_WARN_MS:
            out.append(f"- {label}: load generator send lag p99 {lag:.1f} ms; latency includes generator delay.")
        other = e.get("resources", {}).get("other_cpu_pct")
        if other is not None and other > _OTHER_CPU_WARN_PCT:
            out.append(f"- {label}: other processes used {other:.0f} % CPU during the window; numbers are noisy.")
        steal = e.get("resources", {}).get("steal_pct")
        if steal is not None and steal > _STEAL_WARN_PCT:
            out.append(f"- {label}: the hypervisor stole {steal:.0f} % CPU during the window; numbers are noisy.")
        if s.get("errors"):
            errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items())
            out.append(f"- {label}: failures: {errors}.")
        if s.get("codes"):
            codes = ", ".join(f"{k}: {v}" for k, v in s["codes"].items())
            out.append(f"- {label}: non-2xx answers by error code: {codes}.")
    return out


def _sweep(step: Mapping[str, Any]) -> list[str]:
    rows = []
    for e in step["runs"]:
        s = e["summary"]
        lat = s["latency"]
        rows.append(
            [
                _label(e["target"]),
                _fmt(float(e["rate"]), 0),
                _fmt(s["throughput_rps"], 1),
                _pct(s["success_ratio"]),
                _fmt(lat["p50_ms"], 3),
                _fmt(lat["p99_ms"], 3),
                _fmt(lat["p99.9_ms"], 3),
                _fmt(lat["max_ms"], 3),
                _served(e, "cpu_pct_mean"),
                "yes" if e.get("pass") else "**no**",
            ]
        )
    header = ["target", "offered RPS", "throughput RPS", "success %", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
    lines = _table([*header, "server CPU %", "pass"], rows)
    sweep = step.get("sweep", {})
    knees = step.get("knee_rps", {})
    bound = f"p99 ≤ {sweep.get('p99_bound_ms')} ms and success ≥ {_pct(sweep.get('min_success'), 1)} %"
    all_passed = {target: all(e.get("pass") for e in step["runs"] if e["target"] == target) for target in knees}
    parts = []
    for target, knee in knees.items():
        if not knee:
            parts.append(f"{_label(target)} below the lowest rate")
        elif all_passed[target]:
            parts.append(f"{_label(target)} ≥ {knee:.0f} (the highest rate tried)")
        else:
            parts.append(f"{_label(target)} {knee:.0f}")
    knee_text = ", ".join(parts)
    lines += ["", f"Knee (highest rate with {bound}): {knee_text} RPS."]
    return lines


def _timeline(entry: Mapping[str, Any], note: str = "") -> list[str]:
    keys = ["offered", "completed", "late", "rejected", "failed", "timed_out", "dropped", "p50_ms", "p99_ms", "max_ms"]
    rows = [[row["t"], *(_fmt(row.get(k), 3) for k in keys)] for row in entry["summary"]["timeline"]]
    title = f"Per second of intended send, {_label(entry['target'])} @ {entry['rate']:g} RPS{note}:"
    return [title, "", *_table(["s", *keys], rows)]


def _profile(entry: Mapping[str, Any]) -> list[str]:
    prof = entry.get("py_spy") or {}
    title = f"Where Tollway's time goes (py-spy, {entry['rate']:g} RPS"
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


def _fixed(step: Mapping[str, Any]) -> list[str]:
    pooled: Mapping[str, Any] = step.get("pooled") or {e["target"]: e for e in step["runs"]}
    first = next(iter(pooled.values()), None)
    if first is None:
        return ["No runs."]
    reps = first.get("repetitions", 1)
    cmps = {c.get("target", "gateway"): c for c in step["comparison"]}
    pooled_note = f", {reps} repetitions pooled (histograms merged)" if reps > 1 else ""
    lines = [f"Offered rate: {first['rate']:g} RPS{pooled_note}.", ""]
    columns = sorted(pooled.values(), key=lambda e: e["target"] != "direct")
    lines += _fixed_table(columns, cmps)
    repetitions = step.get("repetitions") or {}
    if "metrics" in repetitions:  # results written before peers existed
        repetitions = {"gateway": repetitions}
    for target, stats in repetitions.items():
        lines += ["", *_repetitions(target, stats)]
    if step.get("timeline"):
        summed = " (summed over repetitions)" if reps > 1 else ""
        for entry in columns:
            lines += ["", *_timeline(entry, summed)]
    return lines


def _repetitions(target: str, stats: Mapping[str, Any]) -> list[str]:
    rows = []
    for name, m in stats["metrics"].items():
        ci = f"{_fmt(m['mean'], 3)} ± {_fmt(m['ci95'], 3)}" if m["ci95"] is not None else _fmt(m["mean"], 3)
        rows.append([name, _fmt(m["median"], 3), _fmt(m["min"], 3), _fmt(m["max"], 3), ci])
    name = _label(target)
    header = [f"{name} against direct, per repetition", "median", "min", "max", "mean ± 95 % CI"]
    title = f"Across {stats['n']} repetitions, each {name} run compared with the direct run of the same repetition:"
    return [title, "", *_table(header, rows)]


def _targets(results: Mapping[str, Any]) -> list[str]:
    rows = []
    for name, info in results.get("targets", {}).items():
        if name in ("direct", "gateway"):
            continue
        detail = f"{info.get('version')}, {info.get('workers')} worker(s)" if info.get("status") == "ok" else ""
        rows.append([name, info.get("status"), detail or info.get("reason", "")])
    if not rows:
        return []
    return ["", "## Peer gateways", "", *_table(["peer", "status", "version, workers / reason"], rows)]


def _endpoints(step: Mapping[str, Any]) -> str:
    """The APIs called when a step is not plain chat to chat (results before endpoint kinds have none)."""
    name = step.get("endpoint", "chat")
    kind = ENDPOINTS[name]
    direct = ENDPOINTS[step.get("direct_endpoint", kind.upstream)]
    if name == "chat" and direct.name == "chat":
        return ""
    to = direct.url_path(PROVIDER_MODELS.get(direct.name, "{model}"), step["stream"])
    return f", gateway `POST /v1/{kind.path}`, direct `POST {to}`"


def render_summary(manifest: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    lines = _header(manifest, results) + _targets(results)
    for step in results.get("steps", []):
        mode = "SSE" if step["stream"] else "buffered"
        lines += ["", f"## {step['name']}: payload `{step['payload']}`, {mode}{_endpoints(step)}", ""]
        if step["kind"] == "sweep":
            lines += _sweep(step)
        else:
            lines += _fixed(step)
        for entry in step["runs"]:
            if "py_spy" in entry:
                lines += ["", *_profile(entry)]
        warnings = _warnings(step["runs"])
        if warnings:
            lines += ["", *warnings]
    lines += [
        "",
        "`X - direct` is the difference of the two percentiles, not a percentile of per-request "
        "overhead; read it with the ratio. Latency runs from each request's intended send time.",
        "",
    ]
    return "\n".join(lines)
