"""Bedrock Converse client microbenchmark: CPU per buffered call, Tollway's path against aiobotocore.

``python -m bench.bedrock_clients [--requests 3000] [--concurrency 4] [--repeat 3]``

Both clients send the same Converse request (the ``small`` payload: a system prompt and one user
turn, ``maxTokens`` 64) to one mock provider (``tollway.mock``, one worker), which checks that each
call carries a SigV4 ``Authorization`` and answers in Bedrock's format.

- **tollway**: what a Bedrock route does per call in the gateway: the Converse codec encodes the
  canonical request, the ``h1`` transport signs it (``tollway.transport.sigv4.RequestSigner``, over
  botocore's ``SigV4Auth``) and sends it on a pooled connection, and the codec decodes the answer
  into the canonical response.
- **aiobotocore**: ``bedrock-runtime``'s ``converse`` through aiobotocore, which serializes,
  signs, sends on aiohttp and parses the answer into a dict. aioboto3 is a resource layer over this
  same client. It cannot live in Tollway's venv (botocore pins conflict,
  bench/requirements-aiobotocore.txt), so it runs in a side venv, ``.venv-aiobotocore``, which
  ``--setup`` creates from that file.

CPU is each client process's ``time.process_time()`` over the measured calls, after a warm-up, per
call. Clients alternate within each repetition. Prints a markdown table of medians and the ratio
to Tollway's path; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import uvloop

from bench.servers import mock_command, start_server
from tollway.canonical import CanonicalRequest, Message
from tollway.providers.base import Target
from tollway.providers.bedrock_converse import BedrockConverseCodec
from tollway.transport import TransportSettings, build_transport
from tollway.transport.sigv4 import AwsCredentials, RequestSigner

__all__ = ["main"]

ROOT: Final = Path(__file__).resolve().parent.parent
SIDE_VENV: Final = ROOT / ".venv-aiobotocore"
REQUIREMENTS: Final = ROOT / "bench" / "requirements-aiobotocore.txt"
WORKER: Final = ROOT / "bench" / "bedrock_aiobotocore.py"
MODEL: Final = "anthropic.claude-3-haiku-20240307-v1:0"
WARMUP: Final = 200


def _side_python() -> Path:
    return SIDE_VENV / "bin" / "python"


def setup() -> None:
    """Create ``.venv-aiobotocore`` with this interpreter and install the pinned side requirements."""
    if not _side_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(SIDE_VENV)], check=True)
    pip = [str(_side_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)


async def _tollway_cpu(base: str, requests: int, concurrency: int) -> float:
    codec = BedrockConverseCodec()
    target = Target(model=MODEL)
    req = CanonicalRequest(
        messages=[
            Message("system", "You are a concise assistant."),
            Message("user", "Say hello to the benchmark in five words."),
        ],
        max_output_tokens=64,
        temperature=0.0,
    )
    signer = RequestSigner(lambda: AwsCredentials("AKIDBENCHMARK", "bench-secret"), "us-east-1")
    settings = TransportSettings(
        base_url=base, connect_timeout_s=5.0, request_timeout_s=60.0, stream_idle_timeout_s=60.0
    )
    transport = build_transport("h1", settings, {}, signer=signer)

    async def call() -> None:
        status, _, body = await transport.send(codec.encode_request(req, target))
        if status != 200:
            raise RuntimeError(f"the mock answered {status}")
        if not codec.decode_response(status, body).content:
            raise RuntimeError("an empty answer")

    try:
        for _ in range(WARMUP):
            await call()

        async def worker(count: int) -> None:
            for _ in range(count):
                await call()

        share, extra = divmod(requests, concurrency)
        started = time.process_time()
        await asyncio.gather(*(worker(share + (1 if n < extra else 0)) for n in range(concurrency)))
        return (time.process_time() - started) / requests
    finally:
        await transport.aclose()


def _aiobotocore_cpu(base: str, requests: int, concurrency: int) -> tuple[float, str]:
    cmd = [str(_side_python()), str(WORKER), base, MODEL, str(requests), str(concurrency), str(WARMUP)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["cpu_s_per_call"]), f"aiobotocore {result['aiobotocore']}, botocore {result['botocore']}"


def run(requests: int, concurrency: int, repeat: int) -> tuple[dict[str, list[float]], str]:
    results: dict[str, list[float]] = {"tollway": [], "aiobotocore": []}
    versions = ""
    with tempfile.TemporaryDirectory(prefix="tollway-bench-bedrock-") as tmp:
        mock = start_server("mock", mock_command(1), r"mock listening on (\S+)", Path(tmp) / "mock.log")
        base = mock.url.rstrip("/")
        try:
            for _ in range(repeat):
                results["tollway"].append(uvloop.run(_tollway_cpu(base, requests, concurrency)))
                cpu, versions = _aiobotocore_cpu(base, requests, concurrency)
                results["aiobotocore"].append(cpu)
        finally:
            mock.stop()
    return results, versions


def _table(results: dict[str, list[float]], versions: str) -> list[str]:
    ours = statistics.median(results["tollway"])
    lines = ["| client | CPU per Converse call, median (min-max) | ratio to Tollway's path |", "|---|---|---|"]
    for name, values in results.items():
        us = [v * 1e6 for v in values]
        label = "Tollway: codec + SigV4 signer + `h1`" if name == "tollway" else f"aiobotocore `converse` ({versions})"
        ratio = statistics.median(values) / ours if ours > 0 else float("nan")
        lines.append(f"| {label} | {statistics.median(us):.0f} µs ({min(us):.0f}-{max(us):.0f}) | {ratio:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bedrock_clients", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured calls per client and repetition")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks sending at once")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (clients alternate in each)")
    parser.add_argument("--setup", action="store_true", help="create or update .venv-aiobotocore first")
    args = parser.parse_args(argv)
    if not (1 <= args.requests <= 1_000_000 and 1 <= args.concurrency <= 256 and 1 <= args.repeat <= 20):
        parser.error("--requests 1..1000000, --concurrency 1..256, --repeat 1..20")
    if args.setup:
        setup()
    if not _side_python().exists():
        parser.error("no .venv-aiobotocore: run with --setup once (it installs bench/requirements-aiobotocore.txt)")
    results, versions = run(args.requests, args.concurrency, args.repeat)
    print(f"{args.requests} calls per client and repetition, {args.concurrency} at once, {args.repeat} repetitions")
    print("\n".join(_table(results, versions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
