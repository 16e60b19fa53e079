"""Admission: permit pools and event-loop-lag shedding, with a real compiled root."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tollway.config import load_config
from tollway.config.root import PublishedRoot, Publisher
from tollway.exceptions import ConfigError, Overloaded
from tollway.secrets import SecretResolver
from tollway.server import runtime
from tollway.server.runtime import Admission


def compile_root(tmp_path: Path, **router: Any) -> PublishedRoot:
    doc: dict[str, Any] = {
        "providers": {
            "p": {
                "type": "openai",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "group",
                "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_TEST_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "m-v1",
                "routes": [{"id": "r", "provider": "p", "model": "x", "providerFormat": "openai-chat-completions"}],
            }
        ],
        **router,
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(doc))
    env = {"TOLLWAY_TEST_PROVIDER_KEY": "sk-test"}
    return Publisher(resolver=SecretResolver(env=env)).publish(load_config(path, env=env))


def test_loop_lag_above_the_limit_sheds_with_the_configured_status(tmp_path: Path) -> None:
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 20, "overloadStatus": 429})
    adm = Admission()
    adm.loop_lag_s = 0.021
    with pytest.raises(Overloaded) as info:
        adm.acquire(root)
    assert info.value.status == 429
    assert info.value.retry_after == 1
    assert (adm.requests, adm.shed_lag) == (0, 1)
    adm.loop_lag_s = 0.019
    adm.acquire(root)
    assert adm.requests == 1


def test_lag_shedding_is_logged_at_most_once_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shed request is otherwise only counted: the log says when and why the gateway sheds."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    adm.loop_lag_s = 0.132
    clock = [1000.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock[0])
    with caplog.at_level("WARNING", logger="tollway.runtime"):
        for step in (0.0, 0.4, 0.5, 0.2):  # three sheds in the first second, one after it
            clock[0] += step
            with pytest.raises(Overloaded):
                adm.acquire(root)
    assert adm.shed_lag == 4
    assert [r.getMessage() for r in caplog.records] == [
        "event-loop lag 132 ms is over maxEventLoopLagMs (50 ms): new requests get 503 (1 shed for lag since start)",
        "event-loop lag 132 ms is over maxEventLoopLagMs (50 ms): new requests get 503 (4 shed for lag since start)",
    ]


def test_zero_turns_lag_shedding_off(tmp_path: Path) -> None:
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 0})
    adm = Admission()
    adm.loop_lag_s = 30.0
    adm.acquire(root)
    assert adm.requests == 1


def test_permit_pools_fail_fast_and_release(tmp_path: Path) -> None:
    root = compile_root(tmp_path, maxConcurrentRequests=2, maxConcurrentStreams=1)
    adm = Admission()
    adm.acquire(root)
    adm.acquire_stream(root)
    adm.acquire(root)
    with pytest.raises(Overloaded):
        adm.acquire_stream(root)
    with pytest.raises(Overloaded):
        adm.acquire(root)
    adm.release(stream=True)
    adm.release(stream=False)
    assert (adm.requests, adm.streams, adm.shed_lag) == (0, 0, 0)


@pytest.mark.parametrize("value", [-1, 60001])
def test_out_of_range_lag_limit_is_a_config_error(tmp_path: Path, value: int) -> None:
    with pytest.raises(ConfigError) as info:
        compile_root(tmp_path, admission={"maxEventLoopLagMs": value})
    assert [i.path for i in info.value.issues] == ["admission.maxEventLoopLagMs"]


async def test_monitor_measures_a_blocked_loop_and_recovers() -> None:
    adm = Admission()
    task = asyncio.ensure_future(adm.monitor_loop_lag(interval_s=0.005))
    try:
        await asyncio.sleep(0.02)
        time.sleep(0.15)  # block the loop, as a CPU-bound burst would
        await asyncio.sleep(0.001)
        await asyncio.sleep(0.001)
        assert adm.loop_lag_s >= 0.1
        for _ in range(200):
            await asyncio.sleep(0.005)
            if adm.loop_lag_s < 0.1:
                break
        assert adm.loop_lag_s < 0.1
    finally:
        task.cancel()


async def test_without_a_queue_admission_fails_fast(tmp_path: Path) -> None:
    root = compile_root(tmp_path, maxConcurrentRequests=1)
    adm = Admission()
    await adm.enter(root)
    started = time.monotonic()
    with pytest.raises(Overloaded):
        await adm.enter(root)
    assert time.monotonic() - started < 0.05
    assert adm.requests == 1


async def test_a_bounded_queue_hands_permits_over_in_order(tmp_path: Path) -> None:
    root = compile_root(tmp_path, maxConcurrentRequests=1, admission={"maxQueuedRequests": 2, "maxQueueWaitMs": 2000})
    adm = Admission()
    await adm.enter(root)
    second = asyncio.ensure_future(adm.enter(root))
    third = asyncio.ensure_future(adm.enter(root))
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded):  # the queue holds two
        await adm.enter(root)
    assert not second.done() and not third.done()
    adm.release(stream=False)
    await asyncio.wait_for(second, 1)
    assert not third.done()
    assert adm.requests == 1  # the permit moved, it was not counted twice
    adm.release(stream=False)
    await asyncio.wait_for(third, 1)
    adm.release(stream=False)
    assert adm.requests == 0


async def test_a_queued_request_gives_up_at_its_deadline(tmp_path: Path) -> None:
    root = compile_root(tmp_path, maxConcurrentRequests=1, admission={"maxQueuedRequests": 1, "maxQueueWaitMs": 100})
    adm = Admission()
    await adm.enter(root)
    started = time.monotonic()
    with pytest.raises(Overloaded):
        await adm.enter(root)
    assert 0.09 <= time.monotonic() - started < 1.0
    adm.release(stream=False)
    assert adm.requests == 0  # nobody was waiting any more: the permit simply returned


async def test_a_cancelled_waiter_leaves_the_queue(tmp_path: Path) -> None:
    root = compile_root(tmp_path, maxConcurrentRequests=1, admission={"maxQueuedRequests": 1, "maxQueueWaitMs": 5000})
    adm = Admission()
    await adm.enter(root)
    waiter = asyncio.ensure_future(adm.enter(root))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    later = asyncio.ensure_future(adm.enter(root))  # the queue has room again
    await asyncio.sleep(0.01)
    adm.release(stream=False)
    await asyncio.wait_for(later, 1)
    assert adm.requests == 1
