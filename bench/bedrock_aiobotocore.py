"""The aiobotocore side of ``bench.bedrock_clients``: run by the side environment's Python.

``python bench/bedrock_aiobotocore.py URL MODEL REQUESTS CONCURRENCY WARMUP`` sends buffered
Converse calls through aiobotocore's ``bedrock-runtime`` client to the mock at ``URL`` and prints
one JSON object: the CPU seconds per call (``time.process_time``, this process only) and the
versions. It imports nothing of Tollway, whose venv it cannot share (bench/requirements-aiobotocore.txt).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiobotocore
import botocore
import uvloop
from aiobotocore.session import get_session
from botocore.config import Config

MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": [{"text": "Say hello to the benchmark in five words."}]}]
SYSTEM: list[dict[str, Any]] = [{"text": "You are a concise assistant."}]


async def _run(url: str, model: str, requests: int, concurrency: int, warmup: int) -> float:
    session = get_session()
    config = Config(retries={"max_attempts": 1}, max_pool_connections=concurrency, tcp_keepalive=True)
    async with session.create_client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AKIDBENCHMARK",
        aws_secret_access_key="bench-secret",
        config=config,
    ) as client:

        async def call() -> None:
            answer = await client.converse(
                modelId=model,
                messages=MESSAGES,
                system=SYSTEM,
                inferenceConfig={"maxTokens": 64, "temperature": 0.0},
            )
            if not answer["output"]["message"]["content"]:
                raise RuntimeError("an empty answer")

        for _ in range(warmup):
            await call()

        async def worker(count: int) -> None:
            for _ in range(count):
                await call()

        share, extra = divmod(requests, concurrency)
        started = time.process_time()
        await asyncio.gather(*(worker(share + (1 if n < extra else 0)) for n in range(concurrency)))
        return (time.process_time() - started) / requests


def main() -> int:
    url, model, requests, concurrency, warmup = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    cpu = uvloop.run(_run(url, model, requests, concurrency, warmup))
    print(json.dumps({"cpu_s_per_call": cpu, "aiobotocore": aiobotocore.__version__, "botocore": botocore.__version__}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
