"""The gateway's metrics as CloudWatch embedded-metric (EMF) documents, for Lambda.

On Lambda nothing scrapes ``/metrics``: what a function prints to stdout goes to CloudWatch Logs,
and CloudWatch turns every log line that is an EMF document into metric values. So on Lambda the
gateway keeps recording into the same Prometheus instruments as in server mode
(:class:`~tollway.telemetry.metrics.GatewayMetrics`), and an :class:`EmfFlusher` reads them now and
then (after each invocation of the buffered deployment, every few seconds in the streaming one)
and prints what changed since it last looked:

- a counter sample as its increase, under the sample's name (``tollway_requests_total``);
- a histogram child as the increase of ``<name>_count`` and ``<name>_sum`` and, so that CloudWatch
  can compute percentiles, as a distribution under ``<name>`` itself: ``{"Values": [...],
  "Counts": [...]}`` with each bucket's upper bound as the value and the observations that fell
  into that bucket since the last flush as its count. The ``+Inf`` bucket is reported at the
  largest finite bound, so a percentile that lands there reads as "at least that";
- nothing at all for a child whose values did not change (an idle environment prints nothing),
  and nothing for gauges: on Lambda one environment serves one request at a time, so the
  admission and stream gauges describe one environment, and their sum across environments is
  Lambda's own ``ConcurrentExecutions``.

One document per label set. Its dimensions are the sample's labels, less those whose value is
empty (CloudWatch refuses an empty dimension value); the namespace is :data:`NAMESPACE`. Each
document also names the coarser dimension sets of :data:`DEFAULT_ROLLUPS` (``environment`` alone
for every metric, ``environment`` + ``status_class`` for requests, ...): CloudWatch then keeps
those aggregates too, which is what alarms and dashboards read, because metric math cannot sum
metrics it is not given by name and a percentile cannot be recombined from per-alias series.

EMF's limits are kept: at most 30 dimensions in a dimension set (the first 30 labels) and at most
100 values in one metric (a histogram with more non-empty buckets is split over several
documents of the same dimensions, which CloudWatch merges).

Why the JSON is written here rather than with Powertools' ``Metrics``: Powertools (3.37) keeps a
metric's values as a flat list with no ``Counts``, so a histogram would have to be expanded into
one value per observation (and capped at 100 observations per document), and it prints only to
``sys.stdout``. The format is documented and small; writing it here costs one ``json.dumps`` per
changed label set, to any text stream (``sys.stdout`` by default, a buffer in tests).

A flush advances its baseline before it writes, so a failed write loses that interval's
increments rather than reporting them twice. Deltas are per process: each Lambda execution
environment reports its own increments, and CloudWatch sums them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from tollway.telemetry.metrics import GatewayMetrics

__all__ = [
    "DEFAULT_ENVIRONMENT",
    "DEFAULT_ROLLUPS",
    "ENVIRONMENT_VARIABLE",
    "MAX_DIMENSIONS",
    "MAX_VALUES",
    "NAMESPACE",
    "EmfFlusher",
    "metrics_environment",
]

log = logging.getLogger("tollway.telemetry")

NAMESPACE: Final = "Tollway"
"""The CloudWatch namespace of every Tollway metric: the gateway's and the worker functions'."""
ENVIRONMENT_VARIABLE: Final = "TOLLWAY_ENVIRONMENT"
"""Names the deployment (the stack sets the stage name) for the worker functions' ``environment``
dimension. The gateway's own ``environment`` label comes from its config (``telemetry.environment``)."""
DEFAULT_ENVIRONMENT: Final = "local"
"""The same default as the gateway's ``telemetry.environment``, so local metrics agree."""
MAX_DIMENSIONS: Final = 30
"""EMF: dimension keys in one dimension set."""
MAX_VALUES: Final = 100
"""EMF: values in one metric's ``Values`` array."""

DEFAULT_ROLLUPS: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "*": (("environment",),),
    "tollway_requests": (("environment", "status_class"), ("environment", "error_category")),
    "tollway_attempts": (("environment", "outcome"),),
    "tollway_tokens": (("environment", "type"),),
    "tollway_cost_usd": (("environment", "kind"),),
    "gen_ai_client_token_usage": (("environment", "gen_ai_token_type"),),
}
"""Extra dimension sets by metric family (``*``: every family). A set is added to a document only
when the document has every one of its labels with a value."""


def metrics_environment(environ: Mapping[str, str] | None = None) -> str:
    """The ``environment`` dimension of a worker function's metrics: ``$TOLLWAY_ENVIRONMENT``, else ``local``.

    Read on each invocation rather than at import, so a process that serves several stages (the
    local event-source runner under a test) reports each with its own.
    """
    env = os.environ if environ is None else environ
    return env.get(ENVIRONMENT_VARIABLE, "").strip() or DEFAULT_ENVIRONMENT


def _unit(family: str) -> str:
    """The CloudWatch unit of a family's values, from the Prometheus naming convention's suffix."""
    if family.endswith("_seconds"):
        return "Seconds"
    if family.endswith("_bytes"):
        return "Bytes"
    if family.endswith("_usd"):
        return "None"
    return "Count"


LabelKey = tuple[tuple[str, str], ...]


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


@dataclass(slots=True)
class _Child:
    """One histogram child as collected: its labels (without ``le``), buckets, count and sum."""

    labels: dict[str, str]
    buckets: list[tuple[float, float]] = field(default_factory=list)
    count: float = 0.0
    total: float = 0.0


@dataclass(frozen=True, slots=True)
class _HistogramState:
    per_bucket: tuple[float, ...]
    count: float
    total: float


class EmfFlusher:
    """Prints what a :class:`GatewayMetrics` recorded since the previous flush, as EMF documents.

    ``stream`` is where documents go, one JSON object a line (default: ``sys.stdout`` at each
    flush, which is what Lambda sends to CloudWatch Logs). ``rollups`` replaces
    :data:`DEFAULT_ROLLUPS`. ``clock`` gives the documents' timestamp in epoch seconds.
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        stream: TextIO | None = None,
        namespace: str = NAMESPACE,
        rollups: Mapping[str, Sequence[Sequence[str]]] = DEFAULT_ROLLUPS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self._stream = stream
        self._namespace = namespace
        self._rollups = {k: tuple(tuple(r) for r in v) for k, v in rollups.items()}
        self._clock = clock
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, LabelKey], float] = {}
        self._histograms: dict[tuple[str, LabelKey], _HistogramState] = {}

    def flush(self) -> int:
        """Print one document per label set that changed; returns how many were printed. Call it
        from the thread that records (the event loop, or the handler after an invocation): it
        first moves the requests' batched counts into the registry (``GatewayMetrics.flush``)."""
        self.metrics.flush()
        with self._lock:
            documents = list(self._documents(int(self._clock() * 1000)))
        if not documents:
            return 0
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write("".join(json.dumps(d, separators=(",", ":"), allow_nan=False) + "\n" for d in documents))
        stream.flush()
        return len(documents)

    async def run_periodic(self, interval_s: float) -> None:
        """Flush every ``interval_s`` seconds until cancelled, and once more then.

        For a long-running process (the streaming deployment, where the Web Adapter runs the app
        as a server): start it as a task and cancel it at shutdown. A failed flush is logged and
        the loop goes on; metrics must never stop the gateway.
        """
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        try:
            while True:
                await asyncio.sleep(interval_s)
                self._flush_logged()
        finally:
            self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception:
            log.exception("EMF metrics flush failed")

    # ------------------------------------------------------------------ documents

    def _documents(self, ts_ms: int) -> Iterator[dict[str, Any]]:
        for family in self.metrics.registry.collect():
            if family.type == "counter":
                yield from self._counter(family.name, family.samples, ts_ms)
            elif family.type == "histogram":
                yield from self._histogram(family.name, family.samples, ts_ms)

    def _counter(self, family: str, samples: Sequence[Any], ts_ms: int) -> Iterator[dict[str, Any]]:
        name = f"{family}_total"
        for sample in samples:
            if sample.name != name:
                continue  # ``_created``: not a value
            key = (name, _key(sample.labels))
            value = float(sample.value)
            previous = self._counters.get(key, 0.0)
            self._counters[key] = value
            delta = value - previous if value >= previous else value  # a reset starts from zero
            if delta and math.isfinite(delta):
                yield self._document(family, sample.labels, ts_ms, [(name, _unit(family), delta)])

    def _histogram(self, family: str, samples: Sequence[Any], ts_ms: int) -> Iterator[dict[str, Any]]:
        children: dict[LabelKey, _Child] = {}
        for sample in samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            child = children.setdefault(_key(labels), _Child(labels))
            if sample.name == f"{family}_bucket":
                child.buckets.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name == f"{family}_count":
                child.count = float(sample.value)
            elif sample.name == f"{family}_sum":
                child.total = float(sample.value)
        for key, child in children.items():
            yield from self._histogram_child(family, key, child, ts_ms)

    def _histogram_child(self, family: str, key: LabelKey, child: _Child, ts_ms: int) -> Iterator[dict[str, Any]]:
        child.buckets.sort()
        bounds = [le for le, _ in child.buckets]
        cumulative = [c for _, c in child.buckets]
        per_bucket = tuple(c - p for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True))
        state = _HistogramState(per_bucket, child.count, child.total)
        previous = self._histograms.get((family, key))
        self._histograms[(family, key)] = state
        if previous is not None and len(previous.per_bucket) == len(per_bucket) and child.count >= previous.count:
            per_bucket = tuple(n - p for n, p in zip(per_bucket, previous.per_bucket, strict=True))
            count, total = child.count - previous.count, child.total - previous.total
        else:  # the first flush, or a reset: everything so far is new
            count, total = child.count, child.total
        if not count:
            return
        unit = _unit(family)
        values: dict[float, float] = {}
        finite = [b for b in bounds if math.isfinite(b)]
        for bound, n in zip(bounds, per_bucket, strict=True):
            if n > 0 and finite:
                at = bound if math.isfinite(bound) else finite[-1]
                values[at] = values.get(at, 0.0) + n
        scalars: list[tuple[str, str, Any]] = [(f"{family}_count", "Count", count)]
        if total and math.isfinite(total):
            scalars.append((f"{family}_sum", unit, total))
        points = sorted(values.items())
        if not points:
            yield self._document(family, child.labels, ts_ms, scalars)
            return
        for start in range(0, len(points), MAX_VALUES):
            chunk = points[start : start + MAX_VALUES]
            distribution = {"Values": [v for v, _ in chunk], "Counts": [n for _, n in chunk]}
            metrics: list[tuple[str, str, Any]] = [(family, unit, distribution)]
            yield self._document(family, child.labels, ts_ms, metrics + (scalars if start == 0 else []))

    def _document(
        self, family: str, labels: Mapping[str, str], ts_ms: int, metrics: Sequence[tuple[str, str, Any]]
    ) -> dict[str, Any]:
        dimensions = {k: v for k, v in labels.items() if v != ""}
        names = list(dimensions)[:MAX_DIMENSIONS]
        sets = [names]
        for rollup in (*self._rollups.get("*", ()), *self._rollups.get(family, ())):
            wanted = list(rollup[:MAX_DIMENSIONS])
            if set(wanted) <= set(names) and sorted(wanted) not in (sorted(s) for s in sets):
                sets.append(wanted)
        directive = {
            "Namespace": self._namespace,
            "Dimensions": sets,
            "Metrics": [{"Name": name, "Unit": unit} for name, unit, _ in metrics],
        }
        document: dict[str, Any] = {"_aws": {"Timestamp": ts_ms, "CloudWatchMetrics": [directive]}}
        document.update((k, dimensions[k]) for k in names)
        document.update((name, value) for name, _, value in metrics)
        return document
