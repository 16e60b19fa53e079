"""EmfFlusher: the gateway's Prometheus instruments as CloudWatch EMF documents, one per changed label set."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from tollway.telemetry.emf import (
    DEFAULT_ENVIRONMENT,
    ENVIRONMENT_VARIABLE,
    MAX_VALUES,
    NAMESPACE,
    EmfFlusher,
    metrics_environment,
)
from tollway.telemetry.metrics import GatewayMetrics

NOW_S = 1_790_000_000.25


def flusher(metrics: GatewayMetrics, **kwargs: Any) -> tuple[EmfFlusher, io.StringIO]:
    out = io.StringIO()
    return EmfFlusher(metrics, stream=out, clock=lambda: NOW_S, **kwargs), out


def documents(out: io.StringIO) -> list[dict[str, Any]]:
    """The documents written since the last call, each checked against the EMF structure."""
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    docs = [json.loads(line) for line in text.splitlines()]
    for doc in docs:
        aws = doc["_aws"]
        assert aws["Timestamp"] == int(NOW_S * 1000)
        (directive,) = aws["CloudWatchMetrics"]
        assert directive["Namespace"] == NAMESPACE
        for dimension_set in directive["Dimensions"]:
            assert 1 <= len(dimension_set) <= 30
            assert all(isinstance(doc[d], str) and doc[d] for d in dimension_set)
        for metric in directive["Metrics"]:
            assert metric["Name"] in doc and metric["Unit"]
    return docs


def by_metric(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [d for d in docs if name in d]


def test_counter_deltas_across_two_flushes() -> None:
    metrics = GatewayMetrics(environment="prod")
    ok = metrics.requests.child("chat", "chat", "false", "2xx", "")
    failed = metrics.requests.child("chat", "chat", "true", "5xx", "provider_error")
    emf, out = flusher(metrics)
    ok.inc(3)
    failed.inc()

    assert emf.flush() == 2
    first = by_metric(documents(out), "tollway_requests_total")
    values = {(d["status_class"], d.get("error_category")): d["tollway_requests_total"] for d in first}
    assert values == {("2xx", None): 3.0, ("5xx", "provider_error"): 1.0}

    ok.inc(2)
    assert emf.flush() == 1
    (second,) = documents(out)
    assert (second["status_class"], second["tollway_requests_total"]) == ("2xx", 2.0)


def test_dimensions_are_the_labels_without_empty_ones_plus_the_roll_ups() -> None:
    metrics = GatewayMetrics(environment="prod")
    metrics.requests.child("chat", "chat", "false", "2xx", "").inc()
    metrics.requests.child("chat", "chat", "false", "5xx", "provider_error").inc()
    emf, out = flusher(metrics)
    emf.flush()
    ok, failed = documents(out)

    (directive,) = ok["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] == [
        ["alias", "operation", "stream", "status_class", "environment"],
        ["environment"],
        ["environment", "status_class"],
    ]
    assert "error_category" not in ok
    assert directive["Metrics"] == [{"Name": "tollway_requests_total", "Unit": "Count"}]
    (directive,) = failed["_aws"]["CloudWatchMetrics"]
    assert ["environment", "error_category"] in directive["Dimensions"]
    assert failed["error_category"] == "provider_error"


def test_a_histogram_gives_count_sum_and_per_bucket_values_and_counts() -> None:
    metrics = GatewayMetrics(environment="prod")
    overhead = metrics.overhead.child("chat", "chat", "false")
    emf, out = flusher(metrics)
    for seconds in (0.0004, 0.0004, 0.003, 7.0):  # buckets 0.0005, 0.0005, 0.005 and +Inf (past 1.0)
        overhead.observe(seconds)

    emf.flush()
    (doc,) = by_metric(documents(out), "tollway_gateway_overhead_seconds")
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Metrics"] == [
        {"Name": "tollway_gateway_overhead_seconds", "Unit": "Seconds"},
        {"Name": "tollway_gateway_overhead_seconds_count", "Unit": "Count"},
        {"Name": "tollway_gateway_overhead_seconds_sum", "Unit": "Seconds"},
    ]
    assert doc["tollway_gateway_overhead_seconds"] == {"Values": [0.0005, 0.005, 1.0], "Counts": [2.0, 1.0, 1.0]}
    assert doc["tollway_gateway_overhead_seconds_count"] == 4.0
    assert doc["tollway_gateway_overhead_seconds_sum"] == pytest.approx(7.0038)
    assert "le" not in doc and ["environment"] in directive["Dimensions"]

    overhead.observe(0.02)  # the next flush reports only the new observation
    emf.flush()
    (doc,) = documents(out)
    assert doc["tollway_gateway_overhead_seconds"] == {"Values": [0.025], "Counts": [1.0]}
    assert doc["tollway_gateway_overhead_seconds_count"] == 1.0
    assert doc["tollway_gateway_overhead_seconds_sum"] == pytest.approx(0.02)


def test_token_usage_is_a_count_distribution() -> None:
    metrics = GatewayMetrics(environment="prod")
    metrics.token_usage.child("chat", "chat", "openai", "input").observe(100)
    emf, out = flusher(metrics)
    emf.flush()
    (doc,) = documents(out)
    units = {m["Name"]: m["Unit"] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units["gen_ai_client_token_usage"] == "Count"
    assert doc["gen_ai_client_token_usage"] == {"Values": [256.0], "Counts": [1.0]}
    assert ["environment", "gen_ai_token_type"] in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]


def test_nothing_is_written_when_nothing_changed() -> None:
    metrics = GatewayMetrics(environment="prod")
    metrics.requests.child("chat", "chat", "false", "2xx", "")  # a child that never counted
    emf, out = flusher(metrics)
    assert emf.flush() == 0
    metrics.requests.child("chat", "chat", "false", "2xx", "").inc()
    metrics.overhead.child("chat", "chat", "false").observe(0.001)
    assert emf.flush() == 2
    out.seek(0)
    out.truncate()
    assert emf.flush() == 0
    assert out.getvalue() == ""


def test_cost_is_a_unitless_sum_in_usd() -> None:
    metrics = GatewayMetrics(environment="prod")
    metrics.cost.child("chat", "estimated").inc(0.0125)
    emf, out = flusher(metrics)
    emf.flush()
    (doc,) = documents(out)
    assert doc["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "tollway_cost_usd_total", "Unit": "None"}]
    assert doc["tollway_cost_usd_total"] == pytest.approx(0.0125)
    assert ["environment", "kind"] in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]


def test_more_than_a_hundred_buckets_are_split_over_documents() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    class Wide:
        def flush(self) -> None:  # GatewayMetrics batches; a bare registry has nothing to move
            return None

        """Stands in for GatewayMetrics: only ``registry`` is read."""

        def __init__(self) -> None:
            self.registry = CollectorRegistry(auto_describe=False)
            buckets = [float(i) for i in range(1, 151)]
            self.histogram = Histogram("wide_seconds", "wide", ["environment"], buckets=buckets, registry=self.registry)

    wide = Wide()
    child = wide.histogram.labels("prod")
    for i in range(150):
        child.observe(i + 0.5)
    out = io.StringIO()
    emf = EmfFlusher(wide, stream=out, clock=lambda: NOW_S)  # type: ignore[arg-type]
    assert emf.flush() == 2
    first, second = documents(out)
    assert len(first["wide_seconds"]["Values"]) == MAX_VALUES
    assert len(second["wide_seconds"]["Values"]) == 50
    assert sum(first["wide_seconds"]["Counts"]) + sum(second["wide_seconds"]["Counts"]) == 150
    assert first["wide_seconds_count"] == 150.0 and "wide_seconds_count" not in second


def test_at_most_thirty_dimensions() -> None:
    from prometheus_client import CollectorRegistry, Counter

    class Many:
        def flush(self) -> None:  # GatewayMetrics batches; a bare registry has nothing to move
            return None

        def __init__(self) -> None:
            self.registry = CollectorRegistry(auto_describe=False)
            self.labels = [f"l{i:02d}" for i in range(35)]
            self.counter = Counter("many", "many", self.labels, registry=self.registry)

    many = Many()
    many.counter.labels(*(f"v{i}" for i in range(35))).inc()
    out = io.StringIO()
    EmfFlusher(many, stream=out, clock=lambda: NOW_S).flush()  # type: ignore[arg-type]
    (doc,) = documents(out)
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] == [many.labels[:30]]


def test_defaults_go_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = GatewayMetrics(environment="prod")
    metrics.config_reloads.child("applied").inc()
    EmfFlusher(metrics).flush()
    (line,) = capsys.readouterr().out.splitlines()
    doc = json.loads(line)
    assert doc["tollway_config_reloads_total"] == 1.0
    assert doc["environment"] == "prod"


async def test_run_periodic_flushes_until_cancelled_and_once_more() -> None:
    metrics = GatewayMetrics(environment="prod")
    emf, out = flusher(metrics)
    child = metrics.requests.child("chat", "chat", "false", "2xx", "")
    task = asyncio.create_task(emf.run_periodic(0.01))
    child.inc()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if out.getvalue():
            break
    assert [d["tollway_requests_total"] for d in documents(out)] == [1.0]
    child.inc(4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [d["tollway_requests_total"] for d in documents(out)] == [4.0], "the final flush on cancellation"


async def test_run_periodic_survives_a_failing_flush(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError("stdout is gone")

    metrics = GatewayMetrics(environment="prod")
    emf = EmfFlusher(metrics, stream=Broken())
    metrics.requests.child("chat", "chat", "false", "2xx", "").inc()
    task = asyncio.create_task(emf.run_periodic(0.01))
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "EMF metrics flush failed" in caplog.text


def test_run_periodic_needs_a_positive_interval() -> None:
    emf, _ = flusher(GatewayMetrics())
    with pytest.raises(ValueError, match="positive"):
        asyncio.run(emf.run_periodic(0))


def test_the_worker_environment_comes_from_the_variable() -> None:
    assert metrics_environment({}) == DEFAULT_ENVIRONMENT == "local"
    assert metrics_environment({ENVIRONMENT_VARIABLE: "  "}) == "local"
    assert metrics_environment({ENVIRONMENT_VARIABLE: "prod"}) == "prod"
