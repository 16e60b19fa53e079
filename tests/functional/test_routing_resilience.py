"""Routing strategies and resilience through the real app, against the fault-injecting mock.

The gateway runs in-process (ASGI); each route's provider is the mock under a fault spec in its
base URL, and the mock's request log says which physical model each attempt reached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-routing-key-0001"
ADMIN_KEY = "tw-routing-admin-0001"
PROVIDER_SECRET = "sk-routing-provider-secret"


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def provider(mock_url: str, account: str, fault: str = "") -> dict[str, Any]:
    base = f"{mock_url}/_fault/{fault}/v1" if fault else f"{mock_url}/v1"
    return {
        "type": "openai-compatible",
        "baseUrl": base,
        "providerAccountId": account,
        "quotaGroupId": account,
        "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_ROUTING_PROVIDER_KEY"}],
        "connectTimeoutMs": 500,
        "requestTimeoutMs": 1500,
    }


def route(rid: str, provider_id: str, model: str, priority: int = 0, weight: int = 100) -> dict[str, Any]:
    return {
        "id": rid,
        "provider": provider_id,
        "model": model,
        "providerFormat": "openai-chat-completions",
        "priority": priority,
        "weight": weight,
    }


def principal(pid: str, key: str, roles: list[str] | None = None) -> dict[str, Any]:
    return {
        "id": pid,
        "tenant": "acme",
        "roles": roles or [],
        "allowedModels": ["chat"],
        "keys": [{"id": f"{pid}-key", "sha256": hashlib.sha256(key.encode()).hexdigest()}],
    }


class Gateway:
    def __init__(self, app: Any, client: httpx.AsyncClient, mock: MockServerThread) -> None:
        self.app, self.client, self.mock = app, client, mock

    async def chat(self, key: str = KEY, session: str | None = None, **extra: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"}
        if session is not None:
            headers["x-tollway-session-id"] = session
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **extra}
        return await self.client.post("/v1/chat/completions", json=body, headers=headers)

    def reached(self) -> list[str]:
        """Physical models the provider saw since the last call (and clear the log)."""
        log = httpx.get(self.mock.base_url + "/_mock/requests", timeout=5).json()
        httpx.delete(self.mock.base_url + "/_mock/requests", timeout=5)
        return [r["model"] for r in log]

    async def routes(self, key: str = ADMIN_KEY) -> httpx.Response:
        return await self.client.get("/admin/v1/routes", headers={"authorization": f"Bearer {key}"})


@pytest.fixture
async def make(tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("TOLLWAY_ROUTING_PROVIDER_KEY", PROVIDER_SECRET)
    made: list[Any] = []

    async def build(providers: dict[str, Any], routes: list[dict[str, Any]], **extra: Any) -> Gateway:
        model = {"name": "chat", "routes": routes, **extra.pop("model", {})}
        cfg = {
            "providers": providers,
            "models": [model],
            "routing": {"baseBackoffMs": 1, "maxBackoffMs": 5, **extra.pop("routing", {})},
            "principals": [{**principal("user", KEY), **extra.pop("user", {})}, principal("ops", ADMIN_KEY, ["admin"])],
            **extra,
        }
        path = tmp_path / "llm-router.yml"
        path.write_text(yaml.safe_dump(cfg))
        app = create_app(path, watch_interval_s=None)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        made.append((app, client))
        httpx.delete(mock.base_url + "/_mock/requests", timeout=5)
        return Gateway(app, client, mock)

    yield build
    for app, client in made:
        await client.aclose()
        await app.state.runtime.aclose()


async def test_a_5xx_burst_opens_the_circuit_and_half_open_recovers(make: Any, mock: MockServerThread) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct", "fail_first=3,status=500,tag=burst")},
        [route("r", "p", "m-burst")],
        # A cool-down long enough that a busy machine cannot pass it between the burst and the
        # request that must be refused; the test then waits for half-open rather than sleeping.
        routing={"maxAttempts": 1, "circuitBreaker": {"failureThreshold": 3, "resetTimeoutMs": 2000}},
    )
    assert [(await gw.chat()).status_code for _ in range(3)] == [502, 502, 502]
    assert gw.reached() == ["m-burst"] * 3
    # Open: refused at once, nothing sent upstream.
    shed = await gw.chat()
    assert shed.status_code == 503
    assert shed.json()["error"]["code"] == "model_unavailable"
    assert gw.reached() == []

    async def circuit() -> str:
        return str((await gw.routes()).json()["data"][0]["groups"][0][0]["health"]["circuit"])

    assert await circuit() == "open"
    async with asyncio.timeout(15):
        while await circuit() != "half-open":
            await asyncio.sleep(0.05)
    # Half-open: one probe goes through; the burst is over, so it succeeds and closes the circuit.
    assert (await gw.chat()).status_code == 200
    assert gw.reached() == ["m-burst"]
    state = (await gw.routes()).json()["data"][0]["groups"][0][0]["health"]
    assert state["circuit"] == "closed"


async def test_a_429_moves_only_to_a_separately_approved_account(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {
            "a1": provider(url, "acct-a", "status=429,retry_after=0"),
            "a2": provider(url, "acct-a"),
            "b": provider(url, "acct-b"),
        },
        [route("a1", "a1", "m-a1"), route("a2", "a2", "m-a2", priority=1), route("b", "b", "m-b", priority=2)],
        routing={"maxAttempts": 3, "circuitBreaker": {"failureThreshold": 50}},
    )
    resp = await gw.chat()
    assert resp.status_code == 200
    reached = gw.reached()
    assert reached[0] == "m-a1"
    assert "m-a2" not in reached  # the same account's capacity under another deployment name
    assert reached[-1] == "m-b"


async def test_a_429_storm_with_no_other_account_answers_rate_limited_with_retry_after(
    make: Any, mock: MockServerThread
) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct", "status=429,retry_after=2")},
        [route("r", "p", "m-storm")],
        routing={"maxAttempts": 1, "circuitBreaker": {"failureThreshold": 50}},
    )
    for _ in range(5):
        resp = await gw.chat()
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "rate_limited"
        assert resp.headers["retry-after"] == "2"
    # A provider's 429 says nothing about the deployment's health: the circuit stays closed.
    state = (await gw.routes()).json()["data"][0]["groups"][0][0]["health"]
    assert state["circuit"] == "closed"


async def test_a_failing_priority_group_fails_over_to_the_next(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {"down": provider(url, "acct-1", "status=503"), "up": provider(url, "acct-2")},
        [route("primary", "down", "m-primary"), route("secondary", "up", "m-secondary", priority=1)],
        routing={"maxAttempts": 2},
    )
    assert (await gw.chat()).status_code == 200
    assert gw.reached() == ["m-primary", "m-secondary"]


async def test_a_provider_stalling_before_the_first_token_times_out_and_falls_back(
    make: Any, mock: MockServerThread
) -> None:
    url = mock.base_url
    gw = await make(
        {"stall": provider(url, "acct-1", "stall_ms=5000,stall_at=-1"), "up": provider(url, "acct-2")},
        [route("stalls", "stall", "m-stall"), route("healthy", "up", "m-healthy", priority=1)],
        routing={"maxAttempts": 2},
    )
    resp = await gw.chat(stream=True)
    assert resp.status_code == 200
    assert "data: [DONE]" in resp.text
    assert gw.reached() == ["m-stall", "m-healthy"]


async def test_sticky_sessions_stay_on_their_route(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {f"p{i}": provider(url, f"acct-{i}") for i in range(3)},
        [route(f"r{i}", f"p{i}", f"m{i}") for i in range(3)],
        routing={"strategy": "sticky"},
    )
    for session in ("s-alpha", "s-beta"):
        for _ in range(8):
            assert (await gw.chat(session=session)).status_code == 200
        assert len(set(gw.reached())) == 1, session
    spread: set[str] = set()
    for i in range(24):
        assert (await gw.chat(session=f"s-{i}")).status_code == 200
        spread.update(gw.reached())
    assert len(spread) >= 2  # different sessions do land on different routes


async def test_the_weighted_split_follows_the_weights(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {"p0": provider(url, "acct-0"), "p1": provider(url, "acct-1")},
        [route("heavy", "p0", "m-heavy", weight=300), route("light", "p1", "m-light", weight=100)],
    )
    for _ in range(200):
        assert (await gw.chat()).status_code == 200
    counts = Counter(gw.reached())
    # 75 % expected; with n=200 the binomial standard deviation is about 3 %: 6 sigma each way.
    assert 0.57 <= counts["m-heavy"] / 200 <= 0.93, counts


async def test_the_canary_allocation_is_stable_per_principal(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    canary = {
        "strategy": "canary",
        "canary": {
            "salt": "rollout-1",
            "splits": [
                {"name": "stable", "basisPoints": 9000, "routes": ["old"]},
                {"name": "canary", "basisPoints": 1000, "routes": ["new"]},
            ],
        },
    }
    gw = await make(
        {"p0": provider(url, "acct-0"), "p1": provider(url, "acct-1")},
        [route("old", "p0", "m-old"), route("new", "p1", "m-new")],
        model=canary,
    )
    for key in (KEY, ADMIN_KEY):
        for _ in range(10):
            assert (await gw.chat(key)).status_code == 200
        assert len(set(gw.reached())) == 1
    view = (await gw.routes()).json()
    assert view["data"][0]["strategy"] == "canary"


async def test_admin_routes_needs_the_admin_role_and_carries_no_secret(make: Any, mock: MockServerThread) -> None:
    gw = await make({"p": provider(mock.base_url, "acct")}, [route("r", "p", "m-admin")])
    denied = await gw.routes(KEY)
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "permission_denied"
    assert (await gw.routes("nope")).status_code == 401
    ok = await gw.routes()
    assert ok.status_code == 200
    text = ok.text
    assert PROVIDER_SECRET not in text
    assert mock.base_url not in text
    plan = ok.json()["data"][0]
    assert plan["alias"] == "chat"
    assert plan["groups"][0][0]["route"] == "r"
    assert plan["groups"][0][0]["health"]["inFlight"] == 0


async def test_region_is_a_hard_filter_never_a_fallback(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {"ca": provider(url, "acct-ca", "status=500"), "us": provider(url, "acct-us")},
        [
            {**route("in-ca", "ca", "m-ca"), "regions": ["ca"]},
            {**route("in-us", "us", "m-us", priority=1), "regions": ["us"]},
        ],
        routing={"maxAttempts": 3},
        user={"regions": ["ca"]},
    )
    # The Canadian route fails; the US one is healthy but outside the principal's regions.
    resp = await gw.chat()
    assert resp.status_code == 502
    assert set(gw.reached()) == {"m-ca"}
    # Another principal without the restriction falls back to the US route as usual.
    assert (await gw.chat(ADMIN_KEY)).status_code == 200
    assert gw.reached()[-1] == "m-us"


async def test_a_principal_whose_regions_no_route_serves_is_refused_before_dispatch(
    make: Any, mock: MockServerThread
) -> None:
    gw = await make(
        {"us": provider(mock.base_url, "acct-us")},
        [{**route("in-us", "us", "m-us"), "regions": ["us"]}],
        user={"regions": ["eu"]},
    )
    resp = await gw.chat()
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "permission_denied"
    assert gw.reached() == []


async def test_data_class_must_be_approved_for_the_alias(make: Any, mock: MockServerThread) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct")},
        [route("r", "p", "m-dc")],
        model={"dataClassifications": ["public", "internal"]},
        user={"dataClass": "restricted"},
    )
    resp = await gw.chat()
    assert resp.status_code == 403
    assert "data classification" in resp.json()["error"]["message"]
    assert gw.reached() == []
    assert (await gw.chat(ADMIN_KEY)).status_code == 200  # no class declared: not restricted


def frames(resp: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [f.removeprefix("data: ") for f in resp.text.split("\n\n") if f.startswith("data: ")]


def stream_text(resp: httpx.Response) -> str:
    out = []
    for data in frames(resp):
        if data.startswith("{") and '"choices":[{' in data:
            out.append(json.loads(data)["choices"][0]["delta"].get("content") or "")
    return "".join(out)


async def test_a_failure_rate_threshold_of_one_turns_the_rate_trip_off(make: Any, mock: MockServerThread) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct", "status=500,tag=rate")},
        [route("r", "p", "m-rate")],
        routing={
            "maxAttempts": 1,
            "circuitBreaker": {"failureThreshold": 50, "failureRateThreshold": 1.0, "minRequests": 3},
        },
    )
    assert [(await gw.chat()).status_code for _ in range(6)] == [502] * 6, "never shed by an open circuit"
    assert gw.reached() == ["m-rate"] * 6
    state = (await gw.routes()).json()["data"][0]["groups"][0][0]["health"]
    assert state["circuit"] == "closed"


async def test_a_flapping_primary_gets_traffic_back_once_it_recovers(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    gw = await make(
        {"flap": provider(url, "acct-1", "down_for_ms=800,tag=flap"), "up": provider(url, "acct-2")},
        [route("primary", "flap", "m-flap"), route("secondary", "up", "m-backup", priority=1)],
        routing={
            "maxAttempts": 2,
            "circuitBreaker": {"failureThreshold": 2, "resetTimeoutMs": 100, "maxResetTimeoutMs": 200},
        },
    )
    served: list[str] = []
    deadline = asyncio.get_running_loop().time() + 15
    while asyncio.get_running_loop().time() < deadline:
        assert (await gw.chat()).status_code == 200
        served.append(gw.reached()[-1])
        if served[-3:] == ["m-flap"] * 3:
            break
        await asyncio.sleep(0.05)
    assert "m-backup" in served, "the outage was served by the fallback"
    assert served[-3:] == ["m-flap"] * 3, "the recovered primary takes the traffic back"


async def test_a_content_filter_refusal_keeps_its_meaning_and_does_not_fall_back(
    make: Any, mock: MockServerThread
) -> None:
    url = mock.base_url
    gw = await make(
        {"p": provider(url, "acct-1", "status=400,error_type=content_filter"), "q": provider(url, "acct-2")},
        [route("r", "p", "m-filter"), route("s", "q", "m-other", priority=1)],
    )
    resp = await gw.chat()
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["code"], error["type"]) == ("content_filter", "invalid_request_error")
    assert error["message"] == "The request was rejected by the model provider's content policy."
    assert gw.reached() == ["m-filter"]


async def test_a_context_length_refusal_moves_to_a_route_with_a_larger_window(
    make: Any, mock: MockServerThread
) -> None:
    url = mock.base_url
    gw = await make(
        {"small": provider(url, "acct-1", "context_window=50"), "large": provider(url, "acct-2")},
        [
            {**route("short", "small", "m-small"), "contextWindowTokens": 50},
            {**route("long", "large", "m-large", priority=1), "contextWindowTokens": 100000},
        ],
    )
    assert (await gw.chat()).status_code == 200
    assert gw.reached() == ["m-small"]
    long = await gw.chat(messages=[{"role": "user", "content": "word " * 100}])
    assert long.status_code == 200
    assert gw.reached() == ["m-small", "m-large"], "not retried on the same route; moved to the larger window"


async def test_a_context_length_refusal_with_no_larger_window_is_the_normalized_400(
    make: Any, mock: MockServerThread
) -> None:
    url = mock.base_url
    gw = await make(
        {"small": provider(url, "acct-1", "context_window=50"), "same": provider(url, "acct-2", "context_window=50")},
        [
            {**route("a", "small", "m-a"), "contextWindowTokens": 50},
            {**route("b", "same", "m-b", priority=1), "contextWindowTokens": 50},
        ],
    )
    resp = await gw.chat(messages=[{"role": "user", "content": "word " * 100}])
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"] == "The request exceeds the model's context length (125 tokens requested, 50 allowed)."
    assert gw.reached() == ["m-a"]


async def test_response_model_route_names_the_public_route_that_answered(make: Any, mock: MockServerThread) -> None:
    url = mock.base_url
    routes = [route("primary", "down", "m-phys-primary"), route("backup", "up", "m-phys-backup", priority=1)]
    providers = {"down": provider(url, "acct-1", "status=503"), "up": provider(url, "acct-2", "words=3")}
    by_alias = await make(providers, routes)
    assert (await by_alias.chat()).json()["model"] == "chat"
    routes[1]["publicModel"] = "chat-backup"
    gw = await make(providers, routes, model={"responseModel": "route"})
    body = (await gw.chat()).json()
    assert body["model"] == "chat-backup"
    assert body["usage"]["completion_tokens"] == 6, "the usage is the answering attempt's (3 words + prefix)"
    streamed = await gw.chat(stream=True)
    assert {json.loads(f)["model"] for f in frames(streamed) if f.startswith("{")} == {"chat-backup"}
    assert "m-phys" not in streamed.text and "m-phys" not in json.dumps(body)
    healthy = await make(
        {"up": provider(url, "acct-2")}, [route("primary", "up", "m-phys")], model={"responseModel": "route"}
    )
    assert (await healthy.chat()).json()["model"] == "primary", "publicModel defaults to the route id"


async def test_a_stream_that_ends_after_its_finish_without_done_is_complete(make: Any, mock: MockServerThread) -> None:
    gw = await make({"p": provider(mock.base_url, "acct", "no_done=1")}, [route("r", "p", "m-nodone")])
    resp = await gw.chat(stream=True, stream_options={"include_usage": True})
    data = frames(resp)
    assert data[-1] == "[DONE]"
    usage = json.loads(data[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4, "the provider's usage is reported"
    assert stream_text(resp) == "Mock reply #1: hi"


async def test_one_undecodable_event_mid_stream_is_skipped(make: Any, mock: MockServerThread) -> None:
    gw = await make({"p": provider(mock.base_url, "acct", "malformed=2,chunks=4")}, [route("r", "p", "m-skip")])
    resp = await gw.chat(stream=True, messages=[{"role": "user", "content": "one two three four five"}])
    assert frames(resp)[-1] == "[DONE]"
    full = "Mock reply #5: one two three four five"
    text = stream_text(resp)
    assert text != full and len(text) < len(full), "the one undecodable delta is missing, nothing else"
    assert gw.reached() == ["m-skip"], "no retry: output had started"


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("abort_after=2,chunks=5", "upstream_stream_cut"),
        ("abort_after=2,chunks=5,abort_mode=reset", "upstream_stream_cut"),
        ("stall_at=2,stall_ms=5000,chunks=5", "upstream_stream_stalled"),
        ("midstream_error=2,chunks=5", "provider_error"),
    ],
)
async def test_a_failure_after_the_first_token_has_its_own_code(
    make: Any, mock: MockServerThread, fault: str, code: str
) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct", fault), "q": provider(mock.base_url, "acct-2")},
        [route("r", "p", "m-mid"), route("s", "q", "m-never", priority=1)],
        streamIdleTimeoutMs=400,
    )
    resp = await gw.chat(stream=True, messages=[{"role": "user", "content": "one two three four five"}])
    data = frames(resp)
    assert json.loads(data[-1])["error"]["code"] == code
    assert "[DONE]" not in resp.text
    assert stream_text(resp), "output had started"
    assert gw.reached() == ["m-mid"]


async def test_an_undecodable_event_inside_a_tool_call_fails_the_stream_as_malformed(
    make: Any, mock: MockServerThread
) -> None:
    gw = await make(
        {"p": provider(mock.base_url, "acct", "malformed=2,chunks=4")},
        [route("r", "p", "m-tool")],
        model={"capabilities": ["streaming", "tools"]},
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    resp = await gw.chat(stream=True, tools=[tool])
    error = json.loads(frames(resp)[-1])["error"]
    assert error["code"] == "upstream_stream_malformed", "a gap could corrupt the call's arguments"
