"""A busy host at low load: a process spinning on the gateway's core must not make it shed.

Event-loop-lag shedding is for a loop saturated by its own requests. A gateway that shares its
core with a busy process sees late timers as well, while it keeps up with its load; rejecting
requests there would only fail them. Here the gateway, the competitor and the test's client
share one core (the mock provider runs anywhere), and the gateway runs at nice 10, as a process
on a host with busier ones does: the competitor gets most of the core whenever both want it, so
the gateway's timers come in tens to hundreds of milliseconds late, far over
``maxEventLoopLagMs``, while 40 requests at a time are still work it gets through. The rule that
judged the last sample's lag shed about half of these requests.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.e2e.conftest import PROVIDER_KEY_ENV, build_config
from tests.support.processes import Gateway, Proc, new_key, start_gateway, start_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins processes to a core (Linux)"),
]

REQUESTS = 80
CONCURRENCY = 40
GATEWAY_NICE = 10
SPIN_LIMIT_S = 90
"""The competitor stops by itself after this long, should the fixture's kill never come."""

_SPIN = f"""
import os, time
os.sched_setaffinity(0, {{int(os.environ["TOLLWAY_SPIN_CORE"])}})
print("spinning", flush=True)
end = time.monotonic() + {SPIN_LIMIT_S}
while time.monotonic() < end:
    pass
"""


@pytest.fixture(scope="module")
def pinned_gateway(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A 1-worker gateway of this module's own (it gets pinned and reniced), default admission settings."""
    key, digest = new_key()
    cfg = build_config(mock_provider.url, {"team-a": digest, "team-b": new_key()[1]})
    assert "admission" not in cfg  # maxEventLoopLagMs stays at its default, 50 ms
    path: Path = tmp_path_factory.mktemp("busy-host") / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-e2e-provider-credential"}, workers=1)
    gw.keys = {"team-a": key}
    yield gw
    gw.proc.stop()


def _threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (affinity is per thread; new threads inherit it)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # a thread that just ended
            pass


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def busy_core(pinned_gateway: Gateway, tmp_path: Path) -> Iterator[Proc]:
    """A process spinning on the gateway's core for the test's duration, killed at its end.

    The gateway and this test's thread are pinned to that core meanwhile, and the gateway's
    threads get nice 10 (not undone: lowering it again needs privileges; the gateway is this
    module's own).
    """
    pid = pinned_gateway.proc.proc.pid
    before, mine = os.sched_getaffinity(pid), os.sched_getaffinity(0)
    core = min(before)
    spin = start_process(
        [sys.executable, "-c", _SPIN], r"(spinning)", tmp_path / "spin.log", {"TOLLWAY_SPIN_CORE": str(core)}
    )
    try:
        _pin(pid, {core})
        for tid in _threads(pid):
            os.setpriority(os.PRIO_PROCESS, tid, GATEWAY_NICE)
        os.sched_setaffinity(0, {core})
        yield spin
    finally:
        os.sched_setaffinity(0, mine)
        spin.proc.kill()
        spin.stop()
        _pin(pid, before)


async def test_a_busy_core_does_not_make_a_lightly_loaded_gateway_shed(
    pinned_gateway: Gateway, busy_core: Proc
) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)
    client = openai.AsyncOpenAI(
        base_url=pinned_gateway.base_url, api_key=pinned_gateway.keys["team-a"], max_retries=0, timeout=20
    )

    async def one(i: int) -> int:
        async with limit:
            raw = await client.chat.completions.with_raw_response.create(
                model="chat-fast-v1", messages=[{"role": "user", "content": f"request {i} on a busy host"}]
            )
            assert f"request {i} on a busy host" in (raw.parse().choices[0].message.content or "")
            return raw.status_code

    spin_cpu, started = _cpu_s(busy_core.proc.pid), time.monotonic()
    try:
        results = await asyncio.gather(*(one(i) for i in range(REQUESTS)), return_exceptions=True)
    finally:
        await client.close()
    spun = (_cpu_s(busy_core.proc.pid) - spin_cpu) / (time.monotonic() - started)
    health = httpx.get(pinned_gateway.base_url.removesuffix("/v1") + "/healthz", timeout=5).json()
    failed = [repr(r) for r in results if r != 200]
    assert not failed, f"{len(failed)} of {REQUESTS} not answered 200 ({failed[:3]}); /healthz: {health}"
    assert health["pid"] == pinned_gateway.proc.proc.pid  # the process that was pinned served them
    assert health["shed_for_loop_lag"] == 0
    assert spun > 0.2, f"the competitor used only {spun:.0%} of a core: the host was not busy"
