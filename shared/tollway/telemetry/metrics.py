"""The gateway's metrics: Prometheus instruments with bounded labels, and a cardinality guard.

Names follow the OpenTelemetry GenAI semantic conventions where they define one
(:data:`SEMCONV_VERSION`), in their Prometheus form: ``gen_ai.client.token.usage`` is exported as
``gen_ai_client_token_usage``, a duration in seconds gets ``_seconds``, and an attribute such as
``gen_ai.request.model`` is the label ``gen_ai_request_model``. The rest are ``tollway_*``.

Why ``prometheus-client`` and not the OpenTelemetry SDK's meter: ``python -m bench.metrics_libs``
records one request's metrics for 30,000 requests with each; the SDK cost 69 µs per request,
``prometheus-client`` 8 µs (15 µs in its multiprocess mode), and only the latter aggregates
several worker processes at scrape (docs/observability.md has the table).

Labels come only from bounded sets: configured alias, route and provider ids, provider formats,
status classes, the gateway's error codes, outcomes and the configured environment. Nothing a
client typed (a model name that is not an alias, a user or session id) and nothing a provider
said (its error text, its request id) is ever a label value. Each family still guards itself:
past ``maxLabelSets`` distinct value sets it refuses a new one, counts the refusal on
``tollway_metric_label_sets_refused_total``, and records nothing for it.

Label children are cached per family in a dict keyed by the value tuple, so the request path
pays one dict lookup per instrument, not ``labels()``'s validation.

**Counts are batched.** A request does not write to prometheus-client's values: it adds to a
plain per-series float (a counter) or bucket list (a histogram, its bucket found by ``bisect``),
and :meth:`GatewayMetrics.flush` moves what accumulated into the values once a second (the
process sampler), before every scrape and before every EMF flush. In multiprocess mode each
value write is a lock and an mmap write, and one request's dozen of them cost 19.5 µs of CPU;
batched, the request pays 3.6 µs and a busy series one write a second (docs/benchmarks.md).
A histogram's flush writes its sum and the buckets that changed through the child's ``_sum``
and ``_buckets`` (prometheus-client 0.26's own fields, pinned), one write per bucket instead of
one per observation; a scrape in another worker process sees this one's counts up to a second
late.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "SEMCONV_VERSION",
    "GatewayMetrics",
    "LabelledFamily",
    "multiprocess_dir",
    "render_latest",
]

SEMCONV_VERSION: Final = "1.41.0"
"""The OpenTelemetry semantic conventions release the GenAI names and attributes follow."""

_DURATION_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""The GenAI conventions' duration buckets (0.01 s to 81.92 s), with three below for a gateway's fast answers."""
_TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""The GenAI conventions' time-to-first-token buckets."""
_TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""The GenAI conventions' token-usage buckets."""
_OVERHEAD_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_DEPTH_BUCKETS: Final = (0, 1, 2, 3, 5, 8)
_WAIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_STREAM_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

_GENAI = ("gen_ai_operation_name", "gen_ai_request_model")


def multiprocess_dir() -> str | None:
    """Where worker processes keep their metric files (``PROMETHEUS_MULTIPROC_DIR``), if set."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _Refused:
    """What a refused label set records into: nothing."""

    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        return None

    def observe(self, amount: float) -> None:
        return None

    def set(self, value: float) -> None:
        return None


_REFUSED: Final = _Refused()


class _PendingCounter:
    """One counter series: increments add up here until :meth:`drain` writes their total."""

    __slots__ = ("child", "pending")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.pending = 0.0

    def inc(self, amount: float = 1) -> None:
        self.pending += amount

    def drain(self) -> None:
        if self.pending:
            self.child.inc(self.pending)
            self.pending = 0.0


class _PendingHistogram:
    """One histogram series: observations counted per bucket until :meth:`drain` writes them."""

    __slots__ = ("bounds", "child", "counts", "n", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.n = 0
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bound >= amount, as observe() picks
        self.total += amount
        self.n += 1

    def drain(self) -> None:
        if not self.n:
            return
        child, counts = self.child, self.counts
        child._sum.inc(self.total)
        for i, count in enumerate(counts):
            if count:
                child._buckets[i].inc(count)
                counts[i] = 0
        self.n = 0
        self.total = 0.0


class LabelledFamily:
    """One metric family: its children by label values, under the cardinality guard.

    ``child(*values)`` takes the values of every label but ``environment``, which is the same for
    the whole process and is appended here.
    """

    __slots__ = ("_children", "_env", "_limit", "_metric", "_pending", "_refusals", "_wrap", "name")

    def __init__(
        self, metric: Any, name: str, env: str, limit: int, refusals: Any, pending: list[Any] | None = None
    ) -> None:
        self._metric = metric
        self.name = name
        self._env = env
        self._limit = limit
        self._refusals = refusals
        self._children: dict[tuple[str, ...], Any] = {}
        self._pending = pending
        """Where a new batched series registers for the flush (``None``: a gauge, set directly)."""
        self._wrap: type[_PendingCounter] | type[_PendingHistogram] | None = None
        if pending is not None:
            self._wrap = _PendingHistogram if metric._type == "histogram" else _PendingCounter

    def child(self, *values: str) -> Any:
        c = self._children.get(values)
        if c is None:
            c = self._add(values)
        return c

    def _add(self, values: tuple[str, ...]) -> Any:
        if len(self._children) >= self._limit:
            self._refusals.labels(self.name, self._env).inc()
            return _REFUSED
        c = self._metric.labels(*values, self._env)
        if self._wrap is not None and self._pending is not None:
            c = self._wrap(c)
            self._pending.append(c)
        self._children[values] = c
        return c

    def __len__(self) -> int:
        return len(self._children)


class GatewayMetrics:
    """Every instrument of one gateway process, built once at start (``None`` when metrics are off).

    In a process with ``PROMETHEUS_MULTIPROC_DIR`` set (``tollway serve`` sets it for its workers
    and its ship process) the values live in that directory's files and a scrape aggregates every
    process's; otherwise in this object's own registry.
    """

    def __init__(self, *, environment: str = "local", max_label_sets: int = 2000) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.environment = environment
        self._pending: list[Any] = []
        """Every batched series, for :meth:`flush`."""
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        self._limit = max_label_sets
        env = ("environment",)
        self._refusals = Counter(
            "tollway_metric_label_sets_refused",
            "New label-value sets a metric refused past telemetry.metrics.maxLabelSets (nothing is recorded for them).",
            ["metric", "environment"],
            registry=reg,
        )

        def counter(name: str, doc: str, labels: Sequence[str]) -> LabelledFamily:
            return self._family(Counter(name, doc, [*labels, *env], registry=reg), name, batched=True)

        def histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> LabelledFamily:
            metric = Histogram(name, doc, [*labels, *env], buckets=buckets, registry=reg)
            return self._family(metric, name, batched=True)

        def gauge(name: str, doc: str, labels: Sequence[str], mode: str) -> LabelledFamily:
            metric = Gauge(name, doc, [*labels, *env], registry=reg, multiprocess_mode=mode)  # type: ignore[arg-type]
            return self._family(metric, name, batched=False)

        # Logical requests, their outcome and their timings.
        self.requests = counter(
            "tollway_requests",
            "Logical requests by alias, operation, status class and error code (empty on success).",
            ["alias", "operation", "stream", "status_class", "error_category"],
        )
        self.request_duration = histogram(
            "gen_ai_server_request_duration_seconds",
            "gen_ai.server.request.duration: from the request's arrival to its last byte (a stream's end).",
            [*_GENAI, "status_class", "error_type"],
            _DURATION_BUCKETS,
        )
        self.time_to_first_token = histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "gen_ai.server.time_to_first_token: from a streamed request's arrival to its first token.",
            _GENAI,
            _TTFT_BUCKETS,
        )
        self.overhead = histogram(
            "tollway_gateway_overhead_seconds",
            "The time the gateway itself added: a request's duration less the time spent waiting on providers.",
            ["alias", "operation", "stream"],
            _OVERHEAD_BUCKETS,
        )
        self.stream_duration = histogram(
            "tollway_stream_duration_seconds",
            "A committed stream's transfer, from its first token to its end.",
            ["alias", "outcome"],
            _STREAM_BUCKETS,
        )
        self.stream_permit_hold = histogram(
            "tollway_stream_permit_hold_seconds",
            "How long a streaming request held its stream permit (maxConcurrentStreams).",
            ["alias"],
            _STREAM_BUCKETS,
        )
        self.stream_terminations = counter(
            "tollway_stream_terminations",
            "Streams the gateway ended early: slow (drain rate), stalled (write progress), lifetime, disconnect.",
            ["alias", "reason"],
        )
        self.client_disconnects = counter(
            "tollway_client_disconnects",
            "Clients that left before their answer ended (status 499), by whether a stream had begun.",
            ["alias", "phase"],
        )
        # Physical attempts.
        self.attempts = counter(
            "tollway_attempts",
            "Physical provider attempts by route, provider format, outcome and upstream error category.",
            ["alias", "route", "gen_ai_provider_name", "outcome", "error_category"],
        )
        self.provider_duration = histogram(
            "gen_ai_client_operation_duration_seconds",
            "gen_ai.client.operation.duration: one provider attempt, from dispatch to its answer's end.",
            [*_GENAI, "gen_ai_provider_name", "route", "error_type"],
            _DURATION_BUCKETS,
        )
        self.provider_ttft = histogram(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "gen_ai.client.operation.time_to_first_chunk: one streamed attempt's dispatch to its first event.",
            [*_GENAI, "gen_ai_provider_name", "route"],
            _TTFT_BUCKETS,
        )
        self.upstream_cancellations = counter(
            "tollway_upstream_cancellations",
            "Provider attempts the gateway cancelled (the client left, the request ended).",
            ["alias", "route"],
        )
        self.retries = counter(
            "tollway_retries",
            "Attempts after a request's first: retries of the same route and fallbacks to another.",
            ["alias", "kind"],
        )
        self.fallback_depth = histogram(
            "tollway_fallback_depth",
            "How many routes past the first a request that fell back tried (requests that did not are not observed).",
            ["alias"],
            _DEPTH_BUCKETS,
        )
        self.route_saturation = counter(
            "tollway_route_saturated",
            "Targets skipped because their capacity was in use: quota-group RPM/TPM, or in-flight and probe slots.",
            ["alias", "route", "reason"],
        )
        self.circuit_changes = counter(
            "tollway_circuit_state_changes",
            "Circuit breaker transitions per provider deployment.",
            ["deployment", "state"],
        )
        # Tokens and cost.
        self.token_usage = histogram(
            "gen_ai_client_token_usage",
            "gen_ai.client.token.usage: input and output tokens of each answered request.",
            [*_GENAI, "gen_ai_provider_name", "gen_ai_token_type"],
            _TOKEN_BUCKETS,
        )
        self.tokens = counter(
            "tollway_tokens",
            "Tokens by kind: input, output, cached (read from the prompt cache), cache_creation, reasoning.",
            ["alias", "type"],
        )
        self.cost = counter(
            "tollway_cost_usd",
            "Cost in US dollars: estimated by the gateway as each request settles (reconciled comes from the ledger).",
            ["alias", "kind"],
        )
        # Admission and governance.
        self.pii_values = counter(
            "tollway_pii_values",
            "PII values replaced by placeholders before a provider saw them, by alias and PII kind.",
            ["alias", "kind"],
        )
        self.pii_recoveries = counter(
            "tollway_pii_recoveries",
            "Placeholders in answers by outcome: exact (restored; preserved), left_masked (complete but "
            "unresolvable: invented), near_miss (altered), omitted (sent and never returned).",
            ["alias", "outcome"],
        )
        self.content_records = counter(
            "tollway_content_records",
            "Captured exchanges (contentMode) by outcome: stored, or dropped and why (queue_full, "
            "too_large, store_unavailable, rejected, closed); a drop keeps the request's metadata.",
            ["outcome"],
        )
        self.budget_rejections = counter(
            "tollway_budget_rejections",
            "Requests refused by a budget, a rate limit or an unreachable budget store.",
            ["alias", "reason"],
        )
        self.lease_waits = histogram(
            "tollway_lease_wait_seconds",
            "Requests that waited for a budget lease refill, by outcome.",
            ["outcome"],
            _WAIT_BUCKETS,
        )
        self.active = gauge(
            "tollway_requests_active",
            "Requests holding a request permit, sampled every second per process.",
            [],
            "livesum",
        )
        self.queued = gauge("tollway_requests_queued", "Requests waiting in the admission queue.", [], "livesum")
        self.streams_active = gauge("tollway_streams_active", "Streams holding a stream permit.", [], "livesum")
        # The audit trail.
        self.wal_depth = gauge(
            "tollway_audit_wal_depth_bytes",
            "Audit WAL bytes on disk: written and not yet acknowledged by the queue.",
            [],
            "livesum",
        )
        self.wal_pending = gauge(
            "tollway_audit_wal_pending_records",
            "Audit events appended and not yet at the WAL's durable watermark.",
            [],
            "livesum",
        )
        self.wal_commit_wait = counter(
            "tollway_audit_wal_commit_wait_seconds",
            "Total time audit events waited from append to the durable watermark (divide by the commits count).",
            [],
        )
        self.wal_commits = counter(
            "tollway_audit_wal_commit_waits",
            "Audit events that reached the durable watermark (the count behind the commit wait total).",
            [],
        )
        self.shipper_lag = gauge(
            "tollway_audit_shipper_lag_records",
            "Durable audit events the shipper has not yet had acknowledged by the queue.",
            [],
            "livesum",
        )
        # Configuration.
        self.config_generation = gauge(
            "tollway_config_generation",
            "The active published root's generation.",
            [],
            "livemax",
        )
        self.config_reloads = counter(
            "tollway_config_reloads",
            "Configuration reloads by outcome (applied, unchanged, rejected, unreadable).",
            ["outcome"],
        )
        self.trace_spans_dropped = counter(
            "tollway_trace_spans_dropped",
            "Spans dropped because the export queue was full.",
            [],
        )

    def _family(self, metric: Any, name: str, *, batched: bool) -> LabelledFamily:
        pending = self._pending if batched else None
        return LabelledFamily(metric, name, self.environment, self._limit, self._refusals, pending)

    def flush(self) -> None:
        """Write what requests recorded since the last flush into prometheus-client's values.
        Call it from the thread that records (the event loop): the batches are not locked."""
        for series in self._pending:
            series.drain()


def render_latest(metrics: GatewayMetrics | None) -> tuple[bytes, str]:
    """The Prometheus text exposition: every process's values under multiprocess mode, else this
    process's registry."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    if multiprocess_dir():
        from prometheus_client import multiprocess

        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    if metrics is None:
        return b"", CONTENT_TYPE_LATEST
    return generate_latest(metrics.registry), CONTENT_TYPE_LATEST  # the caller flushed it on its own thread
