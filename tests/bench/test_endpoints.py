"""Every endpoint kind against a real mock and gateway, as a run builds them: the gateway accepts
the bodies and headers the harness sends, calls the mock endpoint the direct baseline calls, and
the load generator's client reads each answer as complete (with a first token when streamed).

It checks formats and routing, never speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.clients import Http1Client
from bench.endpoints import ENDPOINTS
from bench.profiles import Profile
from bench.run import Runner

pytestmark = pytest.mark.e2e

STEPS: list[dict[str, Any]] = [
    {"name": "messages-sse", "endpoint": "messages", "stream": True, "rate": 5},
    {"name": "messages-buffered", "endpoint": "messages", "rate": 5},
    {"name": "responses-sse", "endpoint": "responses", "stream": True, "rate": 5},
    {"name": "responses-buffered", "endpoint": "responses", "rate": 5},
    {"name": "chat-sse", "stream": True, "rate": 5},
    {"name": "embeddings", "endpoint": "embeddings", "payload": "embed-batch", "rate": 5},
]
UPSTREAM_FORMAT = {"chat": "openai", "messages": "anthropic", "embeddings": "openai-embeddings"}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    profile = Profile.model_validate(
        {"name": "endpoints", "mock": {"faults": "chunks=3"}, "gateway": {"workers": 1}, "steps": STEPS}
    )
    args = argparse.Namespace(quiet=True, knee=None, knee_from=None, repeat=1, peers=[], py_spy=False)
    run = Runner(profile, Path("endpoints.yml"), "0" * 64, tmp_path_factory.mktemp("endpoints"), args)
    try:
        run.start()
        yield run
    finally:
        run.stop()


def last_mock_request(run: Runner) -> dict[str, Any]:
    assert run.mock is not None
    with urllib.request.urlopen(run.mock.url + "/_mock/requests", timeout=10) as resp:
        records: list[dict[str, Any]] = json.loads(resp.read())
    return records[-1]


async def send_once(url: str, body: bytes, headers: dict[str, str], stream: bool, kind: str) -> Any:
    client = Http1Client(url, body, headers, stream, ENDPOINTS[kind])
    try:
        return await asyncio.wait_for(client.send(time.monotonic()), 10)
    finally:
        await client.aclose()


@pytest.mark.parametrize("target", ["direct", "gateway"])
@pytest.mark.parametrize("name", [s["name"] for s in STEPS])
def test_each_endpoint_is_answered_in_its_format_from_the_matching_mock_endpoint(
    runner: Runner, name: str, target: str
) -> None:
    (step,) = [s for s in runner.profile.steps if s.name == name]
    spec = runner._spec(target, step, step.rate or 1.0)
    status, ttft, complete, code = asyncio.run(
        send_once(spec.url, spec.body, dict(spec.headers), spec.stream, spec.endpoint)
    )
    assert (status, code) == (200, None)
    assert complete
    assert (ttft is not None) is step.stream
    upstream = ENDPOINTS[step.endpoint].upstream
    assert spec.endpoint == (upstream if target == "direct" else step.endpoint)
    record = last_mock_request(runner)
    assert record["path"].endswith("/v1/" + ENDPOINTS[upstream].path)
    assert record["format"] == UPSTREAM_FORMAT[upstream]
    assert record["stream"] is step.stream
    assert record["status"] == 200
