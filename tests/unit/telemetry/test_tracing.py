"""Request tracing: traceparent handling, sampling, the retroactive span tree, drops and OTLP export."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.otlp_receiver import OtlpReceiver
from tollway.config.schema import TracingConfig
from tollway.telemetry.tracing import (
    AttemptInfo,
    RequestInfo,
    RequestTrace,
    Tracer,
    format_traceparent,
    parse_traceparent,
    resolve_endpoint,
)

TRACE_HEX = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_HEX = "00f067aa0ba902b7"
SAMPLED_PARENT = f"00-{TRACE_HEX}-{PARENT_HEX}-01"
UNSAMPLED_PARENT = f"00-{TRACE_HEX}-{PARENT_HEX}-00"
WALL_AT_100 = 1_750_000_000_000_000_000
"""The wall clock (ns) the tests pin to monotonic 100.0 s."""
WAIT_S = 10.0


def tracing(**overrides: Any) -> TracingConfig:
    return TracingConfig(enabled=True, **{"sampleRatio": 1.0, **overrides})


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(memory: InMemorySpanExporter) -> Iterator[Tracer]:
    t = Tracer.from_config(tracing(), environment="test", exporter=memory, synchronous=True)
    assert t is not None
    yield t
    t.shutdown()


def pinned(trace: RequestTrace, **marks: float) -> RequestTrace:
    """The trace as if the request started at monotonic 100.0 s, with the given marks."""
    trace.started = 100.0
    trace.wall_offset_ns = WALL_AT_100 - 100 * 10**9
    trace.marks.update(marks)
    return trace


def wall(t: float) -> int:
    return WALL_AT_100 + round((t - 100.0) * 1e9)


def attempt(number: int, reason: str | None, started: float, ended: float | None, **kw: Any) -> AttemptInfo:
    defaults: dict[str, Any] = {
        "route_id": "route-a",
        "deployment_id": "dep-a",
        "provider_name": "openai",
        "first_event_s": None,
        "outcome": "ok",
    }
    return AttemptInfo(number=number, reason=reason, started=started, ended=ended, **{**defaults, **kw})


def request(attempts: list[AttemptInfo], **kw: Any) -> RequestInfo:
    defaults: dict[str, Any] = {
        "request_id": "req_0123456789abcdef01234567",
        "alias": "chat-fast-v1",
        "operation": "chat",
        "stream": False,
        "status": 200,
        "error_code": None,
        "ended": 101.0,
    }
    return RequestInfo(attempts=attempts, **{**defaults, **kw})


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def near(ns: int | None, t: float) -> bool:
    """Within a microsecond: monotonic floats near 100 s carry about 15 significant digits."""
    return ns is not None and abs(ns - wall(t)) < 1_000


# -- traceparent ----------------------------------------------------------------------------------


def test_a_valid_traceparent_yields_its_ids_and_sampled_flag() -> None:
    assert parse_traceparent(SAMPLED_PARENT) == (int(TRACE_HEX, 16), int(PARENT_HEX, 16), True)
    assert parse_traceparent(UNSAMPLED_PARENT) == (int(TRACE_HEX, 16), int(PARENT_HEX, 16), False)
    assert parse_traceparent(f"00-{TRACE_HEX}-{PARENT_HEX}-03") == (int(TRACE_HEX, 16), int(PARENT_HEX, 16), True)
    assert parse_traceparent(f"  {SAMPLED_PARENT}\t") is not None


def test_a_future_version_is_read_by_its_first_four_fields() -> None:
    assert parse_traceparent(f"01-{TRACE_HEX}-{PARENT_HEX}-01-what-comes-later") == (
        int(TRACE_HEX, 16),
        int(PARENT_HEX, 16),
        True,
    )
    assert parse_traceparent(f"01-{TRACE_HEX}-{PARENT_HEX}-01") is not None
    assert parse_traceparent(f"01-{TRACE_HEX}-{PARENT_HEX}-01x") is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        f"00-{TRACE_HEX.upper()}-{PARENT_HEX}-01",
        f"00-{TRACE_HEX}-{PARENT_HEX.upper()}-01",
        f"00-{'0' * 32}-{PARENT_HEX}-01",
        f"00-{TRACE_HEX}-{'0' * 16}-01",
        f"ff-{TRACE_HEX}-{PARENT_HEX}-01",
        f"00-{TRACE_HEX[:-1]}-{PARENT_HEX}-01",
        f"00-{TRACE_HEX}-{PARENT_HEX}0-01",
        f"00-{TRACE_HEX}-{PARENT_HEX}-1",
        f"00-{TRACE_HEX}-{PARENT_HEX}-01-extra",
        f"00-{TRACE_HEX}-{PARENT_HEX[:-1]}g-01",
        f"0-{TRACE_HEX}-{PARENT_HEX}-01",
        f"00_{TRACE_HEX}_{PARENT_HEX}_01",
    ],
)
def test_an_invalid_traceparent_is_refused(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_format_traceparent_round_trips() -> None:
    assert format_traceparent(int(TRACE_HEX, 16), int(PARENT_HEX, 16), True) == SAMPLED_PARENT
    assert format_traceparent(1, 2, False) == f"00-{1:032x}-{2:016x}-00"
    assert parse_traceparent(format_traceparent(1, 2, False)) == (1, 2, False)


# -- sampling -------------------------------------------------------------------------------------


def make(memory: InMemorySpanExporter, **cfg: Any) -> Tracer:
    t = Tracer.from_config(tracing(**cfg), environment="test", exporter=memory, synchronous=True)
    assert t is not None
    return t


def test_ratio_zero_never_samples_and_ratio_one_always_does(memory: InMemorySpanExporter) -> None:
    never, always = make(memory, sampleRatio=0.0), make(memory, sampleRatio=1.0)
    assert all(never.start(None) is None for _ in range(2000))
    traces = [always.start(None) for _ in range(2000)]
    assert all(t is not None and t.sampled and t.parent_span_id is None for t in traces)
    assert len({t.trace_id for t in traces if t is not None}) == 2000


def test_a_ratio_samples_about_that_share_of_requests(memory: InMemorySpanExporter) -> None:
    quarter = make(memory, sampleRatio=0.25)
    sampled = sum(quarter.start(None) is not None for _ in range(20_000))
    assert 4_400 < sampled < 5_600  # 5,000 expected, standard deviation about 61


def test_a_sampled_parent_is_always_followed_and_an_unsampled_one_never(memory: InMemorySpanExporter) -> None:
    never, always = make(memory, sampleRatio=0.0), make(memory, sampleRatio=1.0)
    trace = never.start(SAMPLED_PARENT)
    assert trace is not None
    assert (trace.trace_id_hex, trace.parent_span_id) == (TRACE_HEX, int(PARENT_HEX, 16))
    assert trace.span_id not in (0, trace.parent_span_id)
    assert always.start(UNSAMPLED_PARENT) is None


def test_an_invalid_or_unhonoured_traceparent_leaves_sampling_to_the_ratio(memory: InMemorySpanExporter) -> None:
    honouring, ignoring = make(memory), make(memory, honourTraceparent=False)
    for trace in (
        honouring.start(f"00-{'0' * 32}-{PARENT_HEX}-01"),
        ignoring.start(SAMPLED_PARENT),
        ignoring.start(UNSAMPLED_PARENT),
    ):
        assert trace is not None and trace.parent_span_id is None and trace.trace_id_hex != TRACE_HEX
    assert make(memory, sampleRatio=0.0, honourTraceparent=False).start(SAMPLED_PARENT) is None


# -- the span tree --------------------------------------------------------------------------------


def fallback_request() -> RequestInfo:
    return request(
        [
            attempt(1, "first", 100.030, 100.130, outcome="error", error_category="server", upstream_status=503),
            attempt(2, "retry", 100.200, 100.300, outcome="error", error_category="timeout"),
            attempt(
                3,
                "fallback",
                100.400,
                100.900,
                route_id="route-b",
                deployment_id="dep-b",
                provider_name="anthropic",
                upstream_status=200,
                input_tokens=12,
                output_tokens=34,
            ),
        ],
        ended=100.930,
        input_tokens=12,
        output_tokens=34,
        retries=1,
        fallbacks=1,
    )


def test_a_buffered_request_with_a_retry_and_a_fallback_builds_the_documented_tree(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    trace = tracer.start(SAMPLED_PARENT)
    assert trace is not None
    pinned(trace, resolved=100.010, stages_before=100.020, finish_start=100.910, finish_end=100.920)
    tracer.finish(trace, fallback_request())
    spans = memory.get_finished_spans()
    named = by_name(spans)
    assert sorted(named) == sorted(
        [
            "chat chat-fast-v1",
            "tollway.auth_policy",
            "tollway.quota_reservation",
            "tollway.route_selection",
            "tollway.usage_settlement",
        ]
    )
    assert len(spans) == 8
    assert all(s.context is not None and s.context.trace_id == int(TRACE_HEX, 16) for s in spans)
    assert len({s.context.span_id for s in spans if s.context is not None}) == 8

    (root,) = [s for s in named["chat chat-fast-v1"] if s.kind is SpanKind.SERVER]
    attempts = sorted(
        (s for s in named["chat chat-fast-v1"] if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0
    )
    assert root.context is not None and root.context.span_id == trace.span_id
    assert root.parent is not None and root.parent.is_remote and root.parent.span_id == int(PARENT_HEX, 16)
    assert all(s.parent is not None and s.parent.span_id == trace.span_id for s in spans if s is not root)
    assert not any(s.parent is not None and s.parent.is_remote for s in spans if s is not root)

    assert near(root.start_time, 100.0) and near(root.end_time, 100.930)
    for name, start, end in [
        ("tollway.auth_policy", 100.0, 100.010),
        ("tollway.quota_reservation", 100.010, 100.020),
        ("tollway.route_selection", 100.020, 100.030),
        ("tollway.usage_settlement", 100.910, 100.920),
    ]:
        (span,) = named[name]
        assert near(span.start_time, start) and near(span.end_time, end), name
    for span, (start, end) in zip(attempts, [(100.030, 100.130), (100.200, 100.300), (100.400, 100.900)], strict=True):
        assert near(span.start_time, start) and near(span.end_time, end)
    assert all(s.start_time is not None and s.end_time is not None and s.start_time <= s.end_time for s in spans)

    assert [(e.name, dict(e.attributes or {})) for e in root.events] == [
        ("tollway.retry", {"tollway.attempt.number": 2, "tollway.route.id": "route-a"}),
        ("tollway.fallback", {"tollway.attempt.number": 3, "tollway.route.id": "route-b"}),
    ]
    assert near(root.events[0].timestamp, 100.200) and near(root.events[1].timestamp, 100.400)

    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "chat-fast-v1",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 34,
        "tollway.request_id": "req_0123456789abcdef01234567",
        "http.response.status_code": 200,
        "tollway.stream": False,
        "tollway.retries": 1,
        "tollway.fallbacks": 1,
    }
    assert root.status.status_code is StatusCode.UNSET

    first, retry, fallback = (dict(s.attributes or {}) for s in attempts)
    assert first == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "chat-fast-v1",
        "tollway.route.id": "route-a",
        "tollway.deployment.id": "dep-a",
        "tollway.attempt.number": 1,
        "tollway.attempt.reason": "first",
        "tollway.attempt.outcome": "error",
        "http.response.status_code": 503,
        "error.type": "server",
    }
    assert retry["error.type"] == "timeout" and retry["tollway.attempt.reason"] == "retry"
    assert "http.response.status_code" not in retry
    assert fallback["gen_ai.provider.name"] == "anthropic" and fallback["tollway.route.id"] == "route-b"
    assert (fallback["gen_ai.usage.input_tokens"], fallback["gen_ai.usage.output_tokens"]) == (12, 34)
    assert "error.type" not in fallback and "gen_ai.usage.input_tokens" not in first
    assert [s.status.status_code for s in attempts] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]

    assert root.resource.attributes["service.name"] == "tollway"
    assert root.resource.attributes["deployment.environment.name"] == "test"
    assert root.resource.attributes["telemetry.sdk.language"] == "python"


def test_a_stream_has_first_token_wait_and_stream_transfer_under_its_committed_attempt(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    trace = tracer.start(None)
    assert trace is not None
    pinned(trace, resolved=100.010, stages_before=100.020)
    failed = attempt(1, "first", 100.030, 100.080, stream=True, outcome="error", error_category="timeout")
    committed = attempt(2, "fallback", 100.100, 102.100, stream=True, first_event_s=0.25, output_tokens=40)
    tracer.finish(trace, request([failed, committed], stream=True, ended=102.110))
    named = by_name(memory.get_finished_spans())

    (wait,) = named["tollway.first_token_wait"]
    (transfer,) = named["tollway.stream_transfer"]
    client = {s.context.span_id: s for s in named["chat chat-fast-v1"] if s.kind is SpanKind.CLIENT and s.context}
    assert wait.parent is not None and transfer.parent is not None
    assert wait.parent.span_id == transfer.parent.span_id
    assert dict(client[wait.parent.span_id].attributes or {})["tollway.attempt.number"] == 2
    assert near(wait.start_time, 100.100) and near(wait.end_time, 100.350)
    assert near(transfer.start_time, 100.350) and near(transfer.end_time, 102.100)
    (root,) = [s for s in named["chat chat-fast-v1"] if s.kind is SpanKind.SERVER]
    assert root.parent is None
    assert dict(root.attributes or {})["tollway.stream"] is True


def test_an_attempt_still_pending_at_the_end_closes_with_the_request(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    trace = tracer.start(None)
    assert trace is not None
    pinned(trace)
    tracer.finish(trace, request([attempt(1, "first", 100.2, None, outcome="pending")], status=499, ended=100.5))
    (client,) = [s for s in memory.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert near(client.end_time, 100.5)
    assert dict(client.attributes or {})["tollway.attempt.outcome"] == "pending"


def test_an_error_request_carries_its_error_code_and_a_5xx_is_an_error_status(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    for status, code, expected in [(502, "upstream_unavailable", StatusCode.ERROR), (429, "rate_limited", None)]:
        memory.clear()
        trace = tracer.start(None)
        assert trace is not None
        pinned(trace, resolved=100.001)
        tracer.finish(trace, request([], alias="", status=status, error_code=code, ended=100.002))
        spans = memory.get_finished_spans()
        assert sorted(s.name for s in spans) == ["chat", "tollway.auth_policy"]
        (root,) = [s for s in spans if s.name == "chat"]
        attrs = dict(root.attributes or {})
        assert attrs["error.type"] == code and attrs["http.response.status_code"] == status
        assert "gen_ai.request.model" not in attrs
        assert root.status.status_code is (expected or StatusCode.UNSET)


def test_propagation_upstream_follows_the_config(memory: InMemorySpanExporter) -> None:
    default, on = make(memory).start(None), make(memory, propagateUpstream=True).start(SAMPLED_PARENT)
    assert default is not None and on is not None
    assert (default.propagate, on.propagate) == (False, True)


def test_upstream_traceparent_names_the_span_the_attempt_is_exported_as(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    trace = tracer.start(SAMPLED_PARENT)
    assert trace is not None
    header = trace.upstream_traceparent(2)
    assert trace.upstream_traceparent(2) == header
    parsed = parse_traceparent(header)
    assert parsed is not None
    trace_id, span_id, sampled = parsed
    assert (trace_id, sampled) == (int(TRACE_HEX, 16), True)
    assert span_id not in (trace.span_id, int(PARENT_HEX, 16))
    tracer.finish(
        trace, request([attempt(1, "first", 100.1, 100.2, outcome="error"), attempt(2, "retry", 100.3, 100.4)])
    )
    exported = {
        dict(s.attributes or {})["tollway.attempt.number"]: s.context.span_id
        for s in memory.get_finished_spans()
        if s.kind is SpanKind.CLIENT and s.context is not None
    }
    assert exported[2] == span_id
    assert exported[1] != span_id


ALLOWED_KEYS = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "error.type",
    "http.response.status_code",
    "tollway.request_id",
    "tollway.stream",
    "tollway.retries",
    "tollway.fallbacks",
    "tollway.route.id",
    "tollway.deployment.id",
    "tollway.attempt.number",
    "tollway.attempt.reason",
    "tollway.attempt.outcome",
}


def test_only_listed_keys_and_configured_or_enumerated_strings_reach_a_span(
    tracer: Tracer, memory: InMemorySpanExporter
) -> None:
    info = fallback_request()
    info.status, info.error_code = 503, "upstream_unavailable"
    info.attempts[2].outcome, info.attempts[2].error_category = "midstream_error", None
    trace = tracer.start(SAMPLED_PARENT)
    assert trace is not None
    trace.upstream_traceparent(1)
    pinned(trace, resolved=100.010, stages_before=100.020, finish_start=100.910, finish_end=100.920)
    tracer.finish(trace, info)
    safe_strings: set[str | None] = {info.request_id, info.alias, info.operation, info.error_code, "_OTHER"}
    for a in info.attempts:
        safe_strings |= {a.route_id, a.deployment_id, a.provider_name, a.reason, a.outcome, a.error_category}
    spans = memory.get_finished_spans()
    error_types = {dict(s.attributes or {}).get("error.type") for s in spans}
    assert {"server", "timeout", "_OTHER", "upstream_unavailable"} <= error_types
    for span in spans:
        for attrs in [span.attributes or {}, *(e.attributes or {} for e in span.events)]:
            assert set(attrs) <= ALLOWED_KEYS, span.name
            for key, value in attrs.items():
                assert isinstance(value, (int, bool)) or value in safe_strings, (span.name, key, value)
        assert span.status.description is None
        assert not span.links


# -- drops, failures, configuration ---------------------------------------------------------------


class BlockingExporter(SpanExporter):
    """Holds every export until released: a collector that stopped answering."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        assert self.release.wait(WAIT_S), "the test never released the exporter"
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def five_span_request() -> tuple[RequestInfo, dict[str, float]]:
    """Root, auth_policy, quota_reservation, route_selection and one attempt."""
    return request([attempt(1, "first", 100.3, 100.4)]), {"resolved": 100.1, "stages_before": 100.2}


def test_a_request_whose_spans_do_not_fit_the_queue_is_dropped_whole_and_counted() -> None:
    exporter, counted = BlockingExporter(), list[int]()
    tracer = Tracer.from_config(
        tracing(maxQueueSize=16), environment="test", exporter=exporter, on_dropped=counted.append
    )
    assert tracer is not None
    try:
        kept = []
        for _ in range(4):
            trace = tracer.start(None)
            assert trace is not None
            info, marks = five_span_request()
            tracer.finish(pinned(trace, **marks), info)
            kept.append(trace.trace_id)
        assert counted == [5] and tracer.dropped == 5  # 15 of 16 held; the fourth request's 5 did not fit
        small = tracer.start(None)
        assert small is not None
        tracer.finish(pinned(small), request([]))
        assert counted == [5]  # exactly 16 held now
        full = tracer.start(None)
        assert full is not None
        tracer.finish(pinned(full), request([]))
        assert counted == [5, 1]
        exporter.release.set()
        assert tracer.force_flush(5_000)
        assert len(exporter.spans) == 16
        assert {s.context.trace_id for s in exporter.spans if s.context} == {*kept[:3], small.trace_id}
        again = tracer.start(None)
        assert again is not None
        info, marks = five_span_request()
        tracer.finish(pinned(again, **marks), info)
        assert counted == [5, 1]
    finally:
        exporter.release.set()
        tracer.shutdown()
    late = tracer.start(None)
    assert late is not None
    tracer.finish(pinned(late), request([]))
    assert counted == [5, 1, 1]


def test_finish_never_raises_and_counts_what_it_could_not_build(
    tracer: Tracer, memory: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    trace = tracer.start(None)
    assert trace is not None
    broken = request([None])  # type: ignore[list-item]
    tracer.finish(trace, broken)
    tracer.finish(trace, broken)
    assert tracer.failed == 2 and memory.get_finished_spans() == ()
    assert len([r for r in caplog.records if r.name == "tollway.tracing"]) == 1


def test_finish_survives_an_on_dropped_callback_that_raises() -> None:
    def explode(n: int) -> None:
        raise RuntimeError("metrics broke")

    t = Tracer.from_config(tracing(), environment="test", exporter=InMemorySpanExporter(), on_dropped=explode)
    assert t is not None
    t.shutdown()
    trace = t.start(None)
    assert trace is not None
    t.finish(trace, request([]))
    assert t.dropped == 1 and t.failed == 1


def test_tracing_off_builds_no_tracer_and_on_without_an_endpoint_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Tracer.from_config(TracingConfig(), environment="test") is None
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with pytest.raises(ValueError, match="no endpoint"):
        Tracer.from_config(tracing(), environment="test")


def test_the_endpoint_comes_from_config_then_the_traces_variable_then_the_base_variable() -> None:
    both = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b/"}
    assert resolve_endpoint("http://c:4318/v1/traces", both) == "http://c:4318/v1/traces"
    assert resolve_endpoint("", both) == "http://t:4318/v1/traces"
    assert resolve_endpoint("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318/"}) == "http://b:4318/v1/traces"
    assert resolve_endpoint("", {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None


# -- through OTLP/HTTP ----------------------------------------------------------------------------


def test_spans_reach_a_real_otlp_receiver_over_http() -> None:
    with OtlpReceiver() as rx:
        tracer = Tracer.from_config(
            tracing(endpoint=rx.endpoint, exportTimeoutMs=3000, serviceName="tollway-test"), environment="ci"
        )
        assert tracer is not None
        try:
            trace = tracer.start(SAMPLED_PARENT)
            assert trace is not None
            pinned(trace, resolved=100.010, stages_before=100.020, finish_start=100.910, finish_end=100.920)
            upstream = parse_traceparent(trace.upstream_traceparent(3))
            assert upstream is not None
            tracer.finish(trace, fallback_request())
            assert tracer.force_flush(5_000)
            spans = rx.wait_for(lambda got: len(got) >= 8, WAIT_S)
        finally:
            tracer.shutdown()
        bodies = rx.raw_bodies()

    assert len(spans) == 8
    root_hex = f"{trace.span_id:016x}"
    (root,) = [s for s in spans if s["kind"] == "SERVER"]
    assert (root["name"], root["trace_id"], root["span_id"], root["parent_span_id"]) == (
        "chat chat-fast-v1",
        TRACE_HEX,
        root_hex,
        PARENT_HEX,
    )
    assert root["start_ns"] == wall(100.0) and root["status"] == "UNSET"
    assert root["attributes"]["tollway.request_id"] == "req_0123456789abcdef01234567"
    assert [e["name"] for e in root["events"]] == ["tollway.retry", "tollway.fallback"]
    assert root["events"][1]["attributes"] == {"tollway.attempt.number": 3, "tollway.route.id": "route-b"}
    assert root["resource"]["service.name"] == "tollway-test"
    assert root["resource"]["deployment.environment.name"] == "ci"
    assert {s["trace_id"] for s in spans} == {TRACE_HEX}
    assert all(s["parent_span_id"] == root_hex for s in spans if s is not root)
    clients = {s["attributes"]["tollway.attempt.number"]: s for s in spans if s["kind"] == "CLIENT"}
    assert clients[3]["span_id"] == f"{upstream[1]:016x}"
    assert clients[3]["attributes"]["gen_ai.usage.output_tokens"] == 34
    assert clients[1]["status"] == "ERROR" and clients[1]["attributes"]["error.type"] == "server"
    assert all(s["start_ns"] <= s["end_ns"] for s in spans)
    assert any(b"req_0123456789abcdef01234567" in b for b in bodies)
