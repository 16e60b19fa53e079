"""The audit trail end to end on the local cloud, with real processes and the official SDK.

gateway process → WAL → shipper task → SQS (moto server) → event-source runner → audit-writer
handler → DynamoDB (moto server). Each scenario runs under its own principal, so the store's
by-principal index finds exactly that scenario's requests, including the one whose client gave up
before any response (no request id reached the client).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.conftest import PROVIDER_KEY_ENV, build_config
from tests.support.processes import Gateway, Proc, new_key, start_gateway
from tollway.audit.store import DynamoDBAuditStore, RequestRecord, RequestView, StoreSettings
from tollway.cloud.bootstrap import bootstrap
from tollway.cloud.local import LocalCloud, local_cloud
from tollway.cloud.resources import Topology, topology
from tollway.cloud.runner import EventSourceRunner

pytestmark = [pytest.mark.e2e, pytest.mark.local_cloud]

SCENARIOS = ("buffered", "streamed", "retried", "fallback", "cancelled", "timeout", "canary")


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    with local_cloud(0, log_path=tmp_path_factory.mktemp("moto") / "moto.log") as c:
        yield c


@pytest.fixture(scope="module")
def topo(cloud: LocalCloud) -> Topology:
    t = topology("e2e-audit-" + secrets.token_hex(3))
    bootstrap(t, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    return t


@pytest.fixture(scope="module")
def store_env(cloud: LocalCloud, topo: Topology) -> Iterator[dict[str, str]]:
    """The environment the audit writer runs with (the runner calls it in this process)."""
    env = {**cloud.env(), "TOLLWAY_TABLE_AUDIT": topo.table("audit").name}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield env


@pytest.fixture(scope="module")
def runner(cloud: LocalCloud, topo: Topology, store_env: dict[str, str]) -> Iterator[EventSourceRunner]:
    r = EventSourceRunner(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    r.start()
    yield r
    assert r.stop(), "the event-source runner did not stop in time"


@pytest.fixture(scope="module")
def audited_gateway(
    mock_provider: Proc, cloud: LocalCloud, topo: Topology, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    keys = {name: new_key() for name in SCENARIOS}
    cfg: dict[str, Any] = build_config(mock_provider.url, {"team-a": "0" * 64, "team-b": "1" * 64})
    cfg["providers"]["openai-timeout"] = {
        **cfg["providers"]["openai-delay"],
        "providerAccountId": "acct-openai-timeout",
        "quotaGroupId": "acct-openai-timeout-default",
        "requestTimeoutMs": 500,
        "connectTimeoutMs": 500,
    }
    cfg["models"] += [
        {
            "name": "chat-retry-v1",
            "routes": [{"id": "retry", "provider": "openai-503", "model": "phys-retry"}],
        },
        {
            "name": "chat-timeout-v1",
            "routes": [{"id": "timeout", "provider": "openai-timeout", "model": "phys-timeout"}],
        },
    ]
    for m in cfg["models"][-2:]:
        m["routes"][0]["providerFormat"] = "openai-chat-completions"
    alias = {
        "buffered": "chat-fast-v1",
        "streamed": "chat-fast-v1",
        "retried": "chat-retry-v1",
        "fallback": "chat-fallback-v1",
        "cancelled": "chat-delay-v1",
        "timeout": "chat-timeout-v1",
        "canary": "chat-fast-v1",
    }
    cfg["principals"] = [
        {"id": f"audit-{name}", "tenant": "acme", "allowedModels": [alias[name]], "keys": [{"id": name, "sha256": d}]}
        for name, (_, d) in keys.items()
    ]
    wal_dir = tmp_path_factory.mktemp("wal")
    cfg["audit"] = {
        "durability": "bounded-async",
        "spool": {"path": str(wal_dir)},
        "sink": {"type": "sqs", "queueName": topo.queue("audit").name},
    }
    path: Path = tmp_path_factory.mktemp("gw-audit") / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**cloud.env(), PROVIDER_KEY_ENV: "sk-audit-provider-credential-CANARY-7f3a"}
    gw = start_gateway(path, env)
    gw.keys = {name: key for name, (key, _) in keys.items()}
    yield gw
    gw.proc.stop()


PIPELINE_S = 60.0
"""How long the pipeline may take to land what a test sent: the gateway's ship process ships at idle
priority, so on a loaded machine it can wait seconds for a core, and then the event-source runner
and the writer take their turns. A deadline on a condition, not a pause: a test goes on as soon as
the store shows what it waits for."""
_POLL_S = 0.2


def _wait_until(what: str, probe: Callable[[], tuple[bool, object]], timeout_s: float = PIPELINE_S) -> None:
    """Call ``probe`` until it reports done, within ``timeout_s``; else fail, showing what it saw last."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        done, seen = probe()
        if done:
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s; last seen: {seen!r}")
        pause.wait(min(_POLL_S, max(0.0, deadline - time.monotonic())))


def _requests(store: DynamoDBAuditStore, principal: str, since_ms: int) -> list[RequestRecord]:
    return store.list_requests(since_ms, principal_id=principal, limit=10)


def _settled(store: DynamoDBAuditStore, principal: str, since_ms: int) -> RequestView:
    """Wait until the principal's one request has its terminal event and every attempt settled."""
    settled: list[RequestView] = []

    def probe() -> tuple[bool, object]:
        found = _requests(store, principal, since_ms)
        if len(found) > 1:
            pytest.fail(f"{principal}: {len(found)} request items, expected exactly one")
        view = store.get_request(found[0].request_id) if found else None
        if view is not None and not view.incomplete:
            settled.append(view)
            return True, view
        return False, view

    _wait_until(f"{principal}: a complete audit record", probe)
    return settled[-1]


def test_every_request_shape_lands_once_with_its_ordered_attempts(
    audited_gateway: Gateway, runner: EventSourceRunner, store_env: dict[str, str]
) -> None:
    gw = audited_gateway
    since = int(time.time() * 1000) - 1000
    msgs = [{"role": "user", "content": "audit canary PROMPT-CANARY-91c2 please"}]

    def sdk(name: str, timeout: float = 10) -> openai.OpenAI:
        return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[name], max_retries=0, timeout=timeout)

    with sdk("buffered") as c:
        c.chat.completions.create(model="chat-fast-v1", messages=msgs)  # type: ignore[arg-type]
    with sdk("streamed") as c:
        assert list(c.chat.completions.create(model="chat-fast-v1", messages=msgs, stream=True))  # type: ignore[arg-type]
    with sdk("retried") as c, pytest.raises(openai.APIStatusError) as retried:
        c.chat.completions.create(model="chat-retry-v1", messages=msgs)  # type: ignore[arg-type]
    assert retried.value.status_code == 503
    with sdk("fallback") as c:
        c.chat.completions.create(model="chat-fallback-v1", messages=msgs)  # type: ignore[arg-type]
    with sdk("cancelled", timeout=0.5) as c, pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model="chat-delay-v1", messages=msgs)  # type: ignore[arg-type]
    with sdk("timeout") as c, pytest.raises(openai.APIStatusError) as timed_out:
        c.chat.completions.create(model="chat-timeout-v1", messages=msgs)  # type: ignore[arg-type]
    assert timed_out.value.status_code == 504

    store = DynamoDBAuditStore(StoreSettings.from_env(store_env))
    views = {name: _settled(store, f"audit-{name}", since) for name in SCENARIOS if name != "canary"}

    def shape(view: RequestView) -> tuple[int | None, list[tuple[int, str | None, str | None]]]:
        return view.request.status, [(a.number, a.reason, a.outcome) for a in view.attempts]

    assert shape(views["buffered"]) == (200, [(1, "first", "ok")])
    assert shape(views["streamed"]) == (200, [(1, "first", "ok")])
    assert views["streamed"].request.stream is True
    assert views["streamed"].attempts[0].first_token_ms is not None
    # Connection set-up per attempt: measured for a new connection, 0 for a pooled one reused.
    assert all(a.connect_ms is not None and a.connect_ms >= 0 for a in views["buffered"].attempts)
    # A 503 is retried on its route once (routing.sameRouteRetries), then the next route is tried.
    assert shape(views["retried"]) == (503, [(1, "first", "error"), (2, "retry", "error")])
    assert shape(views["fallback"]) == (200, [(1, "first", "error"), (2, "retry", "error"), (3, "fallback", "ok")])
    assert shape(views["cancelled"]) == (499, [(1, "first", "cancelled")])
    assert views["timeout"].request.status == 504
    assert {a.outcome for a in views["timeout"].attempts} == {"error"}
    for name, view in views.items():
        assert view.request.alias, name
        assert [a.number for a in view.attempts] == list(range(1, len(view.attempts) + 1)), name
    assert views["buffered"].request.usage_evidence == "provider-reported"

    # No content, credential or key in anything the pipeline stored.
    dumped = repr(views)
    for canary in ("PROMPT-CANARY-91c2", "CANARY-7f3a", *gw.keys.values()):
        assert canary not in dumped


def test_healthz_reports_the_wal_drained(audited_gateway: Gateway, runner: EventSourceRunner) -> None:
    """After traffic, the shipper acknowledges everything the WAL holds (no backlog)."""
    with openai.OpenAI(base_url=audited_gateway.base_url, api_key=audited_gateway.keys["canary"], max_retries=0) as c:
        for _ in range(5):
            c.chat.completions.create(model="chat-fast-v1", messages=[{"role": "user", "content": "x"}])
    health = audited_gateway.base_url.removesuffix("/v1") + "/healthz"
    seen: list[dict[str, Any]] = []

    def drained() -> tuple[bool, object]:
        audit: dict[str, Any] = httpx.get(health, timeout=5).json()["audit"]
        seen.append(audit)
        return audit["wal"]["appended"] > 0 and audit["wal"]["appended"] == audit["shipper"]["acked"], audit

    _wait_until("the WAL drained", drained)
    audit = seen[-1]
    assert audit["wal"]["writes_on_loop"] == 1, "server mode writes bounded-async batches on the loop"
    assert audit["wal"]["write_delay_ms"] == 10, "the loop's write delay (the loss window) is asyncWriteDelayMs"


@pytest.mark.timeout(240)  # two gateway starts and the pipeline's deadline, on a loaded machine
def test_a_gateway_killed_mid_stream_leaves_an_incomplete_attempt_and_nothing_lost(
    mock_provider: Proc,
    cloud: LocalCloud,
    topo: Topology,
    runner: EventSourceRunner,
    store_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """local-durable: SIGKILL during a stream, restart on the same WAL, let the pipeline drain."""
    key, digest = new_key()
    principal = "audit-crash-" + secrets.token_hex(3)
    cfg: dict[str, Any] = build_config(mock_provider.url, {"team-a": "0" * 64, "team-b": "1" * 64})
    cfg["principals"] = [
        {
            "id": principal,
            "tenant": "acme",
            "allowedModels": ["chat-fast-v1", "chat-slow-v1"],
            "keys": [{"id": "crash", "sha256": digest}],
        }
    ]
    cfg["audit"] = {
        "durability": "local-durable",
        "spool": {"path": str(tmp_path / "wal"), "persistenceClass": "persistent"},
        "sink": {"type": "sqs", "queueName": topo.queue("audit").name},
    }
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**cloud.env(), PROVIDER_KEY_ENV: "sk-crash-provider"}
    since = int(time.time() * 1000) - 1000
    msgs = [{"role": "user", "content": "x"}]

    gw = start_gateway(path, env)
    try:
        with openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as c:
            for _ in range(3):
                c.chat.completions.create(model="chat-fast-v1", messages=msgs)  # type: ignore[arg-type]
        body = {"model": "chat-slow-v1", "stream": True, "messages": msgs}
        with httpx.stream(
            "POST", gw.base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10
        ) as resp:
            assert resp.status_code == 200
            crashed_id = resp.headers["x-request-id"]
            # Keep the line iterator referenced until the kill: a discarded one would close the
            # response and let the gateway record the disconnect first.
            lines = resp.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert first  # the stream began: the attempt was dispatched and its start is durable
            gw.proc.proc.kill()  # SIGKILL: no shutdown path runs
            gw.proc.proc.wait(10)
            del lines
    finally:
        gw.proc.stop()

    restarted = start_gateway(path, env)  # same WAL directory: recovery replays what was not acknowledged
    try:
        store = DynamoDBAuditStore(StoreSettings.from_env(store_env))

        def landed() -> tuple[bool, object]:
            """Every request listed, the three finished ones complete, the killed one with its attempt."""
            found = _requests(store, principal, since)
            crashed = store.get_request(crashed_id)
            complete = [r.request_id for r in found if r.request_id != crashed_id and not r.incomplete]
            listed = sorted(r.request_id for r in found)
            done = crashed_id in listed and len(complete) == 3 and crashed is not None and bool(crashed.attempts)
            return done, {"listed": listed, "complete": complete, "killed": crashed}

        _wait_until("the four requests in the store", landed)
        found = _requests(store, principal, since)
        assert sorted(r.request_id for r in found).count(crashed_id) == 1
        assert len(found) == 4, [r.request_id for r in found]  # no duplicate request items
        crashed = store.get_request(crashed_id)
        assert crashed is not None
        assert crashed.request.incomplete, "the killed request must not look finished"
        assert [(a.number, a.incomplete) for a in crashed.attempts] == [(1, True)]
        for r in found:
            if r.request_id != crashed_id:
                view = store.get_request(r.request_id)
                assert view is not None and not view.incomplete
                assert [(a.number, a.outcome) for a in view.attempts] == [(1, "ok")]
    finally:
        restarted.proc.stop()
