"""Upstream client microbenchmark: CPU per buffered call of each ``httpClient``, in one process.

``python -m bench.transports [--requests 4000] [--concurrency 4] [--repeat 3] [--clients h1,aiohttp,httpx]``

One mock provider (``tollway.mock``, one worker, started as ``bench.run`` starts it) answers
every call. In this process, on uvloop as in the gateway's workers, each client is built by
``tollway.transport.build_transport`` with a deployment's settings and a credential header,
warmed up with 200 calls, then sends ``--requests`` buffered chat completions (the ``small``
payload) from ``--concurrency`` tasks. CPU is this process's ``time.process_time()`` over the
calls, per call: only the client and the event loop run in it. The **baseline** is the load
generator's own client (``bench.clients.Http1Client``): a pre-rendered request and a bare
httptools parser, the least a call can cost here. Clients are interleaved within each
repetition, so drift hits all alike.
Prints a markdown table of medians with each client's ratio to the baseline; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Final

import uvloop

from bench.clients import Http1Client
from bench.profiles import load_payload
from bench.servers import mock_command, start_server
from tollway.transport import TransportSettings, build_transport
from tollway.wire import UpstreamRequest

__all__ = ["main"]

CLIENTS: Final = ("h1", "aiohttp", "httpx")
BASELINE: Final = "baseline"
WARMUP: Final = 200
_JSON: Final = MappingProxyType({"content-type": "application/json"})


async def _measure(call: Callable[[], Awaitable[int]], requests: int, concurrency: int) -> float:
    """CPU seconds per call, after a warm-up; every call must answer 200."""
    for _ in range(WARMUP):
        if (status := await call()) != 200:
            raise RuntimeError(f"the mock answered {status}")

    async def worker(count: int) -> None:
        for _ in range(count):
            if (status := await call()) != 200:
                raise RuntimeError(f"the mock answered {status}")

    share, extra = divmod(requests, concurrency)
    started = time.process_time()
    await asyncio.gather(*(worker(share + (1 if n < extra else 0)) for n in range(concurrency)))
    return (time.process_time() - started) / requests


async def _client_cpu(name: str, base: str, body: bytes, requests: int, concurrency: int) -> float:
    if name == BASELINE:
        lean = Http1Client(base + "/v1/chat/completions", body, {"authorization": "Bearer sk-bench"}, False)

        async def lean_call() -> int:
            return (await lean.send(time.monotonic()))[0]

        try:
            return await _measure(lean_call, requests, concurrency)
        finally:
            await lean.aclose()
    settings = TransportSettings(
        base_url=base + "/v1", connect_timeout_s=5.0, request_timeout_s=60.0, stream_idle_timeout_s=60.0
    )
    transport = build_transport(name, settings, {"authorization": "Bearer sk-bench"})  # type: ignore[arg-type]
    request = UpstreamRequest("chat/completions", body, _JSON, False)

    async def call() -> int:
        return (await transport.send(request))[0]

    try:
        return await _measure(call, requests, concurrency)
    finally:
        await transport.aclose()


def run(clients: Sequence[str], requests: int, concurrency: int, repeat: int) -> dict[str, list[float]]:
    payload, _ = load_payload("small")
    body = json.dumps({**payload, "model": "m"}).encode()
    results: dict[str, list[float]] = {name: [] for name in (BASELINE, *clients)}
    with tempfile.TemporaryDirectory(prefix="tollway-bench-transports-") as tmp:
        mock = start_server("mock", mock_command(1), r"mock listening on (\S+)", Path(tmp) / "mock.log")
        base = mock.url.rstrip("/")
        try:
            for _ in range(repeat):
                for name in results:
                    results[name].append(uvloop.run(_client_cpu(name, base, body, requests, concurrency)))
        finally:
            mock.stop()
    return results


def _table(results: dict[str, list[float]]) -> list[str]:
    floor = statistics.median(results[BASELINE])
    lines = [
        "| client | CPU per call, median (min-max) | ratio to the baseline |",
        "|---|---|---|",
    ]
    for name, values in results.items():
        us = [v * 1e6 for v in values]
        label = "baseline (bench.clients.Http1Client)" if name == BASELINE else f"`httpClient: {name}`"
        ratio = statistics.median(values) / floor if floor > 0 else float("nan")
        lines.append(f"| {label} | {statistics.median(us):.0f} µs ({min(us):.0f}-{max(us):.0f}) | {ratio:.2f}x |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transports", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="measured calls per client and repetition")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks sending at once")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (clients interleaved in each)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    args = parser.parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown or not clients:
        parser.error(f"--clients: unknown {unknown}; choose from {', '.join(CLIENTS)}")
    if not (1 <= args.requests <= 1_000_000 and 1 <= args.concurrency <= 256 and 1 <= args.repeat <= 20):
        parser.error("--requests 1..1000000, --concurrency 1..256, --repeat 1..20")
    results = run(clients, args.requests, args.concurrency, args.repeat)
    print(f"{args.requests} calls per client and repetition, {args.concurrency} at once, {args.repeat} repetitions")
    print("\n".join(_table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
