"""Where the ship process runs its passes: a SCHED_IDLE thread, and the main thread when that one falls behind."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, cast

import pytest

from tollway.audit import ship_process
from tollway.audit.ship_process import _Directory, _IdleThread, _Passes

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is a Linux policy")


class FakeShipper:
    """Records where and with what deadline each drain ran; ``slow`` drains run to their deadline."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float | None]] = []
        self.more = False
        self.slow = False
        self.stop_early_with_more = False

    def drain_once(self, deadline: float | None = None) -> int:
        self.calls.append((threading.get_native_id(), deadline))
        if self.slow and deadline is not None:
            while time.monotonic() < deadline:
                time.sleep(0.005)
            self.more = True
        else:
            self.more = self.stop_early_with_more
        return 1


class FakeDirectory:
    def __init__(self) -> None:
        self.shipper = FakeShipper()

    def ready(self) -> bool:
        return True


def dirs_of(*fakes: FakeDirectory) -> list[_Directory]:
    return cast(list[_Directory], list(fakes))


@pytest.fixture
def idle() -> _IdleThread:
    runner = _IdleThread.start()
    if runner is None:
        pytest.fail("SCHED_IDLE was refused on Linux, where an unprivileged thread may always enter it")
    return runner


@linux_only
def test_the_idle_thread_alone_is_at_sched_idle(idle: _IdleThread) -> None:
    assert idle.native_id is not None
    assert os.sched_getscheduler(idle.native_id) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE, "the policy leaked to the caller's thread"


@linux_only
def test_jobs_run_on_the_idle_thread_and_their_errors_reach_the_caller(idle: _IdleThread) -> None:
    ran_on: list[int] = []

    def job() -> bool:
        ran_on.append(threading.get_native_id())
        return True

    assert idle.run(job) is True
    assert ran_on == [idle.native_id]

    def broken() -> bool:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        idle.run(broken)
    assert idle.run(lambda: False) is False, "the thread did not survive a failed job"


@linux_only
def test_a_starved_pass_hands_shipping_to_the_main_thread_until_caught_up(idle: _IdleThread) -> None:
    directory = FakeDirectory()
    shipper = directory.shipper
    passes = _Passes(idle, budget_s=0.05)
    main = threading.get_native_id()

    assert passes.run(dirs_of(directory))
    (thread, deadline) = shipper.calls[-1]
    assert thread == idle.native_id and deadline is not None, "a pass at idle priority must have a deadline"
    assert not passes.boosted

    shipper.slow = True  # the pass runs out its budget with records left: the cores are saturated
    passes.run(dirs_of(directory))
    assert passes.boosted and passes.handovers == 1

    shipper.slow, shipper.stop_early_with_more = False, True  # the main thread ships, still behind
    passes.run(dirs_of(directory))
    assert shipper.calls[-1] == (main, None)
    assert passes.boosted, "handed back before catching up"

    shipper.stop_early_with_more = False  # caught up: back to the idle thread from the next pass
    passes.run(dirs_of(directory))
    assert shipper.calls[-1] == (main, None)
    assert not passes.boosted
    passes.run(dirs_of(directory))
    assert shipper.calls[-1][0] == idle.native_id
    assert passes.handovers == 1


@linux_only
def test_a_pass_that_stops_at_its_read_limit_within_budget_stays_idle(idle: _IdleThread) -> None:
    directory = FakeDirectory()
    directory.shipper.stop_early_with_more = True  # a large backlog, but the idle thread keeps up
    passes = _Passes(idle, budget_s=5.0)
    passes.run(dirs_of(directory))
    passes.run(dirs_of(directory))
    assert not passes.boosted
    assert [thread for thread, _ in directory.shipper.calls] == [idle.native_id] * 2


def test_without_an_idle_thread_passes_run_on_the_callers_thread() -> None:
    directory = FakeDirectory()
    passes = _Passes(None)
    assert passes.run(dirs_of(directory))
    assert directory.shipper.calls == [(threading.get_native_id(), None)]


def test_no_idle_thread_where_the_platform_has_no_sched_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "SCHED_IDLE", raising=False)
    assert _IdleThread.start() is None


def test_a_refused_policy_leaves_no_idle_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise PermissionError("not here")

    monkeypatch.setattr(ship_process.os, "SCHED_IDLE", 5, raising=False)
    monkeypatch.setattr(ship_process.os, "sched_setscheduler", refuse, raising=False)
    monkeypatch.setattr(ship_process.os, "sched_param", lambda priority: priority, raising=False)
    assert _IdleThread.start() is None
