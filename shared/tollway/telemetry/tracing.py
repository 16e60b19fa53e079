"""Request tracing: a sampled request's spans, built when it ends and exported over OTLP/HTTP.

Why retroactively: a live OpenTelemetry span costs a context attach, locks and attribute
validation at every step, and an unsampled request would still pay for the tracer's checks. Here
the request path pays one ``start`` (a sampling decision; ``None`` for an unsampled request, after
which nothing more is done for it) and, for a sampled one, a few :meth:`RequestTrace.mark` calls
that store ``time.monotonic()``. When the request ends, :meth:`Tracer.finish` builds every span
as a finished ``ReadableSpan`` with explicit ids and wall-clock times (monotonic plus one offset
taken at ``start``), and hands them to a ``BatchSpanProcessor`` whose thread exports them.

The span tree (names are fixed):

- ``<operation> <alias>`` (SERVER; ``chat`` alone when no alias resolved): the request; its parent
  is the client's ``traceparent`` when that is honoured. Events ``tollway.retry`` and
  ``tollway.fallback`` mark where an attempt of that reason started.
- ``tollway.auth_policy``: start to mark ``resolved`` (authenticate, admit, decode, resolve).
- ``tollway.quota_reservation``: mark ``resolved`` to mark ``stages_before`` (the before stages).
- ``tollway.route_selection``: mark ``stages_before`` to the first attempt's start.
- ``<operation> <alias>`` (CLIENT), one per attempt, with the GenAI semantic-convention
  attributes; a streamed attempt that reached its first event has ``tollway.first_token_wait``
  (start to first event) and, since a stream commits at its first event, ``tollway.stream_transfer``
  (first event to the attempt's end).
- ``tollway.usage_settlement``: mark ``finish_start`` to mark ``finish_end``.

Attribute values are only ids the configuration defined (alias, route, deployment, provider
format), the gateway's request id, error codes and categories, outcomes, statuses and counts: never
a prompt, a completion, a principal or session id, a provider's request id or its error text.

Drops: the tracer holds at most ``maxQueueSize`` spans not yet exported (queued or in an export).
A request whose spans do not fit is dropped whole, never waited for, and counted through
``on_dropped``; the processor's own queue then never evicts an older span.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from tollway.telemetry.metrics import SEMCONV_VERSION

if TYPE_CHECKING:  # the config layer sits above this one: only its type is named here
    from tollway.config.schema import TracingConfig

__all__ = [
    "AttemptInfo",
    "RequestInfo",
    "RequestTrace",
    "Tracer",
    "format_traceparent",
    "parse_traceparent",
    "resolve_endpoint",
]

log = logging.getLogger("tollway.tracing")

_IDS = RandomIdGenerator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("tollway", schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_FAILED = frozenset({"error", "midstream_error"})


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """``(trace_id, parent_span_id, sampled)`` from a W3C trace-context ``traceparent``, or ``None``
    if it is invalid. A future version is read by its first four fields, as the spec asks."""
    if not value:
        return None
    value = value.strip(" \t")
    m = _TRACEPARENT.match(value)
    if m is None:
        return None
    version, trace_hex, span_hex, flags = m.groups()
    if version == "ff" or (len(value) != 55 if version == "00" else len(value) > 55 and value[55] != "-"):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def resolve_endpoint(configured: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP/HTTP traces URL: the configured one, else the standard OpenTelemetry variables."""
    if configured:
        return configured
    if traces := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/traces"
    return None


class RequestTrace:
    """What a sampled request records while it runs: ids and monotonic times, nothing else."""

    __slots__ = (
        "attempt_span_ids",
        "marks",
        "parent_span_id",
        "propagate",
        "sampled",
        "span_id",
        "started",
        "trace_id",
        "wall_offset_ns",
    )

    def __init__(self, trace_id: int, parent_span_id: int | None, *, propagate: bool = False) -> None:
        self.trace_id = trace_id
        self.span_id = _IDS.generate_span_id()
        self.parent_span_id = parent_span_id
        self.sampled = True
        self.propagate = propagate
        """Send :meth:`upstream_traceparent` to the provider (``propagateUpstream``)."""
        wall, self.started = time.time_ns(), time.monotonic()
        self.wall_offset_ns = wall - int(self.started * 1e9)
        self.marks: dict[str, float] = {}
        self.attempt_span_ids: dict[int, int] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def upstream_traceparent(self, attempt_number: int) -> str:
        """The ``traceparent`` for an attempt's provider call; the attempt's span gets that span id."""
        span_id = self.attempt_span_ids.get(attempt_number)
        if span_id is None:
            span_id = self.attempt_span_ids[attempt_number] = _IDS.generate_span_id()
        return format_traceparent(self.trace_id, span_id, self.sampled)


@dataclass(slots=True)
class AttemptInfo:
    number: int
    route_id: str
    deployment_id: str
    provider_name: str
    reason: str | None
    started: float
    ended: float | None
    first_event_s: float | None
    outcome: str
    error_category: str | None = None
    upstream_status: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    stream: bool = False


@dataclass(slots=True)
class RequestInfo:
    request_id: str
    alias: str
    operation: str
    stream: bool
    status: int
    error_code: str | None
    ended: float
    attempts: list[AttemptInfo]
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int = 0
    fallbacks: int = 0


class _BoundedExporter(SpanExporter):
    """Counts the spans handed to the processor and not yet through an export, up to ``limit``."""

    def __init__(self, inner: SpanExporter, limit: int) -> None:
        self._inner, self.limit = inner, limit
        self._reset()
        reset = weakref.WeakMethod(self._reset)
        os.register_at_fork(after_in_child=lambda: (r := reset()) is not None and r())

    def _reset(self) -> None:
        """Also in a forked child, whose processor starts with an empty queue."""
        self.held, self._lock = 0, threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            return self._inner.export(spans)
        finally:
            with self._lock:
                self.held -= len(spans)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class Tracer:
    """Decides sampling when a request starts and exports its spans when it ends."""

    def __init__(
        self,
        cfg: TracingConfig,
        resource: Resource,
        exporter: SpanExporter,
        *,
        on_dropped: Callable[[int], None] | None = None,
        synchronous: bool = False,
    ) -> None:
        """``synchronous`` exports each span on the calling thread (tests); otherwise a batch thread does."""
        self._exporter = bounded = _BoundedExporter(exporter, cfg.maxQueueSize)
        batch = min(512, cfg.maxQueueSize)
        self._processor: SpanProcessor = (
            SimpleSpanProcessor(bounded)
            if synchronous
            else BatchSpanProcessor(bounded, cfg.maxQueueSize, None, batch, export_timeout_millis=cfg.exportTimeoutMs)
        )
        self._resource = resource
        self._bound = round(cfg.sampleRatio * 2**64)
        self._honour = cfg.honourTraceparent
        self._propagate = cfg.propagateUpstream
        self._on_dropped = on_dropped
        self._closed = False
        self.dropped = 0
        self.failed = 0
        """Requests whose spans were lost to an error (a bug; the first is logged)."""

    @classmethod
    def from_config(
        cls,
        cfg: TracingConfig,
        *,
        environment: str,
        on_dropped: Callable[[int], None] | None = None,
        exporter: SpanExporter | None = None,
        synchronous: bool = False,
    ) -> Tracer | None:
        """``None`` when tracing is off. ``exporter`` replaces the OTLP/HTTP one (tests)."""
        if not cfg.enabled:
            return None
        if exporter is None:
            endpoint = resolve_endpoint(cfg.endpoint)
            if endpoint is None:
                raise ValueError(
                    "telemetry.tracing is enabled but has no endpoint: set telemetry.tracing.endpoint, "
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint, timeout=cfg.exportTimeoutMs / 1000)
        resource = Resource.create({"service.name": cfg.serviceName, "deployment.environment.name": environment})
        return cls(cfg, resource, exporter, on_dropped=on_dropped, synchronous=synchronous)

    def start(self, traceparent: str | None) -> RequestTrace | None:
        """A :class:`RequestTrace` if this request is sampled, else ``None`` (and nothing more to do)."""
        if self._honour and traceparent:
            parent = parse_traceparent(traceparent)
            if parent is not None:
                return RequestTrace(parent[0], parent[1], propagate=self._propagate) if parent[2] else None
        if not self._bound:
            return None
        trace_id = _IDS.generate_trace_id()
        if (trace_id & 0xFFFFFFFFFFFFFFFF) >= self._bound:
            return None
        return RequestTrace(trace_id, None, propagate=self._propagate)

    def finish(self, trace: RequestTrace, info: RequestInfo) -> None:
        """Build the request's spans and queue them for export; never raises, never waits."""
        try:
            spans = _Build(trace, info, self._resource).spans()
            if self._closed or not self._exporter.take(len(spans)):
                self.dropped += len(spans)
                if self._on_dropped is not None:
                    self._on_dropped(len(spans))
                return
            for span in spans:
                self._processor.on_end(span)
        except Exception:
            self.failed += 1
            if self.failed == 1:
                log.exception("tracing: a request's spans were lost to an error; further ones are only counted")

    def force_flush(self, timeout_ms: int = 30000) -> bool:
        return self._processor.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Export what is queued (each export bounded by its timeout) and stop; later requests are dropped."""
        self._closed = True
        self._processor.shutdown()


def _present(attrs: dict[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {k: v for k, v in attrs.items() if v is not None}


class _Build:
    """One request's spans, from its marks and its end-of-request summary."""

    def __init__(self, trace: RequestTrace, info: RequestInfo, resource: Resource) -> None:
        self.trace, self.info, self.resource = trace, info, resource
        self.root = SpanContext(trace.trace_id, trace.span_id, False, _SAMPLED)
        self.name = f"{info.operation} {info.alias}" if info.alias else info.operation
        self.out: list[ReadableSpan] = []
        self.last = info.ended

    def ns(self, t: float) -> int:
        return int(t * 1e9) + self.trace.wall_offset_ns

    def span(
        self,
        name: str,
        start: float,
        end: float,
        parent: SpanContext | None = None,
        *,
        span_id: int | None = None,
        attributes: dict[str, AttributeValue] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        error: bool = False,
    ) -> SpanContext:
        ctx = SpanContext(self.trace.trace_id, span_id or _IDS.generate_span_id(), False, _SAMPLED)
        end = max(start, end)
        self.last = max(self.last, end)
        status = Status(StatusCode.ERROR if error else StatusCode.UNSET)
        self.out.append(
            ReadableSpan(
                name,
                ctx,
                parent or self.root,
                self.resource,
                attributes or {},
                kind=kind,
                status=status,
                start_time=self.ns(start),
                end_time=self.ns(end),
                instrumentation_scope=_SCOPE,
            )
        )
        return ctx

    def spans(self) -> list[ReadableSpan]:
        trace, info, marks = self.trace, self.info, self.trace.marks
        resolved, before = marks.get("resolved"), marks.get("stages_before")
        if resolved is not None:
            self.span("tollway.auth_policy", trace.started, resolved)
            if before is not None:
                self.span("tollway.quota_reservation", resolved, before)
        if before is not None and info.attempts:
            self.span("tollway.route_selection", before, info.attempts[0].started)
        events = [self.attempt(a) for a in info.attempts]
        if (settle := marks.get("finish_start")) is not None and (settled := marks.get("finish_end")) is not None:
            self.span("tollway.usage_settlement", settle, settled)
        attrs = _present(
            {
                "gen_ai.operation.name": info.operation,
                "gen_ai.request.model": info.alias or None,
                "tollway.request_id": info.request_id,
                "http.response.status_code": info.status,
                "tollway.stream": info.stream,
                "tollway.retries": info.retries,
                "tollway.fallbacks": info.fallbacks,
                "gen_ai.usage.input_tokens": info.input_tokens,
                "gen_ai.usage.output_tokens": info.output_tokens,
                "error.type": (info.error_code or str(info.status)) if info.status >= 400 else None,
            }
        )
        remote = None
        if trace.parent_span_id is not None:
            remote = SpanContext(trace.trace_id, trace.parent_span_id, True, _SAMPLED)
        root = ReadableSpan(
            self.name,
            self.root,
            remote,
            self.resource,
            attrs,
            [e for e in events if e is not None],
            kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR if info.status >= 500 else StatusCode.UNSET),
            start_time=self.ns(trace.started),
            end_time=self.ns(self.last),
            instrumentation_scope=_SCOPE,
        )
        return [root, *self.out]

    def attempt(self, a: AttemptInfo) -> Event | None:
        """The attempt's span and its children; a retry's or fallback's event for the root span."""
        info, failed = self.info, a.outcome in _FAILED
        end = a.ended if a.ended is not None else info.ended
        attrs = _present(
            {
                "gen_ai.operation.name": info.operation,
                "gen_ai.provider.name": a.provider_name,
                "gen_ai.request.model": info.alias or None,
                "tollway.route.id": a.route_id,
                "tollway.deployment.id": a.deployment_id,
                "tollway.attempt.number": a.number,
                "tollway.attempt.reason": a.reason,
                "tollway.attempt.outcome": a.outcome,
                "http.response.status_code": a.upstream_status,
                "gen_ai.usage.input_tokens": a.input_tokens,
                "gen_ai.usage.output_tokens": a.output_tokens,
                "error.type": (a.error_category or "_OTHER") if failed else None,
            }
        )
        span_id = self.trace.attempt_span_ids.get(a.number)
        ctx = self.span(
            self.name, a.started, end, span_id=span_id, attributes=attrs, kind=SpanKind.CLIENT, error=failed
        )
        if a.stream and a.first_event_s is not None:
            first = a.started + a.first_event_s
            self.span("tollway.first_token_wait", a.started, first, ctx)
            self.span("tollway.stream_transfer", first, end, ctx)
        if a.reason not in ("retry", "fallback"):
            return None
        return Event(
            f"tollway.{a.reason}",
            {"tollway.attempt.number": a.number, "tollway.route.id": a.route_id},
            self.ns(a.started),
        )
