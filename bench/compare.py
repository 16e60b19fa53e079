"""``python -m bench.compare RESULT --baseline bench/baselines/NAME.json [--margin 0.25]``: the regression guard.

It compares a fresh run with the last accepted baseline, never in absolute milliseconds: each
metric is a ratio to the *same run's* direct-to-mock baseline (gateway p50 ÷ direct p50,
gateway throughput ÷ direct throughput, ...), so a slower or busier machine moves both sides
and largely cancels out. A latency ratio regresses when it grows by more than ``margin``
(0.25 = 25 %); a throughput or knee ratio when it shrinks by more than ``margin``; success
when it falls more than 0.1 percentage point below the baseline's.

Exit status: 0 no regression, 1 regression, 2 unusable input (missing file, other profile,
a step or metric the baseline has and the result lacks).

``--write-baseline PATH`` turns ``RESULT`` into a baseline file instead of comparing. Run the
guard by hand or in a scheduled performance job after changes to the request path, codecs,
routing, admission or streaming; it is not part of the unit tests.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = ["BASELINE_SCHEMA", "extract_metrics", "find_regressions", "main"]

BASELINE_SCHEMA: Final = "tollway-bench-baseline/1"
_SUCCESS_SLACK: Final = 0.001


def _load(path: Path) -> dict[str, Any]:
    file = path / "results.json" if path.is_dir() else path
    data = orjson.loads(file.read_bytes())
    if not isinstance(data, dict):
        raise ValueError(f"{file}: not a JSON object")
    return data


def _metric(value: float | None, better: str) -> dict[str, Any] | None:
    return None if value is None else {"value": value, "better": better}


def extract_metrics(results: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``step@rate/metric`` → ``{"value", "better"}`` from a run's results: ratios to direct only."""
    out: dict[str, dict[str, Any]] = {}
    for step in results.get("steps", []):
        name = step["name"]
        if step.get("kind") == "sweep":
            knees = step.get("knee_rps") or {}
            direct, gateway = knees.get("direct"), knees.get("gateway")
            ratio = round(gateway / direct, 4) if direct and gateway else None
            if (m := _metric(ratio, "higher")) is not None:
                out[f"{name}/knee_ratio"] = m
            continue
        for cmp in step.get("comparison", []):
            if cmp.get("target", "gateway") != "gateway":
                continue
            prefix = f"{name}@{cmp['rate']:g}"
            candidates = {
                "throughput_ratio": _metric(cmp.get("throughput_ratio"), "higher"),
                "success": _metric((cmp.get("success_ratio") or {}).get("gateway"), "success"),
            }
            for section in ("latency", "ttft"):
                for pct in ("p50", "p95", "p99"):
                    ratio = ((cmp.get(section) or {}).get(pct) or {}).get("ratio")
                    candidates[f"{section}_{pct}_ratio"] = _metric(ratio, "lower")
            out.update({f"{prefix}/{k}": m for k, m in candidates.items() if m is not None})
    return out


def find_regressions(
    baseline: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]], margin: float
) -> tuple[list[str], list[str], list[str]]:
    """``(regressions, missing, report lines)`` for every baseline metric."""
    regressions, missing, lines = [], [], []
    for key, base in sorted(baseline.items()):
        cur = current.get(key)
        if cur is None:
            missing.append(key)
            lines.append(f"MISSING    {key}: baseline {base['value']}, not in result")
            continue
        b, c, better = float(base["value"]), float(cur["value"]), base["better"]
        if better == "lower":
            limit = b * (1 + margin)
            bad = c > limit
        elif better == "higher":
            limit = b * (1 - margin)
            bad = c < limit
        else:
            limit = b - _SUCCESS_SLACK
            bad = c < limit
        verdict = "REGRESSION" if bad else "ok"
        lines.append(f"{verdict:<10} {key}: {c:g} (baseline {b:g}, limit {limit:.4g}, {better} is better)")
        if bad:
            regressions.append(key)
    return regressions, missing, lines


def baseline_document(results: Mapping[str, Any], manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    source: dict[str, Any] = {"created": results.get("created")}
    if manifest:
        source.update(
            commit=manifest.get("git", {}).get("commit"),
            dirty=manifest.get("git", {}).get("dirty"),
            cpu_model=manifest.get("machine", {}).get("cpu_model"),
            cores=manifest.get("machine", {}).get("usable_cores"),
            command=" ".join(manifest.get("command", [])),
        )
    return {
        "schema": BASELINE_SCHEMA,
        "profile": results.get("profile"),
        "source": source,
        "metrics": extract_metrics(results),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("result", help="a run directory or its results.json")
    parser.add_argument("--baseline", help="bench/baselines/NAME.json")
    parser.add_argument("--margin", type=float, default=0.25, help="allowed relative worsening (default 0.25)")
    parser.add_argument("--write-baseline", metavar="PATH", help="write RESULT as a baseline to PATH and exit")
    args = parser.parse_args(argv)
    if (args.baseline is None) == (args.write_baseline is None):
        parser.error("pass exactly one of --baseline or --write-baseline")
    if not 0 < args.margin < 1:
        parser.error("--margin is a fraction between 0 and 1")
    result_path = Path(args.result)
    try:
        results = _load(result_path)
    except (OSError, ValueError) as exc:
        print(f"cannot read result {result_path}: {exc}", file=sys.stderr)
        return 2
    if args.write_baseline:
        manifest_path = (result_path if result_path.is_dir() else result_path.parent) / "manifest.json"
        manifest = orjson.loads(manifest_path.read_bytes()) if manifest_path.is_file() else None
        doc = baseline_document(results, manifest)
        Path(args.write_baseline).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        print(f"wrote {args.write_baseline} with {len(doc['metrics'])} metrics")
        return 0
    try:
        baseline = orjson.loads(Path(args.baseline).read_bytes())
    except (OSError, ValueError) as exc:
        print(f"cannot read baseline {args.baseline}: {exc}", file=sys.stderr)
        return 2
    if baseline.get("schema") != BASELINE_SCHEMA or baseline.get("profile") != results.get("profile"):
        print(
            f"baseline is for profile {baseline.get('profile')!r} (schema {baseline.get('schema')!r}); "
            f"result is {results.get('profile')!r}",
            file=sys.stderr,
        )
        return 2
    regressions, missing, lines = find_regressions(baseline["metrics"], extract_metrics(results), args.margin)
    print("\n".join(lines))
    if missing:
        print(f"{len(missing)} baseline metric(s) missing from the result", file=sys.stderr)
        return 2
    if regressions:
        print(f"{len(regressions)} regression(s) beyond a {args.margin:.0%} margin", file=sys.stderr)
        return 1
    print(f"no regression beyond a {args.margin:.0%} margin")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
