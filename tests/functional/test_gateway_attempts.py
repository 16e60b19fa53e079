"""The attempt budget in ``Gateway``: real published roots, real transports, the real mock server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tollway.canonical import CanonicalRequest, Message, TextDelta
from tollway.config.loader import parse_config
from tollway.config.root import PublishedRoot, Publisher
from tollway.config.validate import validate
from tollway.exceptions import DeadlineExceeded, ModelUnavailable, RateLimited, UpstreamError
from tollway.gateway import Gateway, RequestContext
from tollway.governance.principals import Principal
from tollway.mock import MockServer
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


async def test_attempts_are_bounded_by_count_across_passes(mock: MockServer, publisher: Publisher) -> None:
    root = _root(publisher, _config(mock.base_url, [("status=503", 0), ("status=502,tag=b", 1)], maxAttempts=3))
    ctx = _ctx(root)
    with pytest.raises(ModelUnavailable):
        await Gateway().complete(ctx, _req())
    assert [a.route_id for a in ctx.attempts] == ["r0", "r1", "r0"]
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
    root = _root(publisher, _config(mock.base_url, [("status=429,retry_after=30", 0)], maxAttempts=3))
    ctx = _ctx(root, timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(RateLimited) as info:
        await Gateway().complete(ctx, _req())
    assert time.monotonic() - started < 1.5
    assert info.value.retry_after == 30
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
