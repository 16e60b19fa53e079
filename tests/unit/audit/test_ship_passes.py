"""Where the ship process runs its passes: a SCHED_IDLE thread, and the main thread when that one falls behind."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

from tollway.audit.ship import process as ship_process
from tollway.audit.ship.process import _Directory, _IdleThread, _Passes
from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import SinkUnavailable

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


def _platform_allows_sched_idle() -> bool:
    """Whether a thread here may enter SCHED_IDLE (a seccomp profile or libc may refuse it)."""
    if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
        return False
    allowed: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return allowed == [True]


@pytest.fixture
def idle() -> Iterator[_IdleThread]:
    if not _platform_allows_sched_idle():
        pytest.skip("this platform refuses SCHED_IDLE to any thread")
    runner = _IdleThread.start()
    assert runner is not None, "the platform allows SCHED_IDLE, but no idle thread started"
    yield runner
    runner.close()


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
    passes = _Passes(idle, budget_s=0.05, hold_s=0.0)
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
def test_the_main_thread_keeps_shipping_for_the_hold_even_when_caught_up(idle: _IdleThread) -> None:
    directory = FakeDirectory()
    directory.shipper.slow = True
    passes = _Passes(idle, budget_s=0.02, hold_s=60.0)
    passes.run(dirs_of(directory))
    assert passes.boosted
    directory.shipper.slow = False
    for _ in range(3):
        passes.run(dirs_of(directory))  # caught up, but within the hold: no flapping back
    assert passes.boosted
    assert [thread for thread, _ in directory.shipper.calls[1:]] == [threading.get_native_id()] * 3


@linux_only
def test_a_hand_over_soon_after_a_hand_back_doubles_the_hold(idle: _IdleThread) -> None:
    directory = FakeDirectory()
    passes = _Passes(idle, budget_s=0.02, hold_s=0.01)
    for expected_hold in (0.01, 0.02, 0.04):
        directory.shipper.slow = True
        passes.run(dirs_of(directory))
        assert passes.boosted and passes.hold_s == pytest.approx(expected_hold)
        directory.shipper.slow = False
        time.sleep(expected_hold * 1.5)
        passes.run(dirs_of(directory))
        assert not passes.boosted
    assert passes.handovers == 3


@linux_only
def test_prepare_runs_on_the_callers_thread_before_each_idle_pass(idle: _IdleThread) -> None:
    directory = FakeDirectory()
    prepared: list[int] = []
    passes = _Passes(idle, prepare=lambda: prepared.append(threading.get_native_id()))
    passes.run(dirs_of(directory))
    passes.run(dirs_of(directory))
    assert prepared == [threading.get_native_id()] * 2
    assert [thread for thread, _ in directory.shipper.calls] == [idle.native_id] * 2

    def unavailable() -> None:
        raise SinkUnavailable("Kafka at 127.0.0.1:1 is unavailable: NoBrokersAvailable")

    refused = _Passes(idle, prepare=unavailable)
    assert refused.run(dirs_of(directory)) is False
    assert len(directory.shipper.calls) == 2, "a pass ran without its sink"


@dataclass(frozen=True)
class Record:
    sequence: int
    payload: bytes


class EndlessWal:
    """A WalSource that always has more: every read returns a full batch."""

    def __init__(self) -> None:
        self.acked = 0
        self.caught_up = False

    def read(self, after_seq: int, max_records: int, max_bytes: int) -> Sequence[Record]:
        return [Record(after_seq + i + 1, b'{"kind":"request_admitted"}') for i in range(max_records)]

    def acknowledge(self, seq: int) -> None:
        self.acked = seq


class SlowSink:
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sends = 0

    def send(self, batch: list[bytes]) -> None:
        time.sleep(self.delay_s)
        self.sends += 1


@linux_only
def test_a_real_shipper_past_its_deadline_hands_over(idle: _IdleThread, tmp_path: Any) -> None:
    directory = _Directory(tmp_path, SlowSink(0.02), 4, 1 << 20)
    directory.shipper = Shipper(
        EndlessWal(), directory._sink, batch_records=4, batch_bytes=1 << 20, idle_s=0, max_backoff_s=1
    )
    passes = _Passes(idle, budget_s=0.1, hold_s=0.0)
    assert passes.run([directory])
    assert directory.shipper.more, "the drain stopped at its deadline without saying records are left"
    assert passes.boosted and passes.handovers == 1
    assert 1 <= directory._sink.sends < 64, "the deadline did not stop the drain between reads"


def test_close_ends_the_idle_thread(idle: _IdleThread) -> None:
    idle.close()
    idle._thread.join(5)
    assert not idle._thread.is_alive()


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
