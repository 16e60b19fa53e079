"""The gateway function's two Lambda deployments, fed the way AWS feeds them.

Buffered: real Function-URL and API-Gateway event fixtures (``tests/events``) go through the
Mangum handler in ``functions/gateway/handler.py``, with the mock provider serving upstream.
Streaming: ``functions/gateway/run.sh`` starts exactly as the Lambda Web Adapter starts it; the
test polls the readiness path as the adapter does, then streams through it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.cloud.local import free_port
from tollway.mock.server import MockServerThread

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "tests" / "events"
FIXTURE_KEY = "tw-fixture-key-0001"
PROVIDER_SECRET = "sk-provider-secret-never-in-a-response"
PROVIDER_KEY_ENV = "TOLLWAY_FN_PROVIDER_KEY"


def gateway_config(mock_url: str) -> dict[str, Any]:
    def provider(base: str) -> dict[str, Any]:
        return {
            "type": "openai-compatible",
            "baseUrl": base,
            "providerAccountId": "acct",
            "quotaGroupId": "acct-default",
            "credentials": [{"id": "k", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
            "requestTimeoutMs": 5000,
        }

    def model(name: str, provider_id: str) -> dict[str, Any]:
        return {
            "name": name,
            "capabilities": ["streaming", "tools"],
            "routes": [
                {"id": name, "provider": provider_id, "model": "phys", "providerFormat": "openai-chat-completions"}
            ],
        }

    return {
        "maxRequestBodyBytes": 4096,
        "requestTimeoutMs": 10000,
        "providers": {
            "ok": provider(mock_url + "/v1"),
            "down": provider(mock_url + "/_fault/status=500/v1"),
        },
        "models": [model("chat-fast-v1", "ok"), model("chat-down-v1", "down"), model("chat-hidden-v1", "ok")],
        "routing": {"maxAttempts": 2, "baseBackoffMs": 1, "maxBackoffMs": 2},
        "principals": [
            {
                "id": "fixture",
                "tenant": "acme",
                "allowedModels": ["chat-fast-v1", "chat-down-v1"],
                "keys": [{"id": "fixture-key", "sha256": hashlib.sha256(FIXTURE_KEY.encode()).hexdigest()}],
            }
        ],
    }


@pytest.fixture(scope="module")
def mock_url() -> Iterator[str]:
    with MockServerThread() as mock:
        yield mock.base_url


@pytest.fixture(scope="module")
def config_path(mock_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fn") / "llm-router.yml"
    path.write_text(yaml.safe_dump(gateway_config(mock_url)))
    return path


class FakeContext:
    """The attributes of a Lambda context object that handlers may read."""

    function_name = "tollway-gateway"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:tollway-gateway"
    memory_limit_in_mb = "1024"
    aws_request_id = "5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    log_group_name = "/aws/lambda/tollway-gateway"
    log_stream_name = "2026/11/29/[$LATEST]0123456789abcdef"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


@pytest.fixture(scope="module")
def handler(config_path: Path) -> Iterator[Any]:
    """Import the function module fresh, with the environment Lambda would give it."""
    saved = {k: os.environ.get(k) for k in ("TOLLWAY_CONFIG", PROVIDER_KEY_ENV, "AWS_LAMBDA_FUNCTION_NAME")}
    os.environ.update(
        {"TOLLWAY_CONFIG": str(config_path), PROVIDER_KEY_ENV: PROVIDER_SECRET, "AWS_LAMBDA_FUNCTION_NAME": "tollway"}
    )
    for name in ("functions.gateway.handler", "functions.gateway.app"):
        sys.modules.pop(name, None)
    try:
        module = importlib.import_module("functions.gateway.handler")
        yield module.handler
        # Lambda simply freezes the environment; a test process closes the pools it opened and
        # the event loop Mangum created with asyncio.get_event_loop().
        loop = asyncio.get_event_loop()
        loop.run_until_complete(module.app.state.runtime.aclose())
        loop.close()
        asyncio.set_event_loop(None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return data


def with_body(ev: dict[str, Any], body: dict[str, Any] | bytes) -> dict[str, Any]:
    ev = copy.deepcopy(ev)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if ev.get("isBase64Encoded"):
        ev["body"] = base64.b64encode(raw).decode()
    else:
        ev["body"] = raw.decode()
    headers = ev["headers"]
    for name in list(headers):
        if name.lower() == "content-length":
            headers[name] = str(len(raw))
    return ev


def with_key(ev: dict[str, Any], key: str) -> dict[str, Any]:
    ev = copy.deepcopy(ev)
    for section in ("headers", "multiValueHeaders"):
        for name in list(ev.get(section) or {}):
            if name.lower() == "authorization":
                value = f"Bearer {key}"
                ev[section][name] = [value] if section == "multiValueHeaders" else value
    return ev


def body_of(resp: dict[str, Any]) -> Any:
    raw = base64.b64decode(resp["body"]) if resp.get("isBase64Encoded") else resp["body"].encode()
    return json.loads(raw)


def header(resp: dict[str, Any], name: str) -> str | None:
    for k, v in (resp.get("headers") or {}).items():
        if k.lower() == name:
            return str(v)
    for k, vs in (resp.get("multiValueHeaders") or {}).items():
        if k.lower() == name:
            return str(vs[0])
    return None


def assert_no_secret(resp: dict[str, Any]) -> None:
    assert PROVIDER_SECRET not in json.dumps(resp)


@pytest.mark.parametrize(
    "fixture",
    ["function_url_chat.json", "function_url_chat_base64.json", "apigw_rest_chat.json", "apigw_http_chat.json"],
)
def test_buffered_chat_from_each_event_shape(handler: Any, fixture: str) -> None:
    resp = handler(event(fixture), FakeContext())
    assert resp["statusCode"] == 200, resp
    body = body_of(resp)
    assert body["object"] == "chat.completion"
    assert body["model"] == "chat-fast-v1"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["total_tokens"] > 0
    assert header(resp, "x-request-id")
    assert header(resp, "content-type") == "application/json"
    assert_no_secret(resp)


def test_models_lists_only_the_callers_aliases(handler: Any) -> None:
    resp = handler(event("function_url_models.json"), FakeContext())
    assert resp["statusCode"] == 200
    assert sorted(m["id"] for m in body_of(resp)["data"]) == ["chat-down-v1", "chat-fast-v1"]


def test_two_invocations_reuse_one_environment(handler: Any) -> None:
    """The app and its upstream pool outlive an invocation (lifespan is off on purpose)."""
    first = handler(event("function_url_chat.json"), FakeContext())
    second = handler(event("function_url_chat.json"), FakeContext())
    assert (first["statusCode"], second["statusCode"]) == (200, 200)
    assert header(first, "x-request-id") != header(second, "x-request-id")


@pytest.mark.parametrize("fixture", ["function_url_chat.json", "apigw_rest_chat.json"])
def test_bad_key_is_401_in_the_openai_envelope(handler: Any, fixture: str) -> None:
    resp = handler(with_key(event(fixture), "tw-not-a-real-key"), FakeContext())
    assert resp["statusCode"] == 401
    err = body_of(resp)["error"]
    assert err["code"] == "authentication_error" and err["type"] == "authentication_error"
    assert "tw-not-a-real-key" not in json.dumps(resp)


@pytest.mark.parametrize("model", ["chat-missing-v1", "chat-hidden-v1"])
def test_unknown_and_hidden_aliases_are_the_same_404(handler: Any, model: str) -> None:
    ev = with_body(event("function_url_chat.json"), {"model": model, "messages": [{"role": "user", "content": "x"}]})
    resp = handler(ev, FakeContext())
    assert resp["statusCode"] == 404
    assert body_of(resp)["error"]["code"] == "model_not_found"


def test_oversized_body_is_413(handler: Any) -> None:
    big = {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "x" * 8000}]}
    resp = handler(with_body(event("function_url_chat_base64.json"), big), FakeContext())
    assert resp["statusCode"] == 413
    assert body_of(resp)["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_400(handler: Any) -> None:
    resp = handler(with_body(event("apigw_http_chat.json"), b'{"model": "chat-fast-v1", "messages": ['), FakeContext())
    assert resp["statusCode"] == 400
    assert body_of(resp)["error"]["type"] == "invalid_request_error"


def test_provider_failure_is_a_sanitized_502(handler: Any) -> None:
    ev = with_body(
        event("function_url_chat.json"), {"model": "chat-down-v1", "messages": [{"role": "user", "content": "x"}]}
    )
    resp = handler(ev, FakeContext())
    assert resp["statusCode"] == 502
    err = body_of(resp)["error"]
    assert (err["type"], err["code"]) == ("server_error", "provider_error")
    assert "mock" not in err["message"].lower()
    assert_no_secret(resp)


def test_stream_request_through_mangum_gets_the_whole_sse_body(handler: Any) -> None:
    body = {"model": "chat-fast-v1", "stream": True, "messages": [{"role": "user", "content": "Say hello."}]}
    resp = handler(with_body(event("function_url_chat.json"), body), FakeContext())
    assert resp["statusCode"] == 200
    assert (header(resp, "content-type") or "").startswith("text/event-stream")
    raw = base64.b64decode(resp["body"]).decode() if resp.get("isBase64Encoded") else resp["body"]
    frames = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_streaming_app_runs_as_the_web_adapter_runs_it(config_path: Path) -> None:
    """run.sh with the adapter's environment; readiness polled on /healthz; SSE streamed through."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PORT": str(port),
        "AWS_LWA_PORT": str(port),
        "AWS_LWA_INVOKE_MODE": "response_stream",
        "AWS_LWA_READINESS_CHECK_PATH": "/healthz",
        "AWS_LAMBDA_FUNCTION_NAME": "tollway-gateway",
        "TOLLWAY_CONFIG": str(config_path),
        PROVIDER_KEY_ENV: PROVIDER_SECRET,
    }
    proc = subprocess.Popen(
        [str(ROOT / "functions" / "gateway" / "run.sh")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "run.sh exited before it was ready"
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "readiness path never answered"
            time.sleep(0.05)
        body = {"model": "chat-fast-v1", "stream": True, "messages": [{"role": "user", "content": "Say hello."}]}
        headers = {"authorization": f"Bearer {FIXTURE_KEY}"}
        frames: list[str] = []
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers, timeout=10) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert "content-length" not in resp.headers  # streamed, not buffered
            frames.extend(line[6:] for line in resp.iter_lines() if line.startswith("data: "))
        assert frames[-1] == "[DONE]" and len(frames) > 2
    finally:
        proc.terminate()
        proc.wait(10)


def test_heavy_modules_stay_off_the_functions_import_path(config_path: Path) -> None:
    """A cold start pays for every import: no AWS SDK, CDK, emulator or FastAPI on the gateway's path."""
    code = "import sys, functions.gateway.handler; print(','.join(sorted({m.split('.')[0] for m in sys.modules})))"
    env = {**os.environ, "TOLLWAY_CONFIG": str(config_path), PROVIDER_KEY_ENV: PROVIDER_SECRET}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.strip().split(","))
    assert {"mangum", "starlette", "tollway"} <= loaded
    assert not loaded & {"boto3", "botocore", "aws_cdk", "jsii", "moto", "fastapi", "granian", "matplotlib"}


@pytest.fixture
def runtime_metrics(handler: Any) -> Iterator[tuple[Any, Any]]:
    """The buffered app's runtime and its metrics (a fresh ``GatewayMetrics`` when the config has none);
    the runtime's own ``metrics`` is put back afterwards."""
    from tollway.telemetry.metrics import GatewayMetrics

    runtime = sys.modules["functions.gateway.handler"].app.state.runtime
    missing = object()
    saved = getattr(runtime, "metrics", missing)
    metrics = saved if saved not in (None, missing) else GatewayMetrics(environment="fn-test")
    runtime.metrics = metrics
    try:
        yield runtime, metrics
    finally:
        if saved is missing:
            del runtime.metrics
        else:
            runtime.metrics = saved


def emf_lines(out: str) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]
    for doc in docs:
        assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Tollway"
    return docs


def test_each_invocation_prints_what_its_metrics_recorded_as_emf(
    handler: Any, runtime_metrics: tuple[Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _, metrics = runtime_metrics
    handler(event("function_url_models.json"), FakeContext())  # flushes whatever came before
    capsys.readouterr()
    metrics.config_reloads.child("applied").inc()

    resp = handler(event("function_url_models.json"), FakeContext())
    assert resp["statusCode"] == 200
    reloads = [d for d in emf_lines(capsys.readouterr().out) if "tollway_config_reloads_total" in d]
    assert [d["tollway_config_reloads_total"] for d in reloads] == [1.0]

    handler(event("function_url_models.json"), FakeContext())
    assert not [d for d in emf_lines(capsys.readouterr().out) if "tollway_config_reloads_total" in d]


def test_without_metrics_an_invocation_prints_no_emf(
    handler: Any, runtime_metrics: tuple[Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, _ = runtime_metrics
    runtime.metrics = None
    capsys.readouterr()
    assert handler(event("function_url_models.json"), FakeContext())["statusCode"] == 200
    assert emf_lines(capsys.readouterr().out) == []


def test_a_failing_flush_never_fails_the_invocation(
    handler: Any, runtime_metrics: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    class Unreadable:
        @property
        def registry(self) -> Any:
            raise RuntimeError("registry gone")

    runtime, _ = runtime_metrics
    runtime.metrics = Unreadable()
    assert handler(event("function_url_models.json"), FakeContext())["statusCode"] == 200
    assert "EMF metrics flush failed" in caplog.text
