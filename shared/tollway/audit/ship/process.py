"""Server mode's audit shipper, as its own process: ``python -m tollway.audit.ship.process``.

``tollway serve`` (and ``tollway up``) start one next to the gateway's workers when the audit trail
is on. It drains every ``worker-<N>`` WAL under the spool directory into the sink, the way the
Lambda extension does on Lambda, so the sink client (boto3, kafka-python) and its threads never
compete with a worker's event loop for the GIL. Measured: shipping to SQS inside the worker cost
the gateway +0.58 ms of CPU per request at 500 RPS, and moving it out cut the median added P50
from +3.57 to +2.69 ms (docs/benchmarks.md).

- One reader per directory: a ``ship.lock`` flock, so two shippers (an orphan and its successor
  after a crash) never interleave acknowledgements; a locked directory is skipped and retried.
- Orphans: once a minute it also adopts any other WAL directory under the root that no process
  writes or ships (a ``worker-<N>`` that a smaller ``--workers`` no longer starts), ships what it
  holds, for at most 2 s a pass, and deletes it a day later (:mod:`tollway.audit.wal.dirs`).
- Parent death: when the gateway process (``--parent``, default the one that started it) is gone,
  it drains once more and exits, so a killed gateway leaves no shipper behind.
- SIGTERM / SIGINT: a last drain within ``--stop-timeout``, then exit 0.
- A sink failure acknowledges nothing (the records stay in the WAL) and backs off, doubling to 5 s.
- Pacing: after a pass that caught up with every writer it waits ``sink.flushIntervalMs``; after a
  pass that stopped at a drain's read limit (64 reads of ``sink.batchSize``) it goes on at once, so a
  backlog left by a sink outage drains as fast as the sink takes it.
- It runs at a lower CPU priority: shipping is background work that can wait a few milliseconds,
  a request cannot. The process runs at niceness 10 (``--nice``), and on Linux its regular passes
  run on a thread at ``SCHED_IDLE`` (``--idle``, the default), which takes a core only when no
  ordinary thread wants it, apart from a sliver: a niceness lowers a share, ``SCHED_IDLE`` steps
  aside (see :class:`_IdleThread`). A pass there stops at the first read after its budget
  (:data:`IDLE_PASS_BUDGET_S`); one that stopped with records left, because the cores are
  saturated or a backlog is large, hands shipping to the main thread, at the process's niceness,
  until a pass catches up and for at least :data:`HAND_OVER_HOLD_S` (doubling while hand-overs
  repeat): the WAL holds what is not shipped yet (bounded by ``spool.maxBytes``), and shipping
  never stops for good. On saturated cores the read in progress at the budget can itself take
  seconds to finish at idle priority. Orphan passes and the last drain at exit run on the main
  thread. ``audit.sink.shipPriority: low`` (or ``--no-idle``) ships at the niceness alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from tollway.audit.pipeline import build_sink, wal_root
from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import KafkaSink, SinkUnavailable
from tollway.audit.wal import WalError, WalReader
from tollway.audit.wal.dirs import ORPHAN_IDLE_S, ORPHAN_RETIRE_S, ShipLock, ship_orphans
from tollway.pids import alive

__all__ = ["main"]

log = logging.getLogger("tollway.audit.ship")
_MAX_BACKOFF_S = 5.0
ORPHAN_SCAN_S = 60.0
IDLE_PASS_BUDGET_S: Final = 1.0
"""How long a pass on the idle thread may run before it stops at its next read and the main thread
ships until caught up. At 500 RPS a pass ships half a second of events in tens of milliseconds."""
HAND_OVER_HOLD_S: Final = 5.0
"""How long the main thread keeps shipping after a hand-over, at least; doubled, up to
:data:`HAND_OVER_MAX_HOLD_S`, when the next hand-over comes within that long of the hand-back, so a
shipper on busy cores does not flap between the threads."""
HAND_OVER_MAX_HOLD_S: Final = 60.0


class _Directory:
    """One worker's WAL: its shipper, once the directory exists and its lock is ours."""

    def __init__(self, path: Path, sink: Any, batch_records: int, batch_bytes: int) -> None:
        self.path = path
        self._sink, self._records, self._bytes = sink, batch_records, batch_bytes
        self._lock = ShipLock(path)
        self.shipper: Shipper | None = None

    def ready(self) -> bool:
        if self.shipper is not None:
            return True
        if not self._lock.acquire():
            return False  # the worker has not opened its WAL yet, or another shipper still holds it
        self.shipper = Shipper(
            WalReader(self.path),
            self._sink,
            batch_records=self._records,
            batch_bytes=self._bytes,
            idle_s=0.0,
            max_backoff_s=_MAX_BACKOFF_S,
        )
        return True

    def close(self) -> None:
        self._lock.release()


def _drain_all(dirs: list[_Directory], deadline: float | None = None) -> bool:
    """One pass over every directory; False if any sink call failed."""
    ok = True
    for d in dirs:
        if not d.ready() or d.shipper is None:
            continue
        try:
            d.shipper.drain_once(deadline)
        except (SinkUnavailable, WalError) as exc:
            log.warning("audit shipper %s: %s", d.path.name, type(exc).__name__)
            ok = False
    return ok


def _behind(dirs: list[_Directory]) -> bool:
    """Whether a directory's last drain stopped with records left (its read limit or deadline)."""
    return any(d.shipper is not None and d.shipper.more for d in dirs)


class _IdleThread:
    """A thread at Linux's ``SCHED_IDLE`` policy that runs the ship process's passes, one at a time.

    Niceness only shrinks a thread's share of a busy core: when a worker wakes while a niced
    shipper runs, the scheduler may still let the shipper finish its slice. A ``SCHED_IDLE`` thread
    has a weight of 3 against 1024 at niceness 0 (15 at niceness 19): it takes a core when no
    ordinary thread wants it, apart from a sliver, and a waking worker preempts it at once.
    The policy is per thread, and an unprivileged thread can enter it but not leave it (that takes
    ``RLIMIT_NICE`` or ``CAP_SYS_NICE``): so the idle policy lives on this thread, and the main
    thread keeps the process's niceness to take over when this one is starved.

    Threads inherit their creator's policy. kafka-python's producer starts its I/O thread when it
    is built, so the ship process builds it on the main thread (``_Passes``' ``prepare``): a
    hand-over would not help if the I/O thread were idle too.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: Callable[[], bool] | None = None
        self._result: bool | BaseException = False
        self._ready = threading.Event()
        self._closed = False
        self.idle = False
        self._thread = threading.Thread(target=self._main, name="audit-ship-idle", daemon=True)

    @classmethod
    def start(cls) -> _IdleThread | None:
        """The running thread, or ``None`` where ``SCHED_IDLE`` is unavailable or refused (not Linux)."""
        if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
            return None
        runner = cls()
        runner._thread.start()
        runner._ready.wait()
        return runner if runner.idle else None

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def _main(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread, on Linux
            self.idle = True
        except OSError as exc:
            log.info("audit shipper: SCHED_IDLE refused (%s); shipping at the process's niceness", exc)
        finally:
            self._ready.set()  # whatever happened: start() must not wait forever
        while self.idle:
            with self._cond:
                while self._job is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._job
                assert job is not None
            try:
                result: bool | BaseException = job()
            except BaseException as exc:  # handed to the caller, which raises it
                result = exc
            with self._cond:
                self._job, self._result = None, result
                self._cond.notify_all()

    def run(self, job: Callable[[], bool]) -> bool:
        """Run ``job`` on this thread and return its result (or raise what it raised)."""
        with self._cond:
            self._job = job
            self._cond.notify_all()
            while self._job is not None:
                self._cond.wait()
            result = self._result
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        """End the thread once its current job (if any) is done."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Passes:
    """Where each pass runs: on the idle thread while its passes keep up, else on the caller's thread.

    A pass on the idle thread has a deadline of ``budget_s`` (checked before each read). One that
    ran that long and left records (the cores are saturated, or a backlog is larger than a pass,
    or the sink is slow) hands shipping to the caller's thread, which runs full passes until one
    catches up and ``hold_s`` has passed, then hands back. A hand-over within
    :data:`HAND_OVER_MAX_HOLD_S` of the last hand-back doubles the hold (up to that bound); a
    sink that keeps failing keeps shipping on the caller's thread, as ``shipPriority: low`` would.
    ``prepare`` runs on the caller's thread before each idle pass: it builds what starts threads
    of its own (kafka-python's producer), so they do not inherit the idle policy.
    """

    def __init__(
        self,
        idle: _IdleThread | None,
        *,
        budget_s: float = IDLE_PASS_BUDGET_S,
        hold_s: float = HAND_OVER_HOLD_S,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        self._idle = idle
        self._budget_s = budget_s
        self._base_hold_s = hold_s
        self.hold_s = hold_s
        """The hold of the latest hand-over."""
        self._prepare = prepare
        self.boosted = False
        """Passes run on the caller's thread until one catches up and the hold has passed."""
        self._boosted_until = 0.0
        self._handed_back_at: float | None = None
        self.handovers = 0

    def run(self, dirs: list[_Directory]) -> bool:
        """One pass over ``dirs``; False if a sink call failed."""
        idle = self._idle
        if idle is None or self.boosted:
            ok = _drain_all(dirs)
            if self.boosted and ok and not _behind(dirs) and time.monotonic() >= self._boosted_until:
                self.boosted = False
                self._handed_back_at = time.monotonic()
                log.info("audit shipper: caught up; shipping at idle priority again")
            return ok
        if self._prepare is not None:
            try:
                self._prepare()
            except SinkUnavailable as exc:
                log.warning("audit shipper: %s", type(exc).__name__)
                return False
        started = time.monotonic()
        ok = idle.run(lambda: _drain_all(dirs, started + self._budget_s))
        ended = time.monotonic()
        if _behind(dirs) and ended - started >= self._budget_s:
            recent = self._handed_back_at is not None and ended - self._handed_back_at < HAND_OVER_MAX_HOLD_S
            self.hold_s = min(HAND_OVER_MAX_HOLD_S, self.hold_s * 2) if recent else self._base_hold_s
            self.boosted = True
            self._boosted_until = ended + self.hold_s
            self.handovers += 1
            log.info(
                "audit shipper: a pass at idle priority ran %.2f s and left records; shipping at the "
                "process's priority for at least %.0f s, until caught up",
                ended - started,
                self.hold_s,
            )
        return ok

    def close(self) -> None:
        if self._idle is not None:
            self._idle.close()


def _ship_orphans(
    root: Path,
    dirs: list[_Directory],
    sink: Any,
    batch_records: int,
    batch_bytes: int,
    idle_s: float,
    retire_s: float,
    drained: dict[Path, float],
) -> bool:
    """One orphan pass; False if the sink failed. Nothing an orphan does may end the ship process."""
    try:
        ship_orphans(
            root,
            sink,
            own=[d.path for d in dirs],
            batch_records=batch_records,
            batch_bytes=batch_bytes,
            idle_s=idle_s,
            retire_after_s=retire_s,
            drained=drained,
        )
    except SinkUnavailable as exc:
        log.warning("audit shipper (orphans): %s", type(exc).__name__)
        return False
    except Exception:
        log.exception("audit shipper: the orphan pass failed")
    return True


def run(
    config_path: Path,
    workers: int,
    *,
    parent: int,
    stop: threading.Event,
    stop_timeout_s: float = 10.0,
    orphan_scan_s: float = ORPHAN_SCAN_S,
    orphan_idle_s: float = ORPHAN_IDLE_S,
    orphan_retire_s: float = ORPHAN_RETIRE_S,
    idle: bool | None = None,
) -> int:
    """Ship until ``stop`` or the parent's death. ``idle``: ship from a ``SCHED_IDLE`` thread
    (``None``: as ``audit.sink.shipPriority`` says)."""
    from tollway.config.loader import load_config

    cfg = load_config(config_path).audit
    if cfg.sink.type == "none":
        return 0
    sink = build_sink(cfg)
    root = wal_root(cfg)
    batch_records, batch_bytes = cfg.sink.batchSize, cfg.spool.maxBatchBytes
    dirs = [_Directory(root / f"worker-{i}", sink, batch_records, batch_bytes) for i in range(workers)]
    interval = cfg.sink.flushIntervalMs / 1000
    backoff = 0.0
    next_orphan_scan = time.monotonic()
    drained: dict[Path, float] = {}
    if idle is None:
        idle = cfg.sink.shipPriority == "idle"
    passes = _Passes(
        _IdleThread.start() if idle else None, prepare=sink.connect if isinstance(sink, KafkaSink) else None
    )
    try:
        while not stop.is_set():
            if not alive(parent):
                log.info("audit shipper: the gateway is gone; last drain")
                break
            ok = passes.run(dirs)
            if ok and time.monotonic() >= next_orphan_scan:
                next_orphan_scan = time.monotonic() + orphan_scan_s
                ok = _ship_orphans(
                    root, dirs, sink, batch_records, batch_bytes, orphan_idle_s, orphan_retire_s, drained
                )
            if ok:
                backoff = 0.0
                # A backlog (after a sink outage, or a burst beyond max_rounds reads a pass) is
                # drained pass after pass; the interval only paces a ship process that has caught up.
                wait = 0.0 if _behind(dirs) else interval
            else:
                backoff = min(_MAX_BACKOFF_S, backoff * 2 if backoff else 0.1)
                wait = backoff
            stop.wait(wait)
        _drain_all(dirs, time.monotonic() + stop_timeout_s)
    finally:
        passes.close()
        for d in dirs:
            d.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tollway.audit.ship.process", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--parent", type=int, default=None, help="exit when this process is gone (default: ours)")
    parser.add_argument(
        "--orphan-idle-s",
        type=float,
        default=ORPHAN_IDLE_S,
        help="adopt another WAL directory once it has been unchanged this long (seconds)",
    )
    parser.add_argument(
        "--orphan-retire-s",
        type=float,
        default=ORPHAN_RETIRE_S,
        help="delete an adopted, fully shipped directory once it has been unchanged this long (seconds)",
    )
    parser.add_argument(
        "--orphan-scan-s", type=float, default=ORPHAN_SCAN_S, help="how often to look for such directories (seconds)"
    )
    parser.add_argument("--nice", type=int, default=10, help="lower this process's CPU priority by this much (0: not)")
    parser.add_argument(
        "--idle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ship from a SCHED_IDLE thread where Linux allows it, at --nice when it falls behind "
        "(default: audit.sink.shipPriority, idle unless set to low)",
    )
    args = parser.parse_args(argv)
    if args.nice > 0:
        try:
            os.nice(args.nice)
        except OSError:  # a platform or sandbox that refuses it: ship at normal priority
            pass
    from tollway.telemetry.logs import configure_logging, env_log_format

    configure_logging("info", fmt=env_log_format(), stream=sys.stderr)  # JSON lines, as the gateway writes them
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(
        args.config,
        max(1, args.workers),
        parent=args.parent or os.getppid(),
        stop=stop,
        orphan_scan_s=max(0.1, args.orphan_scan_s),
        orphan_idle_s=max(0.0, args.orphan_idle_s),
        orphan_retire_s=max(0.0, args.orphan_retire_s),
        idle=args.idle,
    )


if __name__ == "__main__":
    raise SystemExit(main())
