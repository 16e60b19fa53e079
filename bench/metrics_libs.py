"""CPU per request of recording one request's metrics with each library the gateway could use.

    python -m bench.metrics_libs [--requests 50000]

One request's worth is what ``tollway.telemetry`` records for a buffered answer: a request
counter, an attempt counter, four histograms (request duration, gateway overhead, provider
duration, tokens twice) and a cost counter, each with the labels it has in the gateway. Each
library records them for ``--requests`` requests spread over a handful of aliases and routes;
the table gives the median of five runs in microseconds per request, then the cost of one
scrape of the result. Run it on a quiet machine: it measures CPU, not latency.

- ``prometheus-client``, single-process (the default ``ValueClass``);
- ``prometheus-client``, multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``: mmap'd files per
  process, aggregated at scrape), which is what several workers need, each in a fresh process;
- the OpenTelemetry SDK's ``MeterProvider`` with its Prometheus exporter (a reader that
  aggregates at scrape), which can only export one process's metrics.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ALIASES = [f"chat-{i}" for i in range(4)]
ROUTES = [f"route-{i}" for i in range(3)]

_PROM = r"""
import os, sys, time
from prometheus_client import Counter, Histogram, CollectorRegistry, generate_latest
multi = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
reg = CollectorRegistry()
kw = {} if multi else {"registry": reg}
req = Counter("req", "", ["alias", "operation", "status_class", "error_category"], **kw)
att = Counter("att", "", ["alias", "route", "provider", "outcome"], **kw)
dur = Histogram("dur", "", ["alias", "operation", "status_class"], **kw)
ovh = Histogram("ovh", "", ["alias", "operation"], **kw)
pdur = Histogram("pdur", "", ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_provider_name", "route"], **kw)
tok = Histogram("tok", "", ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_provider_name", "type"],
                buckets=[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576], **kw)
cost = Counter("cost", "", ["alias", "kind"], **kw)
children = {}
def child(metric, *values):
    key = (id(metric), values)
    c = children.get(key)
    if c is None:
        c = children[key] = metric.labels(*values)
    return c
aliases, routes = ALIASES, ROUTES
n = int(sys.argv[1])
t0 = time.process_time()
for i in range(n):
    a = aliases[i % 4]; r = routes[i % 3]
    child(req, a, "chat", "2xx", "").inc()
    child(att, a, r, "openai", "ok").inc()
    child(dur, a, "chat", "2xx").observe(0.0123)
    child(ovh, a, "chat").observe(0.0004)
    child(pdur, "chat", a, "openai", r).observe(0.0119)
    child(tok, "chat", a, "openai", "input").observe(120)
    child(tok, "chat", a, "openai", "output").observe(40)
    child(cost, a, "estimated").inc(0.00012)
per_request = (time.process_time() - t0) / n * 1e6
t0 = time.process_time()
if multi:
    from prometheus_client import multiprocess
    reg = CollectorRegistry(); multiprocess.MultiProcessCollector(reg)
for _ in range(20):
    body = generate_latest(reg)
scrape = (time.process_time() - t0) / 20 * 1e3
print(f"{per_request:.3f} {scrape:.3f}")
"""

_OTEL = r"""
import sys, time
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import View, ExplicitBucketHistogramAggregation
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry, generate_latest, REGISTRY
reader = PrometheusMetricReader()
provider = MeterProvider(metric_readers=[reader], views=[View(instrument_name="tok",
    aggregation=ExplicitBucketHistogramAggregation([1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]))])
m = provider.get_meter("bench")
req = m.create_counter("req"); att = m.create_counter("att"); dur = m.create_histogram("dur", unit="s")
ovh = m.create_histogram("ovh", unit="s"); pdur = m.create_histogram("pdur", unit="s")
tok = m.create_histogram("tok"); cost = m.create_counter("cost")
attrs = {}
def a_(**kw):
    key = tuple(kw.items())
    v = attrs.get(key)
    if v is None:
        v = attrs[key] = kw
    return v
aliases, routes = ALIASES, ROUTES
n = int(sys.argv[1])
t0 = time.process_time()
for i in range(n):
    a = aliases[i % 4]; r = routes[i % 3]
    req.add(1, a_(alias=a, operation="chat", status_class="2xx", error_category=""))
    att.add(1, a_(alias=a, route=r, provider="openai", outcome="ok"))
    dur.record(0.0123, a_(alias=a, operation="chat", status_class="2xx"))
    ovh.record(0.0004, a_(alias=a, operation="chat"))
    pdur.record(0.0119, a_(op="chat", model=a, provider="openai", route=r))
    tok.record(120, a_(op="chat", model=a, provider="openai", type="input"))
    tok.record(40, a_(op="chat", model=a, provider="openai", type="output"))
    cost.add(0.00012, a_(alias=a, kind="estimated"))
per_request = (time.process_time() - t0) / n * 1e6
t0 = time.process_time()
for _ in range(20):
    body = generate_latest(REGISTRY)
scrape = (time.process_time() - t0) / 20 * 1e3
print(f"{per_request:.3f} {scrape:.3f}")
"""


def _run(code: str, requests: int, env: dict[str, str]) -> tuple[float, float]:
    prelude = f"ALIASES = {ALIASES!r}\nROUTES = {ROUTES!r}\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + code, str(requests)], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    rows: dict[str, list[tuple[float, float]]] = {
        "prometheus-client": [],
        "prometheus-client multiprocess": [],
        "otel-sdk": [],
    }
    for _ in range(args.repeat):
        rows["prometheus-client"].append(_run(_PROM, args.requests, base))
        with tempfile.TemporaryDirectory() as d:
            rows["prometheus-client multiprocess"].append(
                _run(_PROM, args.requests, {**base, "PROMETHEUS_MULTIPROC_DIR": d})
            )
        rows["otel-sdk"].append(_run(_OTEL, args.requests, base))
    runs_note = f"({args.repeat} runs of {args.requests} requests, medians)"
    print(f"{'library':34} {'us/request':>11} {'ms/scrape':>10}   {runs_note}")
    for name, runs in rows.items():
        print(f"{name:34} {statistics.median(r[0] for r in runs):11.2f} {statistics.median(r[1] for r in runs):10.2f}")
    return 0


if __name__ == "__main__":
    t = time.monotonic()
    rc = main()
    print(f"took {time.monotonic() - t:.1f} s")
    raise SystemExit(rc)
