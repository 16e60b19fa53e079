"""The process-level half of the metrics: gauges and state read once a second, and ``/metrics``.

What a request does is recorded when it ends (:mod:`tollway.pipeline.observe`). What a process
*is* (requests and streams in flight, queued requests, the active configuration's generation,
circuit transitions, the audit WAL's depth, commit wait and shipping lag) is read here, off the
request path, by one task per process: a circuit transition costs one increment where it
happens and nothing more, and no request touches a gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from tollway.exceptions import GatewayError, PermissionDenied
from tollway.metering.query import ADMIN_ROLE
from tollway.server.http import error_response, pipeline_of, runtime_of
from tollway.telemetry.metrics import GatewayMetrics, render_latest

if TYPE_CHECKING:
    from tollway.server.runtime import GatewayRuntime

__all__ = ["Sampler", "metrics_endpoint"]

log = logging.getLogger("tollway.telemetry")


class Sampler:
    """Copies one process's state into its gauges, and its cumulative counts into counters."""

    def __init__(self, runtime: GatewayRuntime, metrics: GatewayMetrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self._transitions: dict[tuple[str, str], int] = {}
        self._wal_wait = (0, 0.0)

    def sample(self) -> None:
        rt, m = self.runtime, self.metrics
        adm = rt.admission
        m.active.child().set(adm.requests)
        m.queued.child().set(adm.queued)
        m.streams_active.child().set(adm.streams)
        m.config_generation.child().set(rt.holder.root.generation)
        for deployment, health in rt.publisher.health.snapshot().items():
            health.circuit_state()  # an open circuit whose cool-down passed turns half-open when asked
            for state, count in health.breaker.transitions.items():
                key = (deployment, state.value)
                seen = self._transitions.get(key, 0)
                if count > seen:
                    m.circuit_changes.child(deployment, state.value).inc(count - seen)
                    self._transitions[key] = count
        audit = rt.audit
        if audit is not None:
            wal = audit.writer.stats()
            m.wal_depth.child().set(wal["bytes_on_disk"])
            m.wal_pending.child().set(wal["pending_records"])
            count, total = int(wal["commit_wait_count"]), float(wal["commit_wait_sum_s"])
            seen_count, seen_total = self._wal_wait
            if count > seen_count:
                m.wal_commits.child().inc(count - seen_count)
                m.wal_commit_wait.child().inc(max(0.0, total - seen_total))
                self._wal_wait = (count, total)
            acked = audit.acked()
            if acked is not None:
                m.shipper_lag.child().set(max(0, int(wal["durable_watermark"]) - acked))
        m.flush()

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a gauge that cannot be read this second is read the next
                log.exception("metrics sample failed")
            await asyncio.sleep(interval_s)


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics`` on the gateway's own listener: the Prometheus text format, every worker's
    values aggregated. Under ``access: admin`` only a key with the admin role is answered."""
    runtime = runtime_of(request)
    if runtime.telemetry_config.metrics.access == "admin":
        pipeline = pipeline_of(request)
        try:
            principal = pipeline.authenticate(request.headers.getlist("authorization"), pipeline.holder.root)
            if ADMIN_ROLE not in principal.roles:
                raise PermissionDenied("This endpoint needs the admin role.")
        except GatewayError as err:
            return error_response(err)
    if runtime.metrics is not None:
        runtime.metrics.flush()  # on the loop, which records: the batches are not locked
    body, content_type = await asyncio.to_thread(render_latest, runtime.metrics)
    return Response(body, media_type=None, headers={"content-type": content_type})


def start_sampler(runtime: GatewayRuntime, tasks: list[asyncio.Future[Any]]) -> None:
    if runtime.metrics is not None:
        sampler = Sampler(runtime, runtime.metrics)
        with contextlib.suppress(Exception):
            sampler.sample()
        tasks.append(asyncio.ensure_future(sampler.run()))
