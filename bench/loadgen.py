"""An open-loop, fixed-rate HTTP load generator that measures from intended send times.

Why not wrk, hey or ab: they are closed-loop (a fixed set of connections each waiting for
its previous answer), so once a server queues they send less and under-report latency
("coordinated omission"). Here every request has an *intended* send time on an evenly
spaced schedule, fixed before the run; it is sent at that time whether or not earlier
requests have answered, and its latency is measured from the intended time. A late send
(the generator itself fell behind) is therefore charged to latency, and the lag is
reported separately as ``send_lag`` so a saturated generator is visible.

The rate is split across ``procs`` processes by interleaving one schedule: request ``j``
is due at ``start + j / rate`` and process ``j % procs`` sends it, so the combined stream
stays evenly spaced. Each process runs asyncio on uvloop with one pooled HTTP client
(:mod:`bench.clients`: a lean httptools client by default, aiohttp to cross-check it) and
writes its counters into shared memory for the one-line-per-second progress report.

Accounting, per request intended inside the measurement window (after the warm-up):

==============  ==============================================================================
offered         scheduled in the window
sent            actually dispatched (offered - dropped)
completed       2xx, whole body (or SSE stream up to its terminal marker) read by window end
late            2xx, but finished after the window end: *not* counted as completed
rejected        429 or 503: load shedding, never a success
failed          any other status, a connection error, or an SSE stream without its terminal marker
timed_out       no complete answer within ``timeout_s`` of the intended send time
dropped         not sent because ``max_in_flight`` requests were already outstanding
==============  ==============================================================================

``completed + late + rejected + failed + timed_out + dropped == offered`` always holds.
Latency percentiles cover every 2xx (completed and late: excluding the slowest answers would
hide a backlog); throughput counts only ``completed``. For SSE, TTFT is the time from the
intended send to the first-token frame of the spec's endpoint kind, and a stream is complete at
its terminal frame (:mod:`bench.endpoints`: chat, messages, responses, embeddings).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import queue
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from bench.clients import CLIENTS, Client, make_client
from bench.endpoints import ENDPOINTS, endpoint_kind
from bench.stats import Histogram, summarize

__all__ = ["OUTCOMES", "LoadResult", "LoadSpec", "main", "run_load"]

LOADGEN_VERSION: Final = "1"

OUTCOMES: Final = ("completed", "late", "rejected", "failed", "timed_out", "dropped")
_COMPLETED, _LATE, _REJECTED, _FAILED, _TIMED_OUT, _DROPPED = range(len(OUTCOMES))
REJECT_STATUSES: Final = frozenset({429, 503})

# Per-process progress counters in shared memory, one writer each.
_P_SENT, _P_OK, _P_REJECTED, _P_FAILED, _P_TIMED_OUT, _P_DROPPED, _P_IN_FLIGHT = range(7)
_P_FIELDS: Final = 7

_DRAIN_GRACE_S: Final = 1.0
_READY_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class LoadSpec:
    """What to send, how fast and for how long; picklable, so child processes get a copy."""

    url: str
    body: bytes
    rate: float
    """Total requests per second, across all processes."""
    duration_s: float
    warmup_s: float = 0.0
    timeout_s: float = 10.0
    stream: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    procs: int = 1
    max_in_flight: int = 1000
    """Per process; a request due while this many are outstanding is dropped, not queued."""
    endpoint: str = "chat"
    """The client API (a key of :data:`bench.endpoints.ENDPOINTS`): how a stream ends and where its first token is."""
    start_at: float | None = None
    """``time.monotonic()`` at which request 0 is due; None starts at once. Two runs can chain on it."""
    client: str = "http1"
    """``http1`` (lean, httptools) or ``aiohttp`` (cross-check); see :mod:`bench.clients`."""
    label: str = ""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0 or self.warmup_s < 0 or self.timeout_s <= 0:
            raise ValueError("rate, duration and timeout must be positive and warm-up non-negative")
        if self.procs < 1 or self.max_in_flight < 1:
            raise ValueError("procs and max_in_flight must be at least 1")
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(CLIENTS)}")
        if not endpoint_kind(self.endpoint).streams and self.stream:
            raise ValueError(f"the {self.endpoint} endpoint does not stream")

    @property
    def first_measured(self) -> int:
        """Index of the first request inside the measurement window."""
        return math.ceil(self.warmup_s * self.rate - 1e-9)

    @property
    def total_requests(self) -> int:
        return math.ceil((self.warmup_s + self.duration_s) * self.rate - 1e-9)

    @property
    def seconds(self) -> int:
        return max(1, math.ceil(self.duration_s - 1e-9))

    def settings(self) -> dict[str, Any]:
        """The spec for a manifest: the body is summarized, never copied."""
        data = asdict(self)
        data["body"] = {"bytes": len(self.body)}
        data["headers"] = sorted(k for k in self.headers if k.lower() != "authorization")
        terminal = ENDPOINTS[self.endpoint].terminal
        data["stream_terminal"] = terminal.decode() if self.stream and terminal is not None else None
        data.pop("start_at", None)
        return data


class LoadResult:
    """One process's (or several merged processes') accounting and histograms."""

    def __init__(self, seconds: int) -> None:
        self.counts = [0] * len(OUTCOMES)
        self.offered = 0
        self.warmup_sent = 0
        self.warmup_ok = 0
        self.status: dict[int, int] = {}
        self.codes: dict[str, int] = {}
        """Non-2xx answers by status and error-envelope code: ``"503 overloaded"``."""
        self.errors: dict[str, int] = {}
        self.latency = [Histogram() for _ in range(seconds)]
        """2xx latency (completed and late), by second of intended send within the window."""
        self.timeline = [[0] * (len(OUTCOMES) + 1) for _ in range(seconds)]
        """Per second of intended send: offered, then each outcome."""
        self.ttft = Histogram()
        self.reject_latency = Histogram()
        self.send_lag = Histogram()
        self.window: tuple[float, float] | None = None
        """The measurement window in ``time.monotonic()`` seconds, where known (not serialized)."""

    def count(self, outcome: str) -> int:
        return self.counts[OUTCOMES.index(outcome)]

    @property
    def sent(self) -> int:
        return self.offered - self.counts[_DROPPED]

    def merge(self, other: LoadResult) -> LoadResult:
        if len(other.latency) != len(self.latency):
            raise ValueError("cannot merge results of different window lengths")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.offered += other.offered
        self.warmup_sent += other.warmup_sent
        self.warmup_ok += other.warmup_ok
        for key, n in other.status.items():
            self.status[key] = self.status.get(key, 0) + n
        for code, n in other.codes.items():
            self.codes[code] = self.codes.get(code, 0) + n
        for reason, n in other.errors.items():
            self.errors[reason] = self.errors.get(reason, 0) + n
        for mine, theirs in zip(self.latency, other.latency, strict=True):
            mine.merge(theirs)
        for row, other_row in zip(self.timeline, other.timeline, strict=True):
            row[:] = [a + b for a, b in zip(row, other_row, strict=True)]
        self.ttft.merge(other.ttft)
        self.reject_latency.merge(other.reject_latency)
        self.send_lag.merge(other.send_lag)
        return self

    def latency_total(self) -> Histogram:
        return Histogram.merged(self.latency)

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(zip(OUTCOMES, self.counts, strict=True)),
            "offered": self.offered,
            "warmup": {"sent": self.warmup_sent, "ok": self.warmup_ok},
            "status": {str(k): v for k, v in sorted(self.status.items())},
            "codes": dict(sorted(self.codes.items())),
            "errors": dict(sorted(self.errors.items())),
            "latency_by_second": [h.to_dict() for h in self.latency],
            "timeline": self.timeline,
            "ttft": self.ttft.to_dict(),
            "reject_latency": self.reject_latency.to_dict(),
            "send_lag": self.send_lag.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadResult:
        out = cls(len(data["latency_by_second"]))
        out.counts = [int(data["counts"][name]) for name in OUTCOMES]
        out.offered = int(data["offered"])
        out.warmup_sent = int(data["warmup"]["sent"])
        out.warmup_ok = int(data["warmup"]["ok"])
        out.status = {int(k): int(v) for k, v in data["status"].items()}
        out.codes = {str(k): int(v) for k, v in data.get("codes", {}).items()}  # absent before codes were kept
        out.errors = {str(k): int(v) for k, v in data["errors"].items()}
        out.latency = [Histogram.from_dict(h) for h in data["latency_by_second"]]
        out.timeline = [[int(x) for x in row] for row in data["timeline"]]
        out.ttft = Histogram.from_dict(data["ttft"])
        out.reject_latency = Histogram.from_dict(data["reject_latency"])
        out.send_lag = Histogram.from_dict(data["send_lag"])
        return out

    def summary(self, duration_s: float, stream: bool) -> dict[str, Any]:
        """Counts, ratios, throughput and percentile summaries, as the reports print them."""
        counts = dict(zip(OUTCOMES, self.counts, strict=True))
        offered = self.offered
        ok = counts["completed"] + counts["late"]
        return {
            "offered": offered,
            "sent": self.sent,
            **counts,
            "accounted": sum(self.counts) == offered,
            "success_ratio": round(ok / offered, 6) if offered else None,
            "completed_ratio": round(counts["completed"] / offered, 6) if offered else None,
            "offered_rps": round(offered / duration_s, 2),
            "throughput_rps": round(counts["completed"] / duration_s, 2),
            "latency": summarize(self.latency_total()),
            "ttft": summarize(self.ttft) if stream else None,
            "reject_latency": summarize(self.reject_latency),
            "send_lag": summarize(self.send_lag),
            "status": {str(k): v for k, v in sorted(self.status.items())},
            "codes": dict(sorted(self.codes.items())),
            "errors": dict(sorted(self.errors.items())),
            "warmup": {"sent": self.warmup_sent, "ok": self.warmup_ok},
            "timeline": self.timeline_summary(),
        }

    def timeline_summary(self) -> list[dict[str, Any]]:
        rows = []
        for second, (row, hist) in enumerate(zip(self.timeline, self.latency, strict=True)):
            entry: dict[str, Any] = {"t": second, "offered": row[0]}
            entry.update(zip(OUTCOMES, row[1:], strict=True))
            p50, p99 = hist.percentile(0.5), hist.percentile(0.99)
            entry["p50_ms"] = None if p50 is None else round(p50 / 1000, 3)
            entry["p99_ms"] = None if p99 is None else round(p99 / 1000, 3)
            entry["max_ms"] = round(hist.max / 1000, 3) if hist.count else None
            rows.append(entry)
        return rows


class _Worker:
    """One process's share of the schedule, sent through one pooled client."""

    def __init__(self, spec: LoadSpec, index: int, progress: Any) -> None:
        self.spec = spec
        self.index = index
        self.progress = progress
        self.base = index * _P_FIELDS
        self.result = LoadResult(spec.seconds)
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.window_start = 0.0
        self.window_end = 0.0

    def _bump(self, slot: int, n: int = 1) -> None:
        self.progress[self.base + slot] += n

    async def run(self, client: Client, start_at: float) -> LoadResult:
        spec = self.spec
        self.window_start = start_at + spec.first_measured / spec.rate
        self.window_end = start_at + spec.warmup_s + spec.duration_s
        first, step, loop = spec.first_measured, spec.procs, asyncio.get_running_loop()
        behind = 0
        for j in range(self.index, spec.total_requests, step):
            intended = start_at + j / spec.rate
            if intended > time.monotonic():
                behind = 0
                while (delay := intended - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
            else:
                # Behind schedule: send at once (latency still counts from the intended time), but
                # let responses be read now and then rather than starving the event loop.
                behind += 1
                if behind % 32 == 0:
                    await asyncio.sleep(0)
            measured = j >= first
            second = min(int((j - first) / spec.rate), spec.seconds - 1) if measured else -1
            if measured:
                self.result.offered += 1
                self.result.timeline[second][0] += 1
            if self.in_flight >= spec.max_in_flight:
                if measured:
                    self._outcome(_DROPPED, second)
                self._bump(_P_DROPPED)
                continue
            self.in_flight += 1
            self._bump(_P_IN_FLIGHT)
            task = loop.create_task(self._send(client, intended, second))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        self.result.window = (self.window_start, self.window_end)
        await self._drain()
        return self.result

    async def _drain(self) -> None:
        deadline = self.window_end + self.spec.timeout_s + _DRAIN_GRACE_S
        while self.tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self.tasks), timeout=max(0.0, deadline - time.monotonic()))
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _outcome(self, outcome: int, second: int) -> None:
        self.result.counts[outcome] += 1
        self.result.timeline[second][outcome + 1] += 1

    async def _send(self, client: Client, intended: float, second: int) -> None:
        spec = self.spec
        result = self.result
        started = time.monotonic()
        self._bump(_P_SENT)
        status = 0
        ttft: float | None = None
        complete = False
        code: str | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(intended + spec.timeout_s - started):
                status, ttft, complete, code = await client.send(intended)
        except TimeoutError:
            error = "timeout"
        except asyncio.CancelledError:
            error = "cancelled"
        except Exception as exc:  # OSError, a parser error, aiohttp.ClientError: the request failed
            error = type(exc).__name__
        end = time.monotonic()
        self.in_flight -= 1
        self._bump(_P_IN_FLIGHT, -1)
        if second < 0:
            self._warmup_outcome(status, complete, error)
            return
        result.send_lag.record(int((started - intended) * 1_000_000))
        if status:
            result.status[status] = result.status.get(status, 0) + 1
        if code is not None:
            key = f"{status} {code}"
            result.codes[key] = result.codes.get(key, 0) + 1
        latency_us = int((end - intended) * 1_000_000)
        if error is not None:
            if error in ("timeout", "cancelled"):
                self._outcome(_TIMED_OUT, second)
                self._bump(_P_TIMED_OUT)
            else:
                self._failure(error, second)
        elif 200 <= status < 300:
            if not complete:
                self._failure("stream ended without its terminal marker", second)
                return
            result.latency[second].record(latency_us)
            if ttft is not None:
                result.ttft.record(int(ttft * 1_000_000))
            self._outcome(_COMPLETED if end <= self.window_end else _LATE, second)
            self._bump(_P_OK)
        elif status in REJECT_STATUSES:
            result.reject_latency.record(latency_us)
            self._outcome(_REJECTED, second)
            self._bump(_P_REJECTED)
        else:
            self._failure(f"HTTP {status}", second)

    def _warmup_outcome(self, status: int, complete: bool, error: str | None) -> None:
        self.result.warmup_sent += 1
        if error is not None:
            self._bump(_P_TIMED_OUT if error in ("timeout", "cancelled") else _P_FAILED)
        elif 200 <= status < 300 and complete:
            self.result.warmup_ok += 1
            self._bump(_P_OK)
        else:
            self._bump(_P_REJECTED if status in REJECT_STATUSES else _P_FAILED)

    def _failure(self, reason: str, second: int) -> None:
        self.result.errors[reason] = self.result.errors.get(reason, 0) + 1
        self._outcome(_FAILED, second)
        self._bump(_P_FAILED)


def _progress_line(spec: LoadSpec, counters: Sequence[int], elapsed: float, last_sent: int) -> tuple[str, int]:
    totals = [sum(counters[p * _P_FIELDS + slot] for p in range(spec.procs)) for slot in range(_P_FIELDS)]
    phase = (
        "warmup" if elapsed < spec.warmup_s else ("measure" if elapsed < spec.warmup_s + spec.duration_s else "drain")
    )
    sent = totals[_P_SENT]
    line = (
        f"loadgen {spec.label or spec.url} t={elapsed:5.1f}s {phase:<7} sent={sent} ({sent - last_sent}/s) "
        f"2xx={totals[_P_OK]} rejected={totals[_P_REJECTED]} failed={totals[_P_FAILED]} "
        f"timed_out={totals[_P_TIMED_OUT]} dropped={totals[_P_DROPPED]} in_flight={totals[_P_IN_FLIGHT]}"
    )
    return line, sent


async def _report_progress(spec: LoadSpec, counters: Sequence[int], start_at: float) -> None:
    last = 0
    next_at = start_at + 1.0
    while True:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        line, last = _progress_line(spec, counters, next_at - start_at, last)
        print(line, file=sys.stderr, flush=True)
        next_at += 1.0


def _client(spec: LoadSpec) -> Client:
    kind = ENDPOINTS[spec.endpoint]
    client: Client = make_client(spec.client, spec.url, spec.body, spec.headers, spec.stream, kind, spec.max_in_flight)
    return client


def _run_loop(main: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a gateway dependency, so normally present
        return asyncio.run(main)
    return uvloop.run(main)


async def _run_in_process(spec: LoadSpec, counters: Any) -> LoadResult:
    client = _client(spec)
    start_at = spec.start_at if spec.start_at is not None else time.monotonic() + 0.02
    reporter = asyncio.ensure_future(_report_progress(spec, counters, start_at)) if spec.progress else None
    try:
        return await _Worker(spec, 0, counters).run(client, start_at)
    finally:
        await client.aclose()
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter


def _child(spec: LoadSpec, index: int, counters: Any, start: Any, go: Any, results: Any) -> None:
    async def main() -> dict[str, Any]:
        client = _client(spec)
        try:
            results.put(("ready", index, None))
            await asyncio.get_running_loop().run_in_executor(None, go.wait, _READY_TIMEOUT_S)
            result = await _Worker(spec, index, counters).run(client, float(start.value))
            return result.to_dict()
        finally:
            await client.aclose()

    try:
        results.put(("result", index, _run_loop(main())))
    except BaseException as exc:
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))
        raise


def _run_processes(spec: LoadSpec, counters: Any) -> LoadResult:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Value("d", 0.0, lock=False)
    go = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(spec, i, counters, start, go, results), daemon=True) for i in range(spec.procs)
    ]
    for proc in procs:
        proc.start()
    try:
        ready = 0
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while ready < spec.procs:
            kind, index, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind != "ready":
                raise RuntimeError(f"load process {index} failed to start: {payload}")
            ready += 1
        start.value = spec.start_at if spec.start_at is not None else time.monotonic() + 0.05
        go.set()
        merged = LoadResult(spec.seconds)
        finish_by = start.value + spec.warmup_s + spec.duration_s + spec.timeout_s + _DRAIN_GRACE_S + 30
        last = 0
        next_report = start.value + 1.0
        received = 0
        while received < spec.procs:
            now = time.monotonic()
            if now > finish_by:
                raise RuntimeError("load processes did not report in time")
            if spec.progress and now >= next_report:
                line, last = _progress_line(spec, counters, next_report - start.value, last)
                print(line, file=sys.stderr, flush=True)
                next_report += 1.0
            try:
                kind, index, payload = results.get(timeout=max(0.01, min(next_report, finish_by) - now))
            except queue.Empty:
                continue
            if kind == "error":
                raise RuntimeError(f"load process {index} failed: {payload}")
            merged.merge(LoadResult.from_dict(payload))
            received += 1
        first_at = float(start.value) + spec.first_measured / spec.rate
        merged.window = (first_at, float(start.value) + spec.warmup_s + spec.duration_s)
        return merged
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        results.close()


def run_load(spec: LoadSpec) -> LoadResult:
    """Run ``spec`` to completion (bounded by warm-up + duration + timeout) and return merged results.

    With ``procs == 1`` the load runs in this process (in a fresh event loop, so call it
    from a thread when an event loop is already running here); otherwise in ``procs``
    spawned processes whose schedules interleave.
    """
    counters = multiprocessing.get_context("spawn").Array("q", spec.procs * _P_FIELDS, lock=False)
    if spec.procs == 1:
        result: LoadResult = _run_loop(_run_in_process(spec, counters))
        return result
    return _run_processes(spec, counters)


def _parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"a header is 'Name: value', not {text!r}")
    return name.strip(), value.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, required=True, help="total requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window in seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent first and not counted")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds from intended send time")
    parser.add_argument("--body-file", required=True, help="JSON request body")
    parser.add_argument("--header", action="append", type=_parse_header, default=[], help="'Name: value'")
    parser.add_argument("--stream", action="store_true", help="read SSE and record TTFT")
    parser.add_argument(
        "--endpoint", choices=list(ENDPOINTS), default="chat", help="the API the URL serves (terminal and first frames)"
    )
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--max-in-flight", type=int, default=1000, help="per process")
    parser.add_argument("--client", choices=CLIENTS, default="http1")
    parser.add_argument("--json", help="write the summary and raw histograms here")
    args = parser.parse_args(argv)
    with open(args.body_file, "rb") as fh:
        body = fh.read()
    spec = LoadSpec(
        url=args.url,
        body=body,
        rate=args.rate,
        duration_s=args.duration,
        warmup_s=args.warmup,
        timeout_s=args.timeout,
        stream=args.stream,
        endpoint=args.endpoint,
        headers=dict(args.header),
        procs=args.procs,
        max_in_flight=args.max_in_flight,
        client=args.client,
    )
    result = run_load(spec)
    summary = result.summary(spec.duration_s, spec.stream)
    import orjson

    text = orjson.dumps({k: v for k, v in summary.items() if k != "timeline"}, option=orjson.OPT_INDENT_2)
    print(text.decode())
    if args.json:
        with open(args.json, "wb") as fh:
            payload = {"spec": spec.settings(), "summary": summary, "raw": result.to_dict()}
            fh.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
