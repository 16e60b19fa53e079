"""``GET /metrics`` on a real app: what a request records, who may scrape, bounded labels, overhead.

The app is the real one (``create_app``), the upstream the real mock provider on loopback; the
scrape is parsed with prometheus-client's own parser, so a malformed exposition fails here.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tollway.mock.server import MockServerThread
from tollway.server.app import create_app
from tollway.server.observe import Sampler

KEY = "tw-metrics-user-0001"
ADMIN_KEY = "tw-metrics-admin-0001"
PROVIDER_SECRET = "sk-provider-secret-metrics"


def _principal(pid: str, key: str, roles: list[str], models: list[str]) -> dict[str, Any]:
    return {
        "id": pid,
        "tenant": "acme",
        "roles": roles,
        "allowedModels": models,
        "keys": [{"id": f"{pid}-key", "sha256": hashlib.sha256(key.encode()).hexdigest()}],
    }


def _config(mock_url: str, telemetry: dict[str, Any], extra_models: int = 0) -> dict[str, Any]:
    def provider(base: str) -> dict[str, Any]:
        return {
            "type": "openai-compatible",
            "baseUrl": base,
            "providerAccountId": base,
            "quotaGroupId": "q-" + str(abs(hash(base))),
            "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_METRICS_PROVIDER_KEY"}],
            "requestTimeoutMs": 5000,
        }

    def route(rid: str, provider_id: str, priority: int = 0) -> dict[str, Any]:
        return {
            "id": rid,
            "provider": provider_id,
            "model": "mock-gpt-small",
            "providerFormat": "openai-chat-completions",
            "priority": priority,
        }

    models = [
        {"name": "chat-ok", "routes": [route("ok-primary", "ok")]},
        {"name": "chat-fallback", "routes": [route("down-primary", "down"), route("ok-fallback", "ok", 1)]},
        *({"name": f"chat-{i}", "routes": [route(f"r-{i}", "ok")]} for i in range(extra_models)),
    ]
    names = [m["name"] for m in models]
    return {
        "providers": {"ok": provider(mock_url + "/v1"), "down": provider(mock_url + "/_fault/status=500/v1")},
        "models": models,
        "routing": {"maxAttempts": 2, "baseBackoffMs": 1, "maxBackoffMs": 2},
        "principals": [_principal("user", KEY, [], names), _principal("ops", ADMIN_KEY, ["admin"], names)],
        "telemetry": {"environment": "test", **telemetry},
    }


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


@pytest.fixture
async def make(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_METRICS_PROVIDER_KEY", PROVIDER_SECRET)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    made: list[tuple[Any, httpx.AsyncClient]] = []

    async def build(telemetry: dict[str, Any] | None = None, extra_models: int = 0) -> tuple[Any, httpx.AsyncClient]:
        path = tmp_path / "llm-router.yml"
        path.write_text(yaml.safe_dump(_config(mock.base_url, telemetry or {}, extra_models)))
        app = create_app(path, watch_interval_s=None)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        made.append((app, client))
        return app, client

    yield build
    for app, client in made:
        await client.aclose()
        await app.state.runtime.aclose()


async def _chat(client: httpx.AsyncClient, model: str, *, stream: bool = False, key: str = KEY) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "stream": stream}
    return await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})


async def _scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbls), v in samples.items() if n == name and want <= set(lbls))


async def test_requests_attempts_tokens_and_fallbacks_are_counted_with_bounded_labels(make: Any) -> None:
    _, client = await make()
    assert (await _chat(client, "chat-ok")).status_code == 200
    streamed = await _chat(client, "chat-ok", stream=True)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert (await _chat(client, "chat-fallback")).status_code == 200
    assert (await _chat(client, "no-such-model-typed-by-a-client")).status_code == 404

    s = await _scrape(client)
    assert _value(s, "tollway_requests_total", alias="chat-ok", status_class="2xx", environment="test") == 2
    assert _value(s, "tollway_requests_total", alias="chat-ok", stream="true") == 1
    assert _value(s, "tollway_requests_total", alias="", status_class="4xx", error_category="model_not_found") == 1
    assert _value(s, "tollway_attempts_total", route="down-primary", outcome="error", error_category="server") == 1
    assert _value(s, "tollway_attempts_total", route="ok-fallback", outcome="ok", gen_ai_provider_name="openai") == 1
    assert _value(s, "tollway_retries_total", alias="chat-fallback", kind="fallback") == 1
    assert _value(s, "tollway_fallback_depth_count", alias="chat-fallback") == 1
    assert _value(s, "tollway_fallback_depth_sum", alias="chat-fallback") == 1
    assert _value(s, "gen_ai_server_request_duration_seconds_count", gen_ai_request_model="chat-ok") == 2
    assert _value(s, "gen_ai_server_time_to_first_token_seconds_count", gen_ai_request_model="chat-ok") == 1
    assert _value(s, "gen_ai_client_operation_duration_seconds_count", route="down-primary", error_type="server") == 1
    assert _value(s, "gen_ai_client_token_usage_count", gen_ai_request_model="chat-ok", gen_ai_token_type="input") == 2
    assert _value(s, "tollway_tokens_total", alias="chat-ok", type="output") > 0
    assert _value(s, "tollway_fallback_depth_count", alias="chat-ok") == 0  # only requests that fell back
    assert _value(s, "tollway_gateway_overhead_seconds_count", alias="chat-ok") == 2
    assert _value(s, "tollway_stream_duration_seconds_count", alias="chat-ok", outcome="ok") == 1

    label_values = {v for (_, lbls) in s for _, v in lbls}
    assert "no-such-model-typed-by-a-client" not in label_values  # a client's string is never a label
    assert not any(v.startswith(("req_", "user", "ops")) for v in label_values)  # no request or principal ids
    assert PROVIDER_SECRET not in str(s)


async def test_metrics_need_the_admin_role_unless_public(make: Any) -> None:
    _, client = await make()
    assert (await client.get("/metrics")).status_code == 401
    forbidden = await client.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "permission_denied"

    _, public = await make({"metrics": {"access": "public", "path": "/internal/metrics"}})
    assert (await public.get("/internal/metrics")).status_code == 200
    assert (await public.get("/metrics")).status_code == 404


async def test_metrics_off_serves_no_path_and_records_nothing(make: Any) -> None:
    app, client = await make({"metrics": {"enabled": False}})
    assert (await _chat(client, "chat-ok")).status_code == 200
    assert (await client.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})).status_code == 404
    assert app.state.runtime.metrics is None and app.state.runtime.pipeline.observer is None


async def test_the_cardinality_guard_refuses_new_label_sets_past_the_bound_and_counts_them(make: Any) -> None:
    _, client = await make({"metrics": {"maxLabelSets": 10}}, extra_models=14)
    answers = await asyncio.gather(*(_chat(client, f"chat-{i}") for i in range(14)))
    assert {r.status_code for r in answers} == {200}
    s = await _scrape(client)
    series = {lbls for (n, lbls) in s if n == "tollway_requests_total"}
    assert len(series) == 10
    refused = _value(s, "tollway_metric_label_sets_refused_total", metric="tollway_requests")
    assert refused == 4


async def test_overhead_header_reports_the_time_the_gateway_added(make: Any) -> None:
    _, client = await make({"metrics": {"overheadHeader": True}})
    buffered = await _chat(client, "chat-ok")
    streamed = await _chat(client, "chat-ok", stream=True)
    refused = await _chat(client, "chat-ok", key="tw-wrong")
    for response in (buffered, streamed, refused):
        overhead_ms = float(response.headers["x-tollway-overhead-ms"])
        assert 0 <= overhead_ms < 60_000
    _, plain = await make()
    assert "x-tollway-overhead-ms" not in (await _chat(plain, "chat-ok")).headers


async def test_the_sampler_exports_gauges_generation_and_circuit_transitions(make: Any) -> None:
    app, client = await make({}, extra_models=0)
    runtime = app.state.runtime
    for _ in range(6):  # five consecutive 500s trip the fallback alias's primary circuit
        assert (await _chat(client, "chat-fallback")).status_code == 200
    Sampler(runtime, runtime.metrics).sample()
    s = await _scrape(client)
    assert _value(s, "tollway_config_generation") == runtime.holder.root.generation
    assert _value(s, "tollway_requests_active") == 0
    assert _value(s, "tollway_circuit_state_changes_total", deployment="down", state="open") == 1
