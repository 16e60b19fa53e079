"""What one gateway process holds: the active root, its publisher, admission counters, reload.

Reload compiles a candidate off the request path and swaps it in with one assignment. A
candidate that fails to load, validate or compile leaves the active root in place, and the
log says why (the issue paths, never a secret value).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tollway.audit.pipeline import AuditPipeline
from tollway.config.loader import load_config_with_warnings
from tollway.config.root import PublishedRoot, Publisher, RootHolder
from tollway.config.schema import AuditConfig, CorsConfig, GovernanceConfig
from tollway.exceptions import ConfigError, ConfigIssue, Overloaded, TollwayError
from tollway.gateway import Gateway
from tollway.governance.lease_stores import DynamoDBLeaseStore, LeaseStore, LeaseStoreSettings, MemoryLeaseStore
from tollway.governance.leases import LeasePolicy, LocalLedger
from tollway.governance.meter import Governor

if TYPE_CHECKING:
    from tollway.metering import UsageLedger

__all__ = ["Admission", "GatewayRuntime"]

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

    def acquire_stream(self, root: PublishedRoot) -> None:
        """Take a stream permit as well, once the request is known to stream."""
        if self.streams >= root.limits.max_concurrent_streams:
            raise self._overloaded(root)
        self.streams += 1

    @staticmethod
    def _overloaded(root: PublishedRoot) -> Overloaded:
        err = Overloaded(retry_after=1)
        err.status = root.limits.overload_status
        return err

    def release(self, stream: bool) -> None:
        if stream:
            self.streams -= 1
        while self._waiting:  # hand the request permit straight to the oldest waiter
            handoff = self._waiting.popleft()
            if not handoff.done():
                handoff.set_result(None)
                return
        self.requests -= 1


@dataclass
class GatewayRuntime:
    config_path: Path
    publisher: Publisher
    holder: RootHolder
    gateway: Gateway = field(default_factory=Gateway)
    admission: Admission = field(default_factory=Admission)
    audit: AuditPipeline | None = None
    audit_config: AuditConfig = field(default_factory=AuditConfig)
    """The ``audit:`` block as loaded at start; the WAL and sink are per process, so a reload does not change them."""
    governance_config: GovernanceConfig = field(default_factory=GovernanceConfig)
    """The ``governance:`` block as loaded at start: the lease store and the pricing source are per
    process; policies, budgets and quota groups reload with the root."""
    cors_config: CorsConfig = field(default_factory=CorsConfig)
    """The ``cors:`` block as loaded at start: middleware is fixed when the app is built."""
    _usage_ledger: UsageLedger | None = None
    _stamp: tuple[float, int] | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def load(cls, config_path: Path) -> GatewayRuntime:
        """Load and publish the first root; an invalid file is fatal at start."""
        publisher = Publisher(config_dir=config_path.parent)
        stamp = cls._stat(config_path)
        cfg, warnings = load_config_with_warnings(config_path)
        root = publisher.publish(cfg)
        _log_warnings(warnings)
        # One replica holding the whole limit as its lease cannot overshoot anyone: with the
        # in-process store the lease is the limit, so no request waits on a refill.
        fraction = 1.0 if cfg.governance.store == "memory" else cfg.governance.leaseFraction
        governor = Governor(LocalLedger(_lease_store(cfg.governance), LeasePolicy(fraction=fraction)))
        runtime = cls(
            config_path=config_path,
            publisher=publisher,
            holder=RootHolder(root),
            gateway=Gateway(governor=governor),
            audit_config=cfg.audit,
            governance_config=cfg.governance,
            cors_config=cfg.cors,
        )
        runtime._stamp = stamp  # taken before the read, so a write during start-up is seen by the watch
        return runtime

    def usage_ledger(self) -> UsageLedger | None:
        """The usage ledger ``GET /v1/usage`` reads (``$TOLLWAY_TABLE_USAGE_LEDGER``), built on first use."""
        if self._usage_ledger is None and os.environ.get("TOLLWAY_TABLE_USAGE_LEDGER"):
            from tollway.metering import DynamoDBUsageLedger

            self._usage_ledger = DynamoDBUsageLedger.from_env()
        return self._usage_ledger

    async def warm(self) -> None:
        """Start-up work that would otherwise land on the first requests: the lease store's client."""
        store = self.governor.ledger.store
        if isinstance(store, DynamoDBLeaseStore):
            try:
                await store.warm()
            except Exception as exc:  # a store that is down now fails closed per request later
                log.warning("quota-leases store not reachable at start: %s", type(exc).__name__)

    @property
    def governor(self) -> Governor:
        governor = self.gateway.governor
        assert governor is not None
        return governor

    async def watch_pricing(self) -> None:
        """Poll the pricing store's pointer; install a new snapshot as a pricing-only root."""
        pricing = self.governance_config.pricing
        if not pricing.bucket:
            return
        from tollway.pricing import SnapshotLoader
        from tollway.pricing.s3 import S3SnapshotStore, StoreSettings

        settings = StoreSettings(
            bucket=pricing.bucket,
            prefix=pricing.prefix,
            endpoint=os.environ.get("AWS_ENDPOINT_URL") or None,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        )
        loader: SnapshotLoader | None = None
        while True:
            try:
                if loader is None:
                    loader = SnapshotLoader(
                        await asyncio.to_thread(S3SnapshotStore.from_settings, settings), prefix=pricing.prefix
                    )
                if await asyncio.to_thread(loader.reload) and loader.current is not None:
                    async with self._reload_lock:
                        self.holder.swap(self.publisher.with_pricing(self.holder.root, loader.current))
                    log.info("pricing snapshot %s active", loader.current.version)
            except TollwayError as exc:
                log.warning("pricing refresh failed; the last valid snapshot stays active: %s", type(exc).__name__)
            await asyncio.sleep(pricing.refreshIntervalMs / 1000)

    @staticmethod
    def _stat(path: Path) -> tuple[float, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def _file_stamp(self) -> tuple[float, int] | None:
        return self._stat(self.config_path)

    async def reload(self) -> bool:
        """Compile the file again; swap on success, keep the active root on any failure."""
        async with self._reload_lock:
            return await self._reload()

    async def _reload(self) -> bool:
        active = self.holder.root
        try:
            cfg, warnings = await asyncio.to_thread(load_config_with_warnings, self.config_path)
            candidate = self.publisher.publish(cfg)
        except ConfigError as exc:
            log.error(
                "config reload rejected; generation %d stays active: %s",
                active.generation,
                "; ".join(str(i) for i in exc.issues),
            )
            return False
        except OSError as exc:
            log.error(
                "config reload failed to read the file (%s); generation %d stays active",
                exc.strerror,
                active.generation,
            )
            return False
        if candidate.digest == active.digest and candidate.pricing.version == active.pricing.version:
            return True
        old = self.holder.swap(candidate)
        log.info("config generation %d active (digest %s)", candidate.generation, candidate.digest[:12])
        _log_warnings(warnings)
        task = asyncio.ensure_future(self.publisher.retire(old, candidate))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def watch(self, interval_s: float = 1.0) -> None:
        """Poll the file's mtime and size; reload when they change."""
        while True:
            await asyncio.sleep(interval_s)
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                await self.reload()

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.governor.ledger.aclose()  # gives unused lease units back to the shared store
        store = self.governor.ledger.store
        if isinstance(store, DynamoDBLeaseStore):
            store.close()
        await self.publisher.aclose()


def _log_warnings(warnings: list[ConfigIssue]) -> None:
    for issue in warnings:
        log.warning("config warning: %s", issue)


def _lease_store(gov: GovernanceConfig) -> LeaseStore:
    if gov.store == "dynamodb":
        return DynamoDBLeaseStore(LeaseStoreSettings.from_env(table=gov.table or None))
    return MemoryLeaseStore()
