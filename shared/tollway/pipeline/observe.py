"""What the pipeline tells telemetry: one request's metrics when it ends, and its spans when traced.

Everything is read once, at the request's end, from what the request path records anyway (the
call, its attempt records, its usage and cost), so the request path itself carries no metric
code: with metrics and tracing off there is no :class:`Observer` at all, and with them on a
request pays one pass over its attempts plus the instruments' updates. A sampled request also
gets a few timestamps (``RequestTrace.mark``) and its spans are built here, after the answer.

Label values come from the published root (alias, route and deployment ids), from the gateway's
own enumerations (status class, error codes, outcomes, provider formats), never from the
client's input or the provider's text. The model name a client asked for is a label only once
it resolved to an alias; before that the alias label is empty.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Protocol

from tollway.pipeline.stage import Call
from tollway.telemetry.logs import trace_id_var

if TYPE_CHECKING:
    from tollway.pipeline.stages.pii import PiiState
    from tollway.telemetry.metrics import GatewayMetrics
    from tollway.telemetry.tracing import Tracer

__all__ = ["Observer"]

log = logging.getLogger("tollway.telemetry")

_STATUS_CLASS: Final = ("1xx", "1xx", "2xx", "3xx", "4xx", "5xx")
_BUDGET_CODES: Final = frozenset({"budget_exceeded", "rate_limited", "budget_unavailable"})
_OPERATION: Final = "chat"
"""``gen_ai.operation.name`` before an alias is resolved; after, the alias's (``chat``, ``embeddings``)."""
OVERHEAD_HEADER: Final = "x-tollway-overhead-ms"


class _Headers(Protocol):
    def get(self, key: str, /) -> str | None: ...


def _status_class(status: int) -> str:
    return _STATUS_CLASS[min(status // 100, 5)]


class Observer:
    """One process's telemetry on the request path: its metrics and its tracer, either may be off."""

    __slots__ = ("metrics", "overhead_header", "tracer")

    def __init__(self, metrics: GatewayMetrics | None, tracer: Tracer | None, *, overhead_header: bool = False) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self.overhead_header = overhead_header
        """Answer with ``x-tollway-overhead-ms``: the time the gateway added so far."""

    def start(self, call: Call, headers: _Headers) -> None:
        """At the request's start: decide whether it is traced (the tracer honours a client's
        ``traceparent`` only when its config says so)."""
        tracer = self.tracer
        if tracer is not None:
            trace = call.trace = tracer.start(headers.get("traceparent"))
            if trace is not None:  # the request's log lines carry it (the HTTP layer resets it)
                trace_id_var.set(trace.trace_id_hex)

    @staticmethod
    def overhead_s(call: Call, now: float) -> float:
        """The time the gateway added up to ``now``: the time since the request arrived, less the
        time its attempts waited on providers (an open stream's attempt counts up to its first
        event, which is when its headers leave)."""
        ctx = call.ctx
        waited = 0.0
        if ctx is not None:
            for a in ctx.attempts:
                if a.ended is not None:
                    waited += a.ended - a.started
                elif a.first_event_s is not None:
                    waited += a.first_event_s
                else:
                    waited += now - a.started
        return max(0.0, now - call.started - waited)

    def overhead_headers(self, call: Call, now: float) -> dict[str, str]:
        return {OVERHEAD_HEADER: f"{self.overhead_s(call, now) * 1000:.3f}"}

    def finish(self, call: Call, now: float) -> None:
        """The request ended at ``now``: record it. Never raises (telemetry must not fail a request)."""
        try:
            if self.metrics is not None:
                self._record(self.metrics, call, now)
            if call.trace is not None and self.tracer is not None:
                self._trace(self.tracer, call, now)
        except Exception:
            log.exception("telemetry for request %s failed", call.request_id)

    @staticmethod
    def _record(m: GatewayMetrics, call: Call, now: float) -> None:  # noqa: C901 - one flat pass over the request
        plan = call.alias
        alias = plan.name if plan is not None else ""
        op = plan.operation if plan is not None else _OPERATION
        status = call.status
        klass = _status_class(status)
        code = call.code or ("client_disconnected" if status == 499 else "")
        stream = "true" if call.stream else "false"
        duration = now - call.started
        m.requests.child(alias, op, stream, klass, code).inc()
        m.request_duration.child(op, alias, klass, code).observe(duration)
        if code in _BUDGET_CODES:
            m.budget_rejections.child(alias, code).inc()
        if call.pii is not None:
            _record_pii(m, alias, call.pii)
        if status == 499:
            m.client_disconnects.child(alias, "streaming" if call.committed_at else "before_answer").inc()
        if call.cut is not None:
            m.stream_terminations.child(alias, call.cut).inc()
        ctx = call.ctx
        if ctx is None:
            return
        waited = 0.0
        routes: set[str] = set()
        retries = fallbacks = 0
        answered = ""
        for a in ctx.attempts:
            ended = a.ended if a.ended is not None else now
            took = ended - a.started
            waited += took
            routes.add(a.route_id)
            provider = a.provider_name
            category = a.error_category or ""
            m.attempts.child(alias, a.route_id, provider, a.outcome, category).inc()
            m.provider_duration.child(op, alias, provider, a.route_id, category).observe(took)
            if a.first_event_s is not None:
                m.provider_ttft.child(op, alias, provider, a.route_id).observe(a.first_event_s)
            if a.outcome == "cancelled":
                m.upstream_cancellations.child(alias, a.route_id).inc()
            if a.reason == "retry":
                retries += 1
            elif a.reason == "fallback":
                fallbacks += 1
            if a.outcome in ("ok", "midstream_error"):
                answered = provider
        if retries:
            m.retries.child(alias, "retry").inc(retries)
        if fallbacks:
            m.retries.child(alias, "fallback").inc(fallbacks)
        if len(routes) > 1:  # the depth of requests that fell back; the rest are requests_total less these
            m.fallback_depth.child(alias).observe(len(routes) - 1)
        m.overhead.child(alias, op, stream).observe(max(0.0, duration - waited))
        if call.committed_at:
            m.time_to_first_token.child(op, alias).observe(call.committed_at - call.started)
            m.stream_duration.child(alias, "ok" if status == 200 else code or klass).observe(now - call.committed_at)
        if call.stream and call.committed_at:
            m.stream_permit_hold.child(alias).observe(now - ctx.received)
        usage = ctx.usage
        if usage is not None and answered:
            m.token_usage.child(op, alias, answered, "input").observe(usage.prompt_tokens)
            m.token_usage.child(op, alias, answered, "output").observe(usage.completion_tokens)
            tokens = m.tokens
            tokens.child(alias, "input").inc(usage.prompt_tokens)
            tokens.child(alias, "output").inc(usage.completion_tokens)
            if usage.cached_prompt_tokens:
                tokens.child(alias, "cached").inc(usage.cached_prompt_tokens)
            if usage.cache_creation_tokens:
                tokens.child(alias, "cache_creation").inc(usage.cache_creation_tokens)
            if usage.reasoning_tokens:
                tokens.child(alias, "reasoning").inc(usage.reasoning_tokens)
        cost = call.cost
        if cost is not None and cost.micro_usd:
            m.cost.child(alias, "estimated").inc(cost.micro_usd / 1e6)

    @staticmethod
    def _trace(tracer: Tracer, call: Call, now: float) -> None:
        from tollway.telemetry.tracing import AttemptInfo, RequestInfo

        trace = call.trace
        assert trace is not None
        ctx = call.ctx
        attempts: list[AttemptInfo] = []
        usage = ctx.usage if ctx is not None else None
        retries = fallbacks = 0
        if ctx is not None:
            for a in ctx.attempts:
                answered = a.outcome in ("ok", "midstream_error")
                attempts.append(
                    AttemptInfo(
                        number=a.number,
                        route_id=a.route_id,
                        deployment_id=a.deployment_id,
                        provider_name=a.provider_name,
                        reason=a.reason,
                        started=a.started,
                        ended=a.ended if a.ended is not None else now,
                        first_event_s=a.first_event_s,
                        outcome=a.outcome,
                        error_category=a.error_category,
                        upstream_status=a.upstream_status,
                        input_tokens=usage.prompt_tokens if usage is not None and answered else None,
                        output_tokens=usage.completion_tokens if usage is not None and answered else None,
                        stream=bool(call.stream),
                    )
                )
                retries += a.reason == "retry"
                fallbacks += a.reason == "fallback"
        plan = call.alias
        tracer.finish(
            trace,
            RequestInfo(
                request_id=call.request_id,
                alias=plan.name if plan is not None else "",
                operation=plan.operation if plan is not None else _OPERATION,
                stream=bool(call.stream),
                status=call.status,
                error_code=call.code or ("client_disconnected" if call.status == 499 else None),
                ended=now,
                attempts=attempts,
                input_tokens=usage.prompt_tokens if usage is not None else None,
                output_tokens=usage.completion_tokens if usage is not None else None,
                retries=retries,
                fallbacks=fallbacks,
            ),
        )


def _record_pii(m: GatewayMetrics, alias: str, state: PiiState) -> None:
    """Counts only: never a value, a placeholder or a token id as a label."""
    for kind, n in state.tokenized.counts.items():
        m.pii_values.child(alias, kind).inc(n)
    o = state.outcomes
    for outcome, n in (
        ("exact", o.exact),
        ("left_masked", o.left_masked),
        ("near_miss", o.near_miss),
        ("omitted", state.omitted),
    ):
        if n:
            m.pii_recoveries.child(alias, outcome).inc(n)
