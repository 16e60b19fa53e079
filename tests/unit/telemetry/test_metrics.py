"""The gateway's metric families: batched counts, the cardinality guard, the exposition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tollway.telemetry.metrics import GatewayMetrics, render_latest


@pytest.fixture(autouse=True)
def _one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = render_latest(metrics)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_counts_reach_the_exposition_at_the_flush_not_before() -> None:
    m = GatewayMetrics(environment="t")
    m.requests.child("a", "chat", "false", "2xx", "").inc()
    m.requests.child("a", "chat", "false", "2xx", "").inc(2)
    key = ("tollway_requests_total", (("alias", "a"), ("environment", "t"), ("error_category", ""),
                                      ("operation", "chat"), ("status_class", "2xx"), ("stream", "false")))  # fmt: skip
    assert _samples(m).get(key, 0) == 0
    m.flush()
    assert _samples(m)[key] == 3
    m.flush()  # nothing new: nothing added twice
    assert _samples(m)[key] == 3


@given(st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), max_size=60))
def test_a_batched_histogram_exports_what_observing_each_value_would(values: list[float]) -> None:
    m = GatewayMetrics(environment="t")
    ours = m.request_duration.child("chat", "a", "2xx", "")
    reference_registry = CollectorRegistry()
    reference = Histogram("ref", "", buckets=ours.bounds[:-1], registry=reference_registry)
    for v in values:
        ours.observe(v)
        reference.observe(v)
    m.flush()
    mine = {
        (s.labels.get("le"), s.name.rsplit("_", 1)[-1]): s.value
        for f in text_string_to_metric_families(render_latest(m)[0].decode())
        if f.name == "gen_ai_server_request_duration_seconds"
        for s in f.samples
        if not s.name.endswith("_created")
    }
    theirs = {
        (s.labels.get("le"), s.name.rsplit("_", 1)[-1]): s.value
        for f in text_string_to_metric_families(generate_latest(reference_registry).decode())
        if f.name == "ref"
        for s in f.samples
        if not s.name.endswith("_created")
    }
    assert mine.keys() == theirs.keys()
    for k, v in theirs.items():
        assert mine[k] == pytest.approx(v)


def test_the_guard_refuses_label_sets_past_the_bound_and_counts_each_refusal() -> None:
    m = GatewayMetrics(environment="t", max_label_sets=10)
    for i in range(13):
        m.tokens.child(f"alias-{i}", "input").inc(5)
    m.flush()
    s = _samples(m)
    series = [k for k in s if k[0] == "tollway_tokens_total"]
    assert len(series) == 10
    refused = s[("tollway_metric_label_sets_refused_total", (("environment", "t"), ("metric", "tollway_tokens")))]
    assert refused == 3
