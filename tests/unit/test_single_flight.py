"""SingleFlight: one background fetch at a time, joined by every caller, its failures stamped."""

from __future__ import annotations

import threading

import pytest

from tollway.single_flight import SingleFlight


def test_callers_join_the_fetch_in_flight_which_runs_in_its_own_thread() -> None:
    gate, threads = threading.Event(), []

    def fetch() -> int:
        threads.append(threading.current_thread().name)
        assert gate.wait(10), "the test never released the fetch"
        return len(threads)

    flight = SingleFlight(fetch, name="test-fetch", clock=lambda: 0.0)
    first, second = flight.start(), flight.start()
    assert first is second and flight.inflight is first
    gate.set()
    assert first.result(timeout=10) == 1
    assert threads == ["test-fetch"] and flight.failed_at is None
    third = flight.start()  # the first one is over: a new fetch
    assert third is not first and third.result(timeout=10) == 2


def test_a_failure_is_stamped_and_a_success_clears_it() -> None:
    now, fail = [100.0], [True]

    def fetch() -> str:
        if fail[0]:
            raise ConnectionError("down")
        return "ok"

    flight = SingleFlight(fetch, name="test-fetch", clock=lambda: now[0])
    with pytest.raises(ConnectionError):
        flight.start().result(timeout=10)
    assert flight.inflight is None and flight.failed_at == 100.0
    now[0] = 109.0
    assert flight.failed_within(10.0) and not flight.failed_within(9.0)
    assert flight.start_unless_failed_within(10.0) is None and flight.inflight is None
    fail[0] = False
    now[0] = 111.0
    started = flight.start_unless_failed_within(10.0)
    assert started is not None and started.result(timeout=10) == "ok"
    assert flight.start().result(timeout=10) == "ok"
    assert flight.failed_at is None and not flight.failed_within(10.0)
