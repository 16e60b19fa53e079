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
from tollway.pipeline.admission import Admission
from tollway.secrets import SecretResolver


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
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the clock runtime's log limit reads
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


INTERVAL = 0.01


class Samples:
    """Feeds an ``Admission`` the samples its monitor would take, on a clock of its own."""

    def __init__(self, adm: Admission) -> None:
        self.adm, self.now = adm, 1000.0

    def feed(self, count: int, late_s: float, cpu_share: float = 1.0) -> None:
        """``count`` samples whose timer fired ``late_s`` late, the loop thread on a CPU for
        ``cpu_share`` of each (1.0: busy with its own work; about 0: waiting while others ran)."""
        for _ in range(count):
            wall = INTERVAL + late_s
            self.now += wall
            self.adm.observe_loop(INTERVAL, wall, wall * cpu_share, self.now)

    def wait(self, seconds: float) -> None:
        self.now += seconds


def admits(adm: Admission, root: PublishedRoot) -> bool:
    try:
        adm.acquire(root)
    except Overloaded:
        return False
    adm.release(stream=False)
    return True


def test_a_single_late_sample_does_not_shed(tmp_path: Path) -> None:
    """A GC pause, one long callback, one burst of requests: however late, one timer never sheds."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    samples = Samples(adm)
    samples.feed(10, late_s=0.0005)
    samples.feed(1, late_s=0.5)
    assert admits(adm, root)
    samples.feed(1, late_s=0.0005)
    samples.feed(1, late_s=0.5)  # two of the last five: still not the median
    assert admits(adm, root)
    assert adm.shed_lag == 0


def test_sustained_lag_from_the_loops_own_work_sheds(tmp_path: Path) -> None:
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    samples = Samples(adm)
    samples.feed(5, late_s=0.0005)
    samples.feed(2, late_s=0.08)
    assert admits(adm, root)
    samples.feed(1, late_s=0.08)  # three of the last five
    assert not admits(adm, root)
    assert adm.loop_lag_s == pytest.approx(0.08)  # what /healthz shows as loop_lag_ms
    samples.feed(3, late_s=0.0005)
    assert admits(adm, root)  # drained: the median is back under the limit
    assert adm.shed_lag == 1


def test_lag_while_another_process_has_the_cpu_does_not_shed(tmp_path: Path) -> None:
    """Late timers with the loop thread hardly on a CPU: the host is busy, not this process."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    samples = Samples(adm)
    samples.feed(50, late_s=0.06, cpu_share=0.1)
    assert admits(adm, root)
    assert adm.loop_lag_s == 0.0
    assert adm.shed_lag == 0


def test_a_busy_loop_on_part_of_a_core_sheds_on_the_wait_its_requests_see(tmp_path: Path) -> None:
    """Busy on half a core (a crowded host): its whole lateness counts, as its requests wait that long."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    samples = Samples(adm)
    samples.feed(5, late_s=0.04, cpu_share=0.5)
    assert admits(adm, root)
    samples.feed(5, late_s=0.08, cpu_share=0.5)
    assert not admits(adm, root)


def test_a_loop_below_the_busy_share_counts_only_its_own_cpu(tmp_path: Path) -> None:
    """A fifth of a core used while 200 ms late: 32 ms of its own work, under the limit."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    Samples(adm).feed(5, late_s=0.2, cpu_share=0.2)
    assert admits(adm, root)


def test_once_sustained_one_late_sample_sheds_again_for_a_second(tmp_path: Path) -> None:
    """A saturated loop that shed and drained goes back to shedding at its first late sample."""
    root = compile_root(tmp_path, admission={"maxEventLoopLagMs": 50})
    adm = Admission()
    samples = Samples(adm)
    samples.feed(5, late_s=0.08)
    assert not admits(adm, root)
    samples.feed(5, late_s=0.0005)
    assert admits(adm, root)
    samples.feed(1, late_s=0.07)
    assert not admits(adm, root)
    samples.feed(5, late_s=0.0005)
    samples.wait(Admission.LAG_HOLD_S)
    samples.feed(1, late_s=0.0005)
    samples.feed(1, late_s=0.07)  # the hold is over: one sample is one sample again
    assert admits(adm, root)


def _spin_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_the_monitor_measures_a_loop_busy_with_its_own_work_and_recovers() -> None:
    adm = Admission()
    task = asyncio.ensure_future(adm.monitor_loop_lag(interval_s=0.005))
    try:
        for _ in range(40):  # CPU-bound callbacks of 30 ms, the monitor's timer between them
            _spin_cpu(0.03)
            await asyncio.sleep(0)
            if adm.loop_lag_s >= 0.02:
                break
        assert adm.loop_lag_s >= 0.02
        for _ in range(200):
            await asyncio.sleep(0.005)
            if adm.loop_lag_s < 0.02:
                break
        assert adm.loop_lag_s < 0.02
    finally:
        task.cancel()


async def test_the_monitor_does_not_count_time_the_loop_thread_was_not_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blocked thread (here ``time.sleep``) is what a thread waiting for a CPU looks like to it."""
    seen: list[float] = []
    observe = Admission.observe_loop

    def spy(adm: Admission, interval_s: float, wall_s: float, cpu_s: float, now: float) -> None:
        seen.append(wall_s - interval_s)
        observe(adm, interval_s, wall_s, cpu_s, now)

    monkeypatch.setattr(Admission, "observe_loop", spy)
    adm = Admission()
    task = asyncio.ensure_future(adm.monitor_loop_lag(interval_s=0.005))
    try:
        for _ in range(40):
            time.sleep(0.03)
            await asyncio.sleep(0)
            if sum(late >= 0.02 for late in seen) > Admission.LAG_SAMPLES:
                break
        assert sum(late >= 0.02 for late in seen) > Admission.LAG_SAMPLES
        assert adm.loop_lag_s < 0.01
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
