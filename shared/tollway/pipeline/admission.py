"""Admission: in-flight permits, a bounded FIFO queue, and shedding while the event loop lags.

Admission comes first in the pipeline, before the body is read: a request the process cannot
serve costs one comparison and an error envelope, never a parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from tollway.config.root import PublishedRoot
from tollway.exceptions import Overloaded

__all__ = ["Admission"]

log = logging.getLogger("tollway.runtime")


@dataclass(slots=True)
class Admission:
    """Fail-fast in-flight permits: buffered requests and streams have separate pools.

    Counting permits alone does not shed a CPU-bound process: when the event loop is saturated,
    requests wait in socket buffers and the loop's ready queue, not in flight, so the permit
    count stays low while latency climbs. So admission also sheds while the loop lags, a
    rejection costing far less CPU than serving the request. :meth:`monitor_loop_lag` samples how
    late a timer fires and :meth:`observe_loop` judges the samples:

    - **Only lag of the process's own making counts.** A sample's *own* lag is the CPU time the
      loop thread used during the sample beyond the timer's interval (at most its lateness): the
      work it ran while the timer waited. A loop late because a CPU was busy with another
      process used little CPU meanwhile and scores about 0: shedding would not give it the CPU
      back, it would only fail requests it can serve. A loop that ran its own work for at least
      ``BUSY_SHARE`` of the sample is busy, and scores its whole lateness: that is the wait its
      requests see, whether the CPU it got was a whole core or the share a crowded host gives it
      (in the overload profile two workers, two load generators and the mock share two cores,
      and scoring a busy worker only its CPU time shed 4.5 % at 4,000 RPS while 29 % timed out).
      Below that share, it scores only the CPU it used beyond the interval.
    - **Sustained, never one sample.** The judged lag is the median own lag of the last
      ``LAG_SAMPLES`` samples: three of five must be over the limit, so a GC pause, one long
      callback or one burst of requests does not shed.
    - **Prompt once confirmed.** For ``LAG_HOLD_S`` after the median was over the limit, one
      sample over it is enough again: a saturated loop that shed, drained and fills up again goes
      back to shedding at its first late sample, not after a new backlog of three.

    Time the loop thread spends blocked (a synchronous system call) counts like time waiting for
    a CPU: not its own. :meth:`acquire` compares the judged lag with ``max_loop_lag_s``, one
    comparison on the request path; everything else runs in the monitor, off it.
    """

    LAG_SAMPLES: ClassVar[int] = 5
    LAG_HOLD_S: ClassVar[float] = 1.0
    BUSY_SHARE: ClassVar[float] = 0.25

    requests: int = 0
    streams: int = 0
    _waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    """Requests queued for a request permit, oldest first (only with ``maxQueuedRequests`` > 0)."""
    loop_lag_s: float = 0.0
    """The judged event-loop lag, in seconds of the process's own work (0 until
    :meth:`monitor_loop_lag` runs); ``/healthz`` shows it as ``loop_lag_ms``."""
    _own_lags: deque[float] = field(default_factory=lambda: deque(maxlen=Admission.LAG_SAMPLES), init=False)
    _held_lag_s: float = field(default=0.0, init=False)
    """The largest median of about the last ``LAG_HOLD_S``: a single sample never judges above it."""
    _held_at: float = field(default=float("-inf"), init=False)
    shed_lag: int = 0
    """Requests rejected because of loop lag, since start."""
    _lag_logged_at: float = field(default=float("-inf"), init=False)
    """When a loop-lag shed was last logged: at most one line a second, however many are shed."""

    def acquire(self, root: PublishedRoot) -> None:
        """Take a request permit before the body is read or parsed."""
        limits = root.limits
        if self.requests >= limits.max_concurrent_requests:
            raise self._overloaded(root)
        if self.loop_lag_s > limits.max_loop_lag_s:
            self.shed_lag += 1
            now = time.monotonic()
            if now - self._lag_logged_at >= 1.0:
                self._lag_logged_at = now
                log.warning(
                    "event-loop lag %.0f ms is over maxEventLoopLagMs (%.0f ms): new requests get %d "
                    "(%d shed for lag since start)",
                    self.loop_lag_s * 1000,
                    limits.max_loop_lag_s * 1000,
                    limits.overload_status,
                    self.shed_lag,
                )
            raise self._overloaded(root)
        self.requests += 1

    async def enter(self, root: PublishedRoot) -> None:
        """:meth:`acquire`, or with a configured queue, wait for a permit in FIFO order up to
        ``maxQueueWaitMs``; a full queue or a wait past its deadline is the overload answer."""
        limits = root.limits
        try:
            self.acquire(root)
            return
        except Overloaded:
            if not limits.max_queued_requests or self.loop_lag_s > limits.max_loop_lag_s:
                raise
            if len(self._waiting) >= limits.max_queued_requests:
                raise
        handoff: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(handoff)
        try:
            await asyncio.wait_for(asyncio.shield(handoff), limits.max_queue_wait_s)
        except TimeoutError:
            if not handoff.done():
                raise self._overloaded(root) from None
        except asyncio.CancelledError:
            if handoff.done() and not handoff.cancelled():
                self.release(False)  # the permit was handed over as the caller left: pass it on
            raise
        finally:
            if not handoff.done():
                handoff.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(handoff)

    async def monitor_loop_lag(self, interval_s: float = 0.01) -> None:
        """Sample the event loop every ``interval_s`` until cancelled (off the request path): how
        long its timer took, and how much CPU the loop's thread (this one) used meanwhile."""
        while True:
            wall, cpu = time.monotonic(), time.thread_time()
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            self.observe_loop(interval_s, now - wall, time.thread_time() - cpu, now)

    def observe_loop(self, interval_s: float, wall_s: float, cpu_s: float, now: float) -> None:
        """Judge one sample into ``loop_lag_s``: a timer of ``interval_s`` fired after ``wall_s``,
        while the loop thread used ``cpu_s`` of CPU; ``now`` is monotonic time, for the hold."""
        busy = cpu_s >= self.BUSY_SHARE * wall_s
        own = max(0.0, (wall_s if busy else min(wall_s, cpu_s)) - interval_s)
        lags = self._own_lags
        lags.append(own)
        median = sorted(lags)[len(lags) // 2] if len(lags) == lags.maxlen else 0.0
        if median >= self._held_lag_s or now - self._held_at > self.LAG_HOLD_S:
            self._held_lag_s, self._held_at = median, now
        self.loop_lag_s = max(median, min(own, self._held_lag_s))

    @property
    def queued(self) -> int:
        """Requests waiting for a request permit."""
        return len(self._waiting)

    def acquire_stream(self, root: PublishedRoot) -> None:
        """Take a stream permit as well, once the request is known to stream."""
        if self.streams >= root.limits.max_concurrent_streams:
            raise self._overloaded(root)
        self.streams += 1

    @staticmethod
    def _overloaded(root: PublishedRoot) -> Overloaded:
        return Overloaded(retry_after=1, status=root.limits.overload_status)

    def release(self, stream: bool) -> None:
        if stream:
            self.streams -= 1
        while self._waiting:  # hand the request permit straight to the oldest waiter
            handoff = self._waiting.popleft()
            if not handoff.done():
                handoff.set_result(None)
                return
        self.requests -= 1
