"""Audit WAL microbenchmark: append and commit throughput, and the commit wait under local-durable.

``python -m bench.wal [--seconds 2] [--appenders 1,8,64] [--dir DIR]`` runs, in a fresh WAL
directory under ``--dir`` (default: the system temp dir; point it at the volume you would spool
to, since fdatasync cost is the volume's), with a realistic 768-byte audit event as the payload
(600 bytes before ``request_finished`` carried identity and cost):

1. **Throughput**, for ``bounded-async`` (``durable=False``) and ``local-durable``
   (``durable=True``): one thread appends as fast as it can for ``--seconds``, while a
   stand-in shipper acknowledges the durable watermark every 50 ms so acknowledged segments
   are freed (a ``WalFull`` is counted and retried after 1 ms). Appends/s and MB/s count what
   ``append`` accepted inside the window; commit figures count what reached the watermark,
   over the window plus the drain that follows it. "Loss window at end" is
   ``stats()["loss_window_records"]`` as the window closes: appended, not yet at the watermark.
2. **Commit wait** under ``local-durable``: for each N in ``--appenders``, N asyncio tasks on
   one event loop (as the gateway's requests are) each loop ``append`` then ``await
   wait_durable``; the wait from append to durable is recorded per record (median, P90, P99,
   max), next to the writer's own histogram buckets.

The WAL limits are the seed's ``audit.spool`` defaults. Prints markdown tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench.cli import machine, positive_ints
from bench.stats import Histogram
from tests.support import audit_events
from tollway.audit.wal import COMMIT_WAIT_BUCKETS_S, WalFull, WalLimits, WalReader, WalWriter

PAYLOAD_BYTES: Final = 768
LIMITS: Final = WalLimits()
ACK_INTERVAL_S: Final = 0.05
DRAIN_TIMEOUT_S: Final = 30.0


def audit_payload(size: int = PAYLOAD_BYTES) -> bytes:
    """A ``request_finished`` event as the gateway encodes it, padded in a body field to ``size`` bytes."""

    def encode(pad: str) -> bytes:
        event = audit_events.finished("req-01J0BENCH0000000000000000")
        return dataclasses.replace(event, body=dict(event.body, note=pad)).encode()

    base = len(encode(""))
    if base > size:
        raise ValueError(f"an audit event is at least {base} bytes")
    return encode("x" * (size - base))


class _Acker:
    """Stands in for the shipper: acknowledges the durable watermark so segments are freed."""

    def __init__(self, writer: WalWriter, directory: Path) -> None:
        self._writer, self._reader = writer, WalReader(directory)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-acker", daemon=True)

    def __enter__(self) -> _Acker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(ACK_INTERVAL_S):
            self._reader.acknowledge(self._writer.durable_watermark)


def _drain(writer: WalWriter) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while writer.durable_watermark < writer.appended and time.monotonic() < deadline:
        time.sleep(0.0005)


def throughput(directory: Path, *, durable: bool, seconds: float, payload: bytes) -> dict[str, float]:
    """One appending thread for ``seconds``; see the module docstring for what each figure counts."""
    writer = WalWriter(directory, instance_id="bench", limits=LIMITS, durable=durable)
    writer.open()
    full = 0
    with _Acker(writer, directory):
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            for _ in range(256):
                try:
                    writer.append(payload)
                except WalFull:
                    full += 1
                    time.sleep(0.001)
                    break
        window = time.perf_counter() - start
        appended = writer.appended
        loss_window = writer.stats()["loss_window_records"]
        _drain(writer)
        total = time.perf_counter() - start
    stats = writer.stats()
    writer.close()
    committed = stats["durable_watermark"]
    commits = stats["commits"]
    return {
        "appends_per_s": appended / window,
        "append_mb_per_s": appended * len(payload) / window / 1e6,
        "commits_records_per_s": committed / total,
        "commits_per_s": commits / total,
        "records_per_commit": committed / commits if commits else 0.0,
        "fsyncs": stats["fsyncs"],
        "wal_full": full,
        "loss_window": loss_window,
    }


async def _appender(writer: WalWriter, payload: bytes, end: float, hist: Histogram) -> int:
    done = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        seq = writer.append(payload)
        await writer.wait_durable(seq)
        hist.record_seconds(time.perf_counter() - t0)
        done += 1
    return done


def commit_wait(directory: Path, *, appenders: int, seconds: float, payload: bytes) -> dict[str, object]:
    """N concurrent appenders on one loop under ``durable=True``: the append → durable wait per record."""
    writer = WalWriter(directory, instance_id="bench", limits=LIMITS, durable=True)
    writer.open()
    hist = Histogram()

    async def run() -> int:
        end = time.perf_counter() + seconds
        counts = await asyncio.gather(*(_appender(writer, payload, end, hist) for _ in range(appenders)))
        return sum(counts)

    with _Acker(writer, directory):
        start = time.perf_counter()
        records = asyncio.run(run())
        elapsed = time.perf_counter() - start
    stats = writer.stats()
    writer.close()

    def ms(q: float) -> float:
        value = hist.percentile(q)
        return (value or 0) / 1000

    return {
        "appenders": appenders,
        "records_per_s": records / elapsed,
        "records_per_commit": stats["records_written"] / max(1, stats["commits"]),
        "p50_ms": ms(0.5),
        "p90_ms": ms(0.9),
        "p99_ms": ms(0.99),
        "max_ms": ms(1.0),
        "buckets": {k: v for k, v in stats.items() if k.startswith("commit_wait_le_")},
        "count": stats["commit_wait_count"],
    }


def _filesystem(path: Path) -> str:
    """The mount (device and type) holding ``path``, read from /proc/mounts where it exists."""
    best, found = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                device, point, fstype = line.split()[:3]
                if str(path).startswith(point) and len(point) > len(best):
                    best, found = point, f"{fstype} on {device} ({point})"
    except OSError:
        pass
    return found


def render(throughputs: dict[str, dict[str, float]], waits: Sequence[dict[str, object]], context: str) -> str:
    lines = [
        f"WAL microbenchmark — {context}",
        "",
        "| profile | appends/s | append MB/s | committed records/s | commits/s | records/commit | fsyncs "
        "| WalFull | loss window at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in throughputs.items():
        lines.append(
            f"| {name} | {r['appends_per_s']:,.0f} | {r['append_mb_per_s']:.1f} | {r['commits_records_per_s']:,.0f} "
            f"| {r['commits_per_s']:,.0f} | {r['records_per_commit']:.1f} | {r['fsyncs']:,.0f} | {r['wal_full']:,.0f} "
            f"| {r['loss_window']:,.0f} |"
        )
    lines += [
        "",
        "Commit wait (append → durable watermark), local-durable, N appenders on one event loop:",
        "",
        "| appenders | records/s | records/commit | p50 ms | p90 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in waits:
        lines.append(
            f"| {w['appenders']} | {w['records_per_s']:,.0f} | {w['records_per_commit']:.1f} | {w['p50_ms']:.3f} "
            f"| {w['p90_ms']:.3f} | {w['p99_ms']:.3f} | {w['max_ms']:.3f} |"
        )
    keys = [f"commit_wait_le_{b:g}s" for b in COMMIT_WAIT_BUCKETS_S] + ["commit_wait_le_inf"]
    header = " | ".join(f"N={w['appenders']}" for w in waits)
    lines += [
        "",
        "Writer histogram (`stats()`), cumulative share of records at or below each bound:",
        "",
        f"| ≤ | {header} |",
        "|---:|" + "---:|" * len(waits),
    ]
    for key in keys:
        bound = key.removeprefix("commit_wait_le_")
        cells = []
        for w in waits:
            buckets, count = w["buckets"], w["count"]
            assert isinstance(buckets, dict) and isinstance(count, int)
            cells.append(f"{100 * buckets[key] / count:.1f} %" if count else "-")
        lines.append(f"| {bound} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wal", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each measured window")
    parser.add_argument(
        "--appenders", type=positive_ints, default=[1, 8, 64], help="comma-separated N for the commit-wait runs"
    )
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch WAL directories")
    args = parser.parse_args(argv)
    counts: list[int] = args.appenders
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    payload = audit_payload()
    with tempfile.TemporaryDirectory(prefix="tollway-bench-wal-", dir=args.dir) as scratch:
        root = Path(scratch)
        context = f"{len(payload)}-byte events, {args.seconds:g} s windows, {_filesystem(root.resolve())}, {machine()}"
        throughputs = {
            "bounded-async": throughput(root / "async", durable=False, seconds=args.seconds, payload=payload),
            "local-durable": throughput(root / "durable", durable=True, seconds=args.seconds, payload=payload),
        }
        waits = [commit_wait(root / f"wait-{n}", appenders=n, seconds=args.seconds, payload=payload) for n in counts]
    print(render(throughputs, waits, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
