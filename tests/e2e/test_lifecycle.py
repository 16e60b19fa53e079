"""The commands a user runs: ``tollway up``, ``serve`` with workers, ``config validate``, reload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import PROVIDER_KEY_ENV, build_config
from tests.support.processes import ROOT, Gateway, Proc, new_key, start_gateway, wait_healthy

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "shared" / "tollway" / "examples" / "llm-router.yml"


def _wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _banner(proc: subprocess.Popen[str]) -> dict[str, str]:
    """Read ``tollway up``'s banner lines (``  name : value``) up to the Ctrl-C hint."""
    assert proc.stdout is not None
    lines: dict[str, str] = {}
    for _ in range(40):
        line = proc.stdout.readline()
        if not line or line.startswith("Press Ctrl-C"):
            break
        name, sep, value = line.partition(" : ")
        if sep and name.startswith("  "):
            lines[name.strip()] = value.strip()
    return lines


def _stop_up(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def _sdk_round_trip(base: str, key: str) -> None:
    wait_healthy(base.removesuffix("/v1") + "/healthz")
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as sdk:
        for model in ("chat-fast-v1", "chat-claude-v1"):
            resp = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            assert resp.choices[0].message.content
        chunks = list(
            sdk.chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}], stream=True)
        )
        assert any(c.choices and c.choices[0].delta.content for c in chunks)


def _gemini_and_bedrock_round_trip(base: str, key: str) -> None:
    """The demo's Gemini and Bedrock Converse aliases, through the official SDKs, buffered and streamed
    (Bedrock's requests SigV4-signed with the dummy credentials ``up`` gives the gateway)."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as sdk:
        for model in ("chat-gemini-v1", "chat-bedrock-v1"):
            resp = sdk.chat.completions.create(model=model, messages=messages)
            assert resp.model == model and resp.choices[0].message.content, resp
            assert resp.usage is not None and resp.usage.completion_tokens > 0, resp
            chunks = list(sdk.chat.completions.create(model=model, messages=messages, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks
            assert any(c.choices and c.choices[0].finish_reason == "stop" for c in chunks), chunks
    with anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key, max_retries=0) as client:
        message = client.messages.create(
            model="chat-bedrock-v1", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert message.stop_reason == "end_turn" and message.content[0].type == "text" and message.content[0].text, message


def test_up_prints_base_url_and_demo_key_that_work(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOLLWAY_DEMO_KEY"}
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.cli", "up", "--port", "0", "--no-cloud"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        lines = _banner(proc)
        base, key = lines["base URL"], lines["demo key"]
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
        assert key.startswith("tw-demo-") and len(key) > 20
        assert lines["cloud"].startswith("off")
        _sdk_round_trip(base, key)
        _gemini_and_bedrock_round_trip(base, key)
    finally:
        _stop_up(proc)
        log.close()
    assert proc.returncode == 0, (tmp_path / "up.log").read_text()


def test_up_brings_up_the_local_cloud_and_stops_all_of_it(tmp_path: Path) -> None:
    """One command: mock providers, moto server with every resource bootstrapped, runner, gateway."""
    import boto3

    from tollway.cloud.resources import topology

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "TOLLWAY_DEMO_KEY"}
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.cli", "up", "--port", "0", "--cloud-port", "0", "--stage", "e2e"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=tmp_path,  # moto's log goes to ./.tollway, kept out of the checkout
    )
    try:
        lines = _banner(proc)
        endpoint = lines["cloud"].split()[0]
        assert endpoint.startswith("http://127.0.0.1:"), lines
        _sdk_round_trip(lines["base URL"], lines["demo key"])
        # The banner names the metrics URL, and the demo config serves it without a key.
        metrics_url = lines["metrics"].split()[0]
        assert metrics_url == lines["base URL"].removesuffix("/v1") + "/metrics", lines
        scrape = httpx.get(metrics_url, timeout=10)
        assert scrape.status_code == 200 and "tollway_requests_total{" in scrape.text, scrape.text[:500]
        session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
        sqs = session.client("sqs", endpoint_url=endpoint)
        dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        secrets_manager = session.client("secretsmanager", endpoint_url=endpoint)
        queues = {url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])}
        topo = topology("e2e")
        for q in topo.queues:
            assert {q.name, q.dlq_name} <= queues
        assert {t.name for t in topo.tables} <= set(dynamodb.list_tables()["TableNames"])
        # the provider secrets hold the mock provider key, which up generated and never printed
        value = secrets_manager.get_secret_value(SecretId=topo.secret("openai").name)["SecretString"]
        assert value.startswith("mock-") and value not in (tmp_path / "up.log").read_text()
        # The audit trail is on: the round trip's three requests reach the audit table through
        # WAL → shipper → SQS → runner → audit writer.
        # As the README shows it: the local endpoint is enough, no AWS credentials or region needed.
        audit_env = {**env, "AWS_ENDPOINT_URL": endpoint, "TOLLWAY_STAGE": "e2e"}
        listing = ""
        for _ in range(30):
            done = subprocess.run(
                [sys.executable, "-m", "tollway.cli", "audit", "list", "--since", "5m", "--principal", "demo"],
                capture_output=True,
                text=True,
                env=audit_env,
                timeout=30,
            )
            listing = done.stdout + done.stderr
            if listing.count("req_") >= 3:
                break
            time.sleep(0.3)
        assert listing.count("req_") == 3, listing
        # TOKENS, the last column, reads the usage names the gateway's recorder writes.
        rows = [line.split() for line in done.stdout.splitlines() if "req_" in line]
        assert all(row[-1].isdigit() and int(row[-1]) > 0 for row in rows), listing
        # The same requests reach the usage ledger through the usage queue and the usage
        # reconciler, and the caller reads its own usage back through the gateway.
        headers = {"authorization": f"Bearer {lines['demo key']}"}
        usage: dict[str, Any] = {}
        for _ in range(60):
            resp = httpx.get(lines["base URL"] + "/usage", params={"group_by": "alias"}, headers=headers, timeout=10)
            assert resp.status_code == 200, resp.text
            usage = resp.json()
            if sum(b["requests"] for b in usage["data"]) >= 3:
                break
            time.sleep(0.3)
        assert sum(b["requests"] for b in usage["data"]) == 3, usage
        assert usage["scope"] == {"tenant": "local", "principal": "demo"}
        assert all(b["total_tokens"] > 0 and b["usage_evidence"] for b in usage["data"]), usage
        # The bundled example prices the mock's models, so every request has a known cost.
        assert all(b["cost_micro_usd"] > 0 and b["unknown_cost_requests"] == 0 for b in usage["data"]), usage
        bad = httpx.get(lines["base URL"] + "/usage", params={"group_by": "color"}, headers=headers, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        # The demo's PII alias: its placeholder key lives in the local cloud's Secrets Manager, and the
        # caller gets the e-mail back while the audit record holds only the manifest.
        pii_key = secrets_manager.get_secret_value(SecretId="e2e/pii-placeholder-key")["SecretString"]
        assert len(pii_key) >= 32 and pii_key not in (tmp_path / "up.log").read_text()
        with openai.OpenAI(base_url=lines["base URL"], api_key=lines["demo key"], max_retries=0) as sdk:
            pii = sdk.chat.completions.create(
                model="chat-pii-v1", messages=[{"role": "user", "content": "mail jane.doe@example.com"}]
            )
        assert "mail jane.doe@example.com" in (pii.choices[0].message.content or "")
        shown = ""
        for _ in range(60):
            done = subprocess.run(
                [sys.executable, "-m", "tollway.cli", "audit", "show", "req_" + pii.id.removeprefix("chatcmpl-")],
                capture_output=True,
                text=True,
                env=audit_env,
                timeout=30,
            )
            shown = done.stdout
            if "pii pii-request" in shown:
                break
            time.sleep(0.3)
        assert "pii pii-request" in shown and "replaced email=1" in shown and "exact=1" in shown, shown + done.stderr
        assert "jane.doe" not in shown
    finally:
        _stop_up(proc)
        log.close()
    assert proc.returncode == 0, (tmp_path / "up.log").read_text()
    with pytest.raises(httpx.TransportError):
        httpx.get(endpoint, timeout=2)  # moto server stopped with everything else


def test_config_validate_reports_each_error_with_its_path(tmp_path: Path) -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["models"][0]["routes"][0]["provider"] = "nope"
    cfg["providers"]["mock-openai"]["baseUrl"] = "http://user:pw@example.com/v1"
    cfg["unsupportedParameterPolicy"] = "maybe"
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "TOLLWAY_MOCK_URL": "http://127.0.0.1:1", "TOLLWAY_DEMO_KEY": "k"}
    result = subprocess.run(
        [sys.executable, "-m", "tollway.cli", "config", "validate", str(bad)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1
    assert "models[0].routes[0].provider" in result.stderr
    assert "providers.mock-openai.baseUrl" in result.stderr
    assert "unsupportedParameterPolicy" in result.stderr
    assert "pw" not in result.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "tollway.cli", "config", "validate", str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout


def _models(gw: Gateway, key: str) -> set[str]:
    resp = httpx.get(gw.base_url + "/models", headers={"authorization": f"Bearer {key}"}, timeout=5)
    return {m["id"] for m in resp.json()["data"]}


def _own_gateway(mock: Proc, tmp_path: Path, workers: int = 1) -> tuple[Gateway, dict[str, object], str]:
    key_a, digest_a = new_key()
    _, digest_b = new_key()
    cfg = build_config(mock.url, {"team-a": digest_a, "team-b": digest_b})
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-reload-test"}, workers=workers)
    return gw, cfg, key_a


def test_reload_swaps_valid_config_and_keeps_last_valid_on_error(mock_provider: Proc, tmp_path: Path) -> None:
    gw, cfg, key = _own_gateway(mock_provider, tmp_path)
    try:
        assert "chat-new-v1" not in _models(gw, key)
        models = cfg["models"]
        assert isinstance(models, list)
        models.append({"name": "chat-new-v1", "routes": [dict(models[0]["routes"][0], id="new-route")]})
        principals = cfg["principals"]
        assert isinstance(principals, list)
        principals[0]["allowedModels"].append("chat-new-v1")
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert _wait_for(lambda: "chat-new-v1" in _models(gw, key)), gw.proc.log()

        gw.config_path.write_text("models: [unclosed\n")
        assert _wait_for(lambda: "config reload rejected" in gw.proc.log()), gw.proc.log()
        assert "chat-new-v1" in _models(gw, key)
        with openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as sdk:
            resp = sdk.chat.completions.create(model="chat-new-v1", messages=[{"role": "user", "content": "hi"}])
            assert resp.model == "chat-new-v1"

        models.pop()
        principals[0]["allowedModels"].remove("chat-new-v1")
        gw.config_path.write_text(yaml.safe_dump(cfg))
        os.kill(gw.proc.proc.pid, signal.SIGHUP)
        assert _wait_for(lambda: "chat-new-v1" not in _models(gw, key)), gw.proc.log()
    finally:
        gw.proc.stop()


def test_two_workers_serve_and_both_reload_on_sighup(mock_provider: Proc, tmp_path: Path) -> None:
    gw, cfg, key = _own_gateway(mock_provider, tmp_path, workers=2)
    health = gw.base_url.removesuffix("/v1") + "/healthz"
    pids: set[int] = set()
    try:
        assert _wait_for(lambda: pids.add(httpx.get(health, timeout=2).json()["pid"]) or len(pids) == 2, 20)
        with openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as sdk:
            for _ in range(10):
                sdk.chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}])
        cfg["requestTimeoutMs"] = 25000
        gw.config_path.write_text(yaml.safe_dump(cfg))
        os.kill(gw.proc.proc.pid, signal.SIGHUP)
        assert _wait_for(lambda: gw.proc.log().count("config generation 2 active") == 2), gw.proc.log()
    finally:
        gw.proc.stop()
    assert gw.proc.proc.returncode == 0


def test_sigterm_stops_serve_and_removes_its_metric_files(mock_provider: Proc, tmp_path: Path) -> None:
    """uvicorn re-raises SIGTERM after its graceful stop; ``serve`` must still run its own clean-up."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    key, digest = new_key()
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(build_config(mock_provider.url, {"team-a": digest, "team-b": new_key()[1]})))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-sigterm-test", "TMPDIR": str(temp)})
    try:
        with openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as sdk:
            sdk.chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}])
        (metrics,) = temp.glob("tollway-metrics-*")
        assert metrics.name.startswith(f"tollway-metrics-{gw.proc.proc.pid}-")
        assert any(metrics.iterdir()), "the worker wrote its metric files"
        gw.proc.proc.send_signal(signal.SIGTERM)
        assert gw.proc.proc.wait(timeout=20) == 0, gw.proc.log()
    finally:
        gw.proc.stop()
    assert list(temp.glob("tollway-metrics-*")) == []


def test_client_disconnect_cancels_the_upstream_stream(gateway: Gateway, mock_provider: Proc) -> None:
    slow = {"model": "chat-slow-v1", "messages": [{"role": "user", "content": "slow words here"}], "stream": True}
    headers = {"authorization": f"Bearer {gateway.keys['team-a']}", "x-mock-chunk-gap-ms": "0"}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=slow, headers=headers, timeout=10) as resp:
        rid = resp.headers["x-request-id"]
        next(resp.iter_raw())
    started = time.monotonic()
    line = gateway.proc.wait_log_line(lambda ln: f'"request_id":"{rid}","status":499' in ln, timeout=5)
    assert time.monotonic() - started < 3, "the upstream call should be cancelled promptly, not run to its end"
    # The client's x-mock-* header never reached the provider: the stream was still slow.
    assert '"cancelled"' in line


@pytest.mark.parametrize(("alias", "stream"), [("chat-delay-v1", False), ("chat-ttft-v1", True)])
def test_client_disconnect_before_output_cancels_the_upstream_call(gateway: Gateway, alias: str, stream: bool) -> None:
    body = {"model": alias, "messages": [{"role": "user", "content": "wait for it"}], "stream": stream}
    headers = {"authorization": f"Bearer {gateway.keys['team-a']}"}
    before = sum('"status":499' in ln for ln in gateway.proc.log_lines())
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=0.5)
    assert _wait_for(lambda: sum('"status":499' in ln for ln in gateway.proc.log_lines()) > before, timeout=5), (
        gateway.proc.log()
    )
    assert time.monotonic() - started < 2.5, "the provider takes 3 s; the gateway must give up when the client does"
    line = [ln for ln in gateway.proc.log_lines() if '"status":499' in ln][-1]
    assert f'"alias":"{alias}"' in line and '"cancelled"' in line
    health = gateway.base_url.removesuffix("/v1") + "/healthz"
    assert _wait_for(lambda: httpx.get(health).json()["in_flight"] == {"requests": 0, "streams": 0})
