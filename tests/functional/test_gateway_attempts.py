"""The attempt budget in ``Gateway``: real published roots, real transports, the real mock server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tollway.canonical import CanonicalRequest, Message, TextDelta, ToolDefinition
from tollway.config.loader import parse_config
from tollway.config.root import PublishedRoot, Publisher
from tollway.config.validate import validate
from tollway.exceptions import DeadlineExceeded, ProviderFailed, RateLimited, UpstreamError
from tollway.gateway import Gateway, RequestContext
from tollway.governance.principals import Principal
from tollway.mock import MockServer
from tollway.routing.health import HealthRegistry
from tollway.secrets import SecretResolver

PRINCIPAL = Principal("p", "t", None, "service", frozenset(), frozenset({"a"}), "k")


def _config(mock_url: str, routes: list[tuple[str, int]], **routing: Any) -> dict[str, Any]:
    providers = {
        f"p{i}": {
            "type": "openai-compatible",
            "baseUrl": f"{mock_url}/_fault/{spec}/v1" if spec else f"{mock_url}/v1",
            "providerAccountId": f"acct{i}",
            "quotaGroupId": f"q{i}",
            "credentials": [{"id": f"c{i}", "secretRef": "env:KEY"}],
            "connectTimeoutMs": 500,
            "requestTimeoutMs": 5000,
        }
        for i, (spec, _) in enumerate(routes)
    }
    return {
        "requestTimeoutMs": 10000,
        "providers": providers,
        "models": [
            {
                "name": "a",
                "routes": [
                    {
                        "id": f"r{i}",
                        "provider": f"p{i}",
                        "model": f"m{i}",
                        "providerFormat": "openai-chat-completions",
                        "priority": prio,
                    }
                    for i, (_, prio) in enumerate(routes)
                ],
            }
        ],
        "routing": {"baseBackoffMs": 1, "maxBackoffMs": 5, **routing},
    }


@pytest.fixture
async def mock() -> AsyncIterator[MockServer]:
    async with MockServer() as server:
        yield server


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    pub = Publisher(resolver=SecretResolver(env={"KEY": "sk-test"}))
    yield pub
    await pub.aclose()


def _root(pub: Publisher, data: dict[str, Any]) -> PublishedRoot:
    cfg = parse_config(data)
    assert validate(cfg) == []
    return pub.publish(cfg)


def _ctx(root: PublishedRoot, timeout_s: float = 10.0) -> RequestContext:
    loop = asyncio.get_running_loop()
    return RequestContext("req_1", PRINCIPAL, root, root.aliases["a"], loop.time() + timeout_s)


def _req(stream: bool = False) -> CanonicalRequest:
    return CanonicalRequest(messages=[Message("user", "hello world")], stream=stream)


async def test_attempts_are_bounded_by_count_and_a_route_is_retried_in_place_once(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("status=503", 0), ("status=502,tag=b", 1)], maxAttempts=3))
    ctx = _ctx(root)
    with pytest.raises(ProviderFailed):
        await Gateway().complete(ctx, _req())
    assert [a.route_id for a in ctx.attempts] == ["r0", "r0", "r1"]
    assert all(a.outcome == "error" for a in ctx.attempts)
    assert len(mock.app.requests) == 3


async def test_retry_after_is_honoured_before_retrying_the_same_target(mock: MockServer, publisher: Publisher) -> None:
    root = _root(publisher, _config(mock.base_url, [("fail_first=1,status=429,retry_after=1", 0)], maxAttempts=2))
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    ctx = _ctx(root)
    resp = await Gateway(sleep=fake_sleep).complete(ctx, _req())
    assert resp.content and "hello world" in resp.content
    assert sleeps and sleeps[0] >= 1.0
    assert [a.outcome for a in ctx.attempts] == ["error", "ok"]


async def test_retry_after_beyond_the_deadline_stops_instead_of_sleeping(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("status=429,retry_after=4", 0)], maxAttempts=3))
    ctx = _ctx(root, timeout_s=2.0)
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    with pytest.raises(RateLimited) as info:
        await Gateway(sleep=fake_sleep).complete(ctx, _req())
    assert sleeps == []
    assert info.value.retry_after == 4
    assert len(ctx.attempts) == 1


async def test_request_deadline_bounds_a_slow_attempt(mock: MockServer, publisher: Publisher) -> None:
    root = _root(publisher, _config(mock.base_url, [("delay_ms=3000", 0), ("", 1)]))
    ctx = _ctx(root, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await Gateway().complete(ctx, _req())
    assert time.monotonic() - started < 1.5
    assert [a.route_id for a in ctx.attempts] == ["r0"]


async def test_stream_falls_back_on_malformed_first_frame_but_not_after_output(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("malformed=1", 0), ("", 1)]))
    ctx = _ctx(root)
    stream = await Gateway().open_stream(ctx, _req(stream=True))
    text = "".join([ev.text async for ev in stream.events() if isinstance(ev, TextDelta)])
    await stream.aclose()
    assert "hello world" in text
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r1", "ok")]

    root2 = _root(publisher, _config(mock.base_url, [("midstream_error=2,chunks=5,tag=m", 0), ("", 1)]))
    ctx2 = _ctx(root2)
    stream2 = await Gateway().open_stream(ctx2, _req(stream=True))
    with pytest.raises(UpstreamError) as info:
        async for _ in stream2.events():
            pass
    await stream2.aclose(info.value)
    assert [(a.route_id, a.outcome) for a in ctx2.attempts] == [("r0", "midstream_error")]


async def test_open_circuit_is_skipped_and_health_survives_republish(mock: MockServer, publisher: Publisher) -> None:
    data = _config(
        mock.base_url,
        [("status=500", 0), ("", 1)],
        maxAttempts=2,
        circuitBreaker={"failureThreshold": 2, "resetTimeoutMs": 60000, "halfOpenRequests": 1},
    )
    root = _root(publisher, data)
    for _ in range(2):
        await Gateway().complete(_ctx(root), _req())
    again = _root(publisher, data)
    assert again.aliases["a"].groups[0][0].health is root.aliases["a"].groups[0][0].health
    ctx = _ctx(again)
    await Gateway().complete(ctx, _req())
    assert [a.route_id for a in ctx.attempts] == ["r1"], "the open circuit on r0 is skipped"
    assert again.deployments["p0"].transport is root.deployments["p0"].transport


class _Sleeps:
    """A ``sleep`` that records each wait instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_a_short_retry_after_is_honoured_on_the_same_route_before_the_fallback(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("fail_first=1,status=429,retry_after=2", 0), ("", 1)]))
    ctx = _ctx(root)
    sleeps = _Sleeps()
    await Gateway(sleep=sleeps).complete(ctx, _req())
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r0", "ok")]
    assert sleeps.waits and sleeps.waits[0] >= 2.0


async def test_one_transient_5xx_is_retried_on_the_same_route_after_a_jittered_backoff(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("fail_first=1,status=500", 0), ("", 1)]))
    ctx = _ctx(root)
    sleeps = _Sleeps()
    await Gateway(sleep=sleeps).complete(ctx, _req())
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r0", "ok")]
    assert all(0 <= w <= 0.005 for w in sleeps.waits), "maxBackoffMs bounds the jitter"


async def test_a_healthy_same_priority_alternative_goes_before_a_retry_in_place(
    mock: MockServer, publisher: Publisher
) -> None:
    routes = [("fail_first=1,status=500,tag=alt", 0), ("", 0), ("tag=fallback", 1)]
    root = _root(publisher, _config(mock.base_url, routes, strategy="ordered"))
    ctx = _ctx(root)
    await Gateway(sleep=_Sleeps()).complete(ctx, _req())
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r1", "ok")]

    mock.app.clear_faults()  # resets the fail_first counter
    alternative = root.aliases["a"].groups[0][1].health
    alternative.breaker.trip(alternative.clock())
    ctx = _ctx(root)
    await Gateway(sleep=_Sleeps()).complete(ctx, _req())
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r0", "ok")], (
        "with the alternative unavailable, the route is retried before the lower-priority one"
    )


async def test_same_route_retries_sets_how_often_a_route_is_retried_in_place(
    mock: MockServer, publisher: Publisher
) -> None:
    routes = [("fail_first=2,status=500", 0), ("", 1)]
    twice = _ctx(_root(publisher, _config(mock.base_url, routes, sameRouteRetries=2, maxAttempts=4)))
    await Gateway(sleep=_Sleeps()).complete(twice, _req())
    assert [(a.route_id, a.outcome) for a in twice.attempts] == [("r0", "error"), ("r0", "error"), ("r0", "ok")]
    mock.app.clear_faults()
    never = _ctx(_root(publisher, _config(mock.base_url, routes, sameRouteRetries=0)))
    await Gateway(sleep=_Sleeps()).complete(never, _req())
    assert [a.route_id for a in never.attempts] == ["r0", "r1"]


async def test_a_retry_in_place_never_spends_the_fallbacks_attempt(mock: MockServer, publisher: Publisher) -> None:
    tight = _ctx(_root(publisher, _config(mock.base_url, [("status=503", 0), ("", 1)], maxAttempts=2)))
    await Gateway(sleep=_Sleeps()).complete(tight, _req())
    assert [(a.route_id, a.outcome) for a in tight.attempts] == [("r0", "error"), ("r1", "ok")]
    roomy = _ctx(_root(publisher, _config(mock.base_url, [("status=503", 0), ("", 1)], maxAttempts=3)))
    await Gateway(sleep=_Sleeps()).complete(roomy, _req())
    assert [(a.route_id, a.outcome) for a in roomy.attempts] == [("r0", "error"), ("r0", "error"), ("r1", "ok")]


async def test_a_retry_after_above_the_cap_is_never_waited_for_and_skips_the_route_that_long(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("status=429,retry_after=30", 0), ("", 1)]))
    sleeps = _Sleeps()
    first = _ctx(root)
    await Gateway(sleep=sleeps).complete(first, _req())
    assert [(a.route_id, a.outcome) for a in first.attempts] == [("r0", "error"), ("r1", "ok")]
    assert sleeps.waits == []
    primary = root.aliases["a"].groups[0][0].health
    assert 25 < primary.snapshot()["deferredForS"] <= 30
    assert primary.snapshot()["circuit"] == "closed", "a rate limit is not a health verdict"
    second = _ctx(root)
    await Gateway(sleep=sleeps).complete(second, _req())
    assert [a.route_id for a in second.attempts] == ["r1"], "the deferred route is skipped, not retried"


async def test_with_no_other_route_a_deferred_route_answers_429_with_the_time_left(
    mock: MockServer, publisher: Publisher
) -> None:
    root = _root(publisher, _config(mock.base_url, [("status=429,retry_after=30", 0)]))
    with pytest.raises(RateLimited) as first:
        await Gateway(sleep=_Sleeps()).complete(_ctx(root), _req())
    assert first.value.retry_after == 30
    sent = len(mock.app.requests)
    ctx = _ctx(root)
    with pytest.raises(RateLimited) as again:
        await Gateway(sleep=_Sleeps()).complete(ctx, _req())
    assert ctx.attempts == [] and len(mock.app.requests) == sent, "nothing is sent while deferred"
    assert again.value.retry_after is not None and 25 < again.value.retry_after <= 30


async def test_max_retry_after_ms_raises_the_cap(mock: MockServer, publisher: Publisher) -> None:
    spec = "fail_first=1,status=429,retry_after=30"
    root = _root(publisher, _config(mock.base_url, [(spec, 0), ("", 1)], maxRetryAfterMs=60000))
    ctx = _ctx(root, timeout_s=60)
    sleeps = _Sleeps()
    await Gateway(sleep=sleeps).complete(ctx, _req())
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "error"), ("r0", "ok")]
    assert sleeps.waits[0] >= 30


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_primary_down_for_a_minute_is_used_again_within_ten_seconds_of_recovering(
    mock: MockServer,
) -> None:
    """Default circuit settings, one request a second on a hand-driven health clock: the primary
    answers 503 for 60 s, then recovers; traffic must be back on it within about 10 s."""
    clock = _Clock()
    pub = Publisher(resolver=SecretResolver(env={"KEY": "sk-test"}), health=HealthRegistry(clock=clock))
    try:
        data = _config(mock.base_url, [("", 0), ("", 1)])
        del data["routing"]["baseBackoffMs"], data["routing"]["maxBackoffMs"]
        root = _root(pub, data)
        mock.app.set_faults({"status": 503}, model="m0")
        back_at = None
        while clock.now < 180:
            if clock.now == 60:
                mock.app.clear_faults()  # the primary has recovered
            ctx = _ctx(root)
            await Gateway(sleep=_Sleeps()).complete(ctx, _req())
            if clock.now >= 60 and ctx.attempts[-1].route_id == "r0" and ctx.attempts[-1].outcome == "ok":
                back_at = clock.now
                break
            clock.now += 1.0
        assert back_at is not None and back_at - 60 <= 11, back_at
    finally:
        mock.app.clear_faults()
        await pub.aclose()


class _Reasons:
    """An audit trail that keeps only each attempt's start reason."""

    def __init__(self) -> None:
        self.reasons: list[tuple[int, str, str]] = []

    async def attempt_started(self, ctx: RequestContext, number: int, target: Any, reason: str) -> None:
        self.reasons.append((number, target.route_id, reason))

    def attempt_finished(self, ctx: RequestContext, record: Any) -> None:
        pass


def _recovery_config(mock_url: str, cut: str, **model: Any) -> dict[str, Any]:
    data = _config(mock_url, [(cut, 0), ("no_prefill=1", 1), ("", 2)])
    alias = data["models"][0]
    alias.update({"streamRecovery": "continue", **model})
    alias["routes"][2]["capabilities"] = ["streaming", "assistantPrefill"]
    return data


async def _drain(stream: Any) -> tuple[str, BaseException | None]:
    text, error = [], None
    try:
        async for ev in stream.events():
            if isinstance(ev, TextDelta):
                text.append(ev.text)
    except UpstreamError as exc:
        error = exc
    await stream.aclose(error)
    return "".join(text), error


@pytest.mark.parametrize("cut", ["abort_after=2,chunks=5", "stall_at=2,stall_ms=5000,chunks=5"])
async def test_stream_recovery_continues_a_cut_text_stream_on_a_prefill_route(
    mock: MockServer, publisher: Publisher, cut: str
) -> None:
    data = _recovery_config(mock.base_url, cut)
    data["streamIdleTimeoutMs"] = 300
    root = _root(publisher, data)
    ctx = _ctx(root)
    audit = _Reasons()
    ctx.audit = audit
    text, error = await _drain(await Gateway().open_stream(ctx, _req(stream=True)))
    assert error is None
    assert text == "Mock reply #2: hello world", "the continuation only: nothing repeated, nothing restarted"
    assert [(a.route_id, a.outcome) for a in ctx.attempts] == [("r0", "midstream_error"), ("r2", "ok")]
    assert audit.reasons == [(1, "r0", "first"), (2, "r2", "continuation")]
    seen = [r for r in mock.app.requests if r["model"] in ("m1", "m2")]
    assert [(r["model"], r["messages"]) for r in seen] == [("m2", 2)], (
        "the route without assistantPrefill is never tried"
    )


async def test_stream_recovery_is_off_by_default_and_never_recovers_tool_calls(
    mock: MockServer, publisher: Publisher
) -> None:
    data = _recovery_config(mock.base_url, "abort_after=2,chunks=5")
    data["models"][0].pop("streamRecovery")
    ctx = _ctx(_root(publisher, data))
    _, error = await _drain(await Gateway().open_stream(ctx, _req(stream=True)))
    assert isinstance(error, UpstreamError) and error.to_stream_error().code == "upstream_stream_cut"
    assert [a.route_id for a in ctx.attempts] == ["r0"]

    tools = _recovery_config(mock.base_url, "abort_after=2,chunks=5,tag=tool", capabilities=["streaming", "tools"])
    tools["models"][0]["routes"][2]["capabilities"] = ["streaming", "tools", "assistantPrefill"]
    ctx = _ctx(_root(publisher, tools))
    req = _req(stream=True)
    req.tools = [ToolDefinition("f", parameters={"type": "object", "properties": {"a": {"type": "string"}}})]
    _, error = await _drain(await Gateway().open_stream(ctx, req))
    assert isinstance(error, UpstreamError)
    assert [a.route_id for a in ctx.attempts] == ["r0"], "a tool-call stream ends with its error frame"
