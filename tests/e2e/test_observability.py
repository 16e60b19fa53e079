"""Metrics, traces and logs of a real gateway (``tollway serve``, two workers) under the official SDK.

The gateway exports traces over OTLP/HTTP to a real receiver on loopback (every request sampled,
``traceparent`` propagated upstream), serves ``/metrics`` aggregated across its two worker
processes, and writes JSON logs with its access log on. The last test is the content-leak check:
canary strings go into prompts, tool-call arguments, tool results and a provider's error body,
through a stream that breaks on a malformed frame too; then every log line, every metric series
and every exported span (the raw OTLP bodies) is scanned for them, and for the provider
credential and the client's key. Zero hits.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import APIStatusError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import mock_requests
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.processes import Gateway, Proc, start_gateway

pytestmark = pytest.mark.e2e

PROVIDER_KEY_ENV = "TOLLWAY_OBS_PROVIDER_KEY"
PROVIDER_SECRET = "sk-obs-provider-credential-canary-91c2"
CANARY_PROMPT = "canary-prompt-5d1e7a"
CANARY_TOOL_ARGS = "canary-toolargs-8b3f20"
CANARY_TOOL_RESULT = "canary-toolresult-2c9d44"
CANARY_PROVIDER_ERROR = "canaryprovidererror7e11"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _config(mock_url: str, otlp: str, user_digest: str, admin_digest: str) -> dict[str, Any]:
    def provider(base: str, account: str) -> dict[str, Any]:
        return {
            "type": "openai-compatible",
            "baseUrl": base,
            "providerAccountId": account,
            "quotaGroupId": account + "-q",
            "credentials": [{"id": account + "-key", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
            "requestTimeoutMs": 10000,
        }

    def route(rid: str, prov: str, priority: int = 0) -> dict[str, Any]:
        return {
            "id": rid,
            "provider": prov,
            "model": f"phys-{rid}",
            "providerFormat": "openai-chat-completions",
            "priority": priority,
        }

    caps = ["streaming", "tools"]
    models = [
        {"name": "obs-ok", "capabilities": caps, "routes": [route("ok", "ok")]},
        {"name": "obs-fallback", "capabilities": caps, "routes": [route("down", "down"), route("up", "ok", 1)]},
        {"name": "obs-error", "capabilities": caps, "routes": [route("leaky", "leaky")]},
        {"name": "obs-malformed", "capabilities": caps, "routes": [route("broken", "broken")]},
    ]
    names = [m["name"] for m in models]
    fault = mock_url + "/_fault/{}/v1"
    return {
        "requestTimeoutMs": 20000,
        "providers": {
            "ok": provider(mock_url + "/v1", "acct-ok"),
            "down": provider(fault.format("status=503"), "acct-down"),
            "leaky": provider(fault.format(f"status=400,error_type={CANARY_PROVIDER_ERROR}"), "acct-leaky"),
            "broken": provider(fault.format("malformed=2,chunks=6"), "acct-broken"),
        },
        "models": models,
        "routing": {"maxAttempts": 2, "baseBackoffMs": 1, "maxBackoffMs": 5},
        "principals": [
            {
                "id": "user",
                "tenant": "acme",
                "allowedModels": names,
                "keys": [{"id": "user-key", "sha256": user_digest}],
            },
            {
                "id": "ops",
                "tenant": "acme",
                "roles": ["admin"],
                "allowedModels": names,
                "keys": [{"id": "ops-key", "sha256": admin_digest}],
            },
        ],
        "telemetry": {
            "environment": "e2e",
            "tracing": {"enabled": True, "endpoint": otlp, "sampleRatio": 1.0, "propagateUpstream": True},
        },
    }


_OPEN: list[OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every client a test made is closed after it: a socket left to the collector warns (an error here)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


class Stack:
    def __init__(self, gateway: Gateway, receiver: OtlpReceiver, mock: Proc, user: str, admin: str) -> None:
        self.gateway, self.receiver, self.mock = gateway, receiver, mock
        self.user_key, self.admin_key = user, admin

    def client(self) -> OpenAI:
        client = OpenAI(base_url=self.gateway.base_url, api_key=self.user_key, max_retries=0, timeout=20)
        _OPEN.append(client)
        return client

    def metrics_text(self) -> str:
        url = self.gateway.base_url.removesuffix("/v1") + "/metrics"
        response = httpx.get(url, headers={"authorization": f"Bearer {self.admin_key}"}, timeout=10)
        assert response.status_code == 200
        return response.text


@pytest.fixture(scope="module")
def stack(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    user = "tw-obs-user-" + secrets.token_urlsafe(12)
    admin = "tw-obs-admin-" + secrets.token_urlsafe(12)
    digest = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    path: Path = tmp_path_factory.mktemp("obs") / "llm-router.yml"
    with OtlpReceiver() as receiver:
        path.write_text(yaml.safe_dump(_config(mock_provider.url, receiver.endpoint, digest(user), digest(admin))))
        gateway = start_gateway(path, {PROVIDER_KEY_ENV: PROVIDER_SECRET}, workers=2)
        try:
            yield Stack(gateway, receiver, mock_provider, user, admin)
        finally:
            gateway.proc.stop()


def _spans_of(receiver: OtlpReceiver, trace_id: str, *, at_least: int) -> list[dict[str, Any]]:
    return receiver.wait_for(lambda spans: len([s for s in spans if s["trace_id"] == trace_id]) >= at_least, 20)


def _trace_of(stack: Stack, request_id: str) -> tuple[str, list[dict[str, Any]]]:
    """The trace whose root span carries ``request_id``, once its spans arrived."""
    spans = stack.receiver.wait_for(
        lambda ss: any(s["attributes"].get("tollway.request_id") == request_id for s in ss), 20
    )
    trace_id = next(s["trace_id"] for s in spans if s["attributes"].get("tollway.request_id") == request_id)
    return trace_id, [s for s in stack.receiver.spans() if s["trace_id"] == trace_id]


def test_a_buffered_call_is_one_server_span_with_its_phases_and_a_genai_attempt_span(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model="obs-ok", messages=[{"role": "user", "content": "hello"}]
    )
    request_id = raw.headers["x-request-id"]
    trace_id, spans = _trace_of(stack, request_id)
    spans = _spans_of(stack.receiver, trace_id, at_least=5)
    spans = [s for s in spans if s["trace_id"] == trace_id]
    by_name = {s["name"]: s for s in spans}
    root = next(s for s in spans if s["kind"] == "SERVER")
    assert root["name"] == "chat obs-ok"
    assert root["attributes"]["gen_ai.request.model"] == "obs-ok"
    assert root["attributes"]["http.response.status_code"] == 200
    for phase in ("tollway.auth_policy", "tollway.route_selection", "tollway.usage_settlement"):
        assert by_name[phase]["parent_span_id"] == root["span_id"]
    attempt = next(s for s in spans if s["kind"] == "CLIENT")
    assert attempt["parent_span_id"] == root["span_id"]
    assert attempt["attributes"]["gen_ai.provider.name"] == "openai"
    assert attempt["attributes"]["gen_ai.operation.name"] == "chat"
    assert attempt["attributes"]["tollway.route.id"] == "ok"
    assert attempt["attributes"]["gen_ai.usage.output_tokens"] > 0
    # The provider was sent the attempt span as its parent.
    sent = [r for r in mock_requests(stack.mock) if str(r.get("traceparent", "")).split("-")[1:2] == [trace_id]]
    assert [r["traceparent"].split("-")[2] for r in sent] == [attempt["span_id"]]


def test_a_stream_separates_the_first_token_wait_from_the_transfer(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model="obs-ok", messages=[{"role": "user", "content": "stream please"}], stream=True
    )
    request_id = raw.headers["x-request-id"]
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    trace_id, _ = _trace_of(stack, request_id)
    spans = [s for s in _spans_of(stack.receiver, trace_id, at_least=7) if s["trace_id"] == trace_id]
    attempt = next(s for s in spans if s["kind"] == "CLIENT")
    wait = next(s for s in spans if s["name"] == "tollway.first_token_wait")
    transfer = next(s for s in spans if s["name"] == "tollway.stream_transfer")
    assert wait["parent_span_id"] == attempt["span_id"] == transfer["parent_span_id"]
    assert wait["end_ns"] <= transfer["start_ns"] + 1000
    assert not any("chunk" in s["name"] for s in spans)  # no span per stream chunk


def test_a_fallback_is_an_event_on_the_request_and_a_span_per_attempt(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model="obs-fallback",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    assert raw.http_response.status_code == 200
    spans = [s for s in _spans_of(stack.receiver, CLIENT_TRACE, at_least=6) if s["trace_id"] == CLIENT_TRACE]
    root = next(s for s in spans if s["kind"] == "SERVER")
    assert root["parent_span_id"] == CLIENT_SPAN  # the client's traceparent was honoured
    assert [e["name"] for e in root["events"]] == ["tollway.fallback"]
    attempts = sorted(
        (s for s in spans if s["kind"] == "CLIENT"), key=lambda s: s["attributes"]["tollway.attempt.number"]
    )
    assert [a["attributes"]["tollway.route.id"] for a in attempts] == ["down", "up"]
    assert attempts[0]["attributes"]["error.type"] == "overloaded" or attempts[0]["status"] == "ERROR"


def test_an_error_is_recorded_on_the_request_span_by_category_only(stack: Stack) -> None:
    with pytest.raises(APIStatusError) as caught:
        stack.client().chat.completions.create(model="obs-error", messages=[{"role": "user", "content": "x"}])
    request_id = caught.value.response.headers["x-request-id"]
    trace_id, _ = _trace_of(stack, request_id)
    spans = [s for s in _spans_of(stack.receiver, trace_id, at_least=4) if s["trace_id"] == trace_id]
    root = next(s for s in spans if s["kind"] == "SERVER")
    assert root["attributes"]["http.response.status_code"] == caught.value.status_code
    assert root["attributes"]["error.type"] == caught.value.body["code"]  # type: ignore[index]
    attempt = next(s for s in spans if s["kind"] == "CLIENT")
    assert attempt["status"] == "ERROR" and attempt["attributes"]["error.type"] == "invalid_request"


def test_metrics_aggregate_both_workers_and_carry_only_bounded_labels(stack: Stack) -> None:
    client = stack.client()
    for _ in range(12):  # spread over the two workers by the kernel's accept balancing
        client.chat.completions.create(model="obs-ok", messages=[{"role": "user", "content": "count me"}])
    # Each worker writes its counts to the shared files once a second (and the one that answers
    # the scrape before it), so the other worker's requests appear within a second or so.
    deadline = time.monotonic() + 15
    while True:
        series = list(text_string_to_metric_families(stack.metrics_text()))
        ok = sum(
            s.value
            for f in series
            for s in f.samples
            if s.name == "tollway_requests_total"
            and s.labels["alias"] == "obs-ok"
            and s.labels["status_class"] == "2xx"
        )
        if ok >= 12 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ok >= 12
    names = {f.name for f in series}
    assert {
        "gen_ai_client_token_usage",
        "gen_ai_server_request_duration_seconds",
        "tollway_gateway_overhead_seconds",
    } <= names


def test_no_canary_reaches_a_log_line_a_metric_or_a_span(stack: Stack) -> None:
    client = stack.client()
    before = sum(s["kind"] == "SERVER" for s in stack.receiver.spans())
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    history: list[Any] = [
        {"role": "user", "content": f"please remember {CANARY_PROMPT}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"q": CANARY_TOOL_ARGS})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": CANARY_TOOL_RESULT},
    ]
    answer = client.chat.completions.create(model="obs-ok", messages=history, tools=[tool])
    assert CANARY_TOOL_RESULT in (answer.choices[0].message.content or "")  # the mock echoes it: a completion canary
    list(client.chat.completions.create(model="obs-ok", messages=history, tools=[tool], stream=True))
    with pytest.raises(APIStatusError):
        client.chat.completions.create(model="obs-error", messages=history)
    # One undecodable frame in the middle of a stream is skipped and counted; the stream goes on.
    malformed = client.chat.completions.create(model="obs-malformed", messages=history, stream=True)
    assert CANARY_TOOL_RESULT in "".join(c.choices[0].delta.content or "" for c in malformed if c.choices)
    bad = httpx.post(
        stack.gateway.base_url + "/chat/completions",
        content=b'{"model": "obs-ok", "messages": [{"role": "user", "content": "' + CANARY_PROMPT.encode() + b'"}',
        headers={"authorization": f"Bearer {stack.user_key}", "content-type": "application/json"},
        timeout=10,
    )
    assert bad.status_code == 400
    # Every span of these requests is exported before the scan.
    stack.receiver.wait_for(lambda ss: sum(s["kind"] == "SERVER" for s in ss) >= before + 5, 20)
    metrics = stack.metrics_text()
    log = stack.gateway.proc.log()
    assert log.strip(), "the gateway wrote no log lines to scan"
    exported = b"".join(stack.receiver.raw_bodies())
    canaries = [CANARY_PROMPT, CANARY_TOOL_ARGS, CANARY_TOOL_RESULT, CANARY_PROVIDER_ERROR, PROVIDER_SECRET]
    canaries += [stack.user_key, stack.admin_key]
    for canary in canaries:
        assert canary not in log, f"{canary} in the gateway's log"
        assert canary not in metrics, f"{canary} in a metric series"
        assert canary.encode() not in exported, f"{canary} in an exported span"
    # The scans looked at real material: the access log has the requests, the spans their ids.
    assert "obs-malformed" in log and b"obs-error" in exported and "obs_" not in metrics.split("\n", 1)[0]
