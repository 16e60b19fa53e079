"""The attempt loop of ``Gateway.complete``: retry in place, fallback, refusal, Retry-After and the
deadline, over real published roots whose providers answer through a ``MockTransport``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.fakes.gateway import Sleeps, attempts, request_context
from tests.fakes.openai_chat import completion, error
from tests.fakes.roots import MockRoots, base_url, router_config
from tests.fakes.transport import MockResponse, Script, connect_error
from tollway.canonical import CanonicalRequest, Message, UsageEvidence
from tollway.config.root import PublishedRoot
from tollway.exceptions import DeadlineExceeded, InvalidRequest, ProviderFailed
from tollway.gateway import Gateway


def _request() -> CanonicalRequest:
    return CanonicalRequest(messages=[Message("user", "hello world")])


def _publish(answers: Script, data: dict[str, Any]) -> tuple[MockRoots, PublishedRoot]:
    roots = MockRoots(answers)
    return roots, roots.publish(data)


async def test_a_first_try_success_sends_one_request_with_the_deployment_credential() -> None:
    roots, root = _publish(Script({"p0": completion("Hi there"), "p1": completion("unused")}), router_config(0, 1))
    ctx = request_context(root)
    sleeps = Sleeps()

    response = await Gateway(sleep=sleeps).complete(ctx, _request())

    assert response.content == "Hi there"
    usage = response.usage
    assert usage is not None and ctx.usage is usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.evidence) == (5, 2, UsageEvidence.PROVIDER_REPORTED)
    assert attempts(ctx) == [("r0", "ok", None, 200)]
    assert [(a.number, a.deployment_id) for a in ctx.attempts] == [(1, "p0")]
    assert ctx.answered is not None and ctx.answered.route_id == "r0"
    [sent] = roots.requests
    assert (sent.provider, sent.base_url, sent.path, sent.stream) == ("p0", base_url("p0"), "chat/completions", False)
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.json()["model"] == "m0"
    assert sent.json()["messages"] == [{"role": "user", "content": "hello world"}]
    assert sleeps.waits == []


async def test_a_retryable_503_falls_back_to_the_next_route() -> None:
    roots, root = _publish(
        Script({"p0": error(503), "p1": completion("from p1")}), router_config(0, 1, routing={"sameRouteRetries": 0})
    )
    ctx = request_context(root)

    response = await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert response.content == "from p1"
    assert attempts(ctx) == [("r0", "error", "overloaded", 503), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]
    assert ctx.answered is not None and ctx.answered.route_id == "r1"


async def test_a_503_is_retried_once_in_place_before_the_fallback() -> None:
    """With the default ``sameRouteRetries: 1`` a transient 5xx gets a second try on its own route,
    after a backoff under ``maxBackoffMs``, before a lower-priority route is used."""
    roots, root = _publish(Script({"p0": error(503), "p1": completion("from p1")}), router_config(0, 1))
    ctx = request_context(root)
    sleeps = Sleeps()

    response = await Gateway(sleep=sleeps).complete(ctx, _request())

    assert response.content == "from p1"
    assert attempts(ctx) == [
        ("r0", "error", "overloaded", 503),
        ("r0", "error", "overloaded", 503),
        ("r1", "ok", None, 200),
    ]
    assert [r.provider for r in roots.requests] == ["p0", "p0", "p1"]
    assert len(sleeps.waits) == 1 and 0 <= sleeps.waits[0] <= 0.001  # full jitter under baseBackoffMs


async def test_a_retry_in_place_that_succeeds_never_reaches_the_fallback() -> None:
    roots, root = _publish(
        Script({"p0": [error(502), completion("second try")], "p1": completion("unused")}), router_config(0, 1)
    )
    ctx = request_context(root)

    response = await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert response.content == "second try"
    assert attempts(ctx) == [("r0", "error", "server", 502), ("r0", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p0"]


async def test_a_non_retryable_400_is_answered_without_another_attempt() -> None:
    roots, root = _publish(
        Script({"p0": error(400, "bad field", kind="invalid_request_error"), "p1": completion("unused")}),
        router_config(0, 1),
    )
    ctx = request_context(root)
    sleeps = Sleeps()

    with pytest.raises(InvalidRequest) as info:
        await Gateway(sleep=sleeps).complete(ctx, _request())

    assert (info.value.status, info.value.code) == (400, "invalid_request")
    assert attempts(ctx) == [("r0", "error", "invalid_request", 400)]
    assert [r.provider for r in roots.requests] == ["p0"]
    assert sleeps.waits == []


async def test_a_429_waits_out_its_retry_after_and_retries_the_same_route() -> None:
    roots, root = _publish(
        Script({"p0": [error(429, headers={"Retry-After": "2"}), completion("after the wait")], "p1": completion()}),
        router_config(0, 1),
    )
    ctx = request_context(root)
    sleeps = Sleeps()

    response = await Gateway(sleep=sleeps).complete(ctx, _request())

    assert response.content == "after the wait"
    assert sleeps.waits == [2.0]  # never shorter than Retry-After; the jitter (at most 1 ms) is below it
    assert attempts(ctx) == [("r0", "error", "rate_limit", 429), ("r0", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p0"]


async def test_a_retry_after_too_long_to_wait_for_takes_the_route_out_of_rotation() -> None:
    """30 s is over ``maxRetryAfterMs`` (5 s): no wait, the next route answers, and later requests
    skip the deferred deployment too."""
    roots, root = _publish(
        Script({"p0": error(429, headers={"Retry-After": "30"}), "p1": completion("from p1")}), router_config(0, 1)
    )
    ctx = request_context(root)
    sleeps = Sleeps()

    response = await Gateway(sleep=sleeps).complete(ctx, _request())

    assert response.content == "from p1"
    assert sleeps.waits == []
    assert attempts(ctx) == [("r0", "error", "rate_limit", 429), ("r1", "ok", None, 200)]
    health = root.aliases["a"].groups[0][0].health
    assert health.deferred_rate_limited and 29 < health.deferred_for() <= 30

    later = request_context(root)
    await Gateway(sleep=sleeps).complete(later, _request())
    assert attempts(later) == [("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1", "p1"]


async def test_a_429_skips_the_other_deployments_of_the_same_provider_account() -> None:
    """A second deployment on the rate-limited account is the same capacity under another name."""
    data = router_config(0, 1, 2, routing={"sameRouteRetries": 0})
    data["providers"]["p1"]["providerAccountId"] = "acct0"
    roots, root = _publish(Script({"p0": error(429), "p1": completion("same account"), "p2": completion("p2")}), data)
    ctx = request_context(root)

    response = await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert response.content == "p2"
    assert attempts(ctx) == [("r0", "error", "rate_limit", 429), ("r2", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p2"]


async def test_a_connection_that_fails_moves_to_the_next_route() -> None:
    roots, root = _publish(
        Script({"p0": MockResponse.failing(connect_error()), "p1": completion("from p1")}),
        router_config(0, 1, routing={"sameRouteRetries": 0}),
    )
    ctx = request_context(root)

    response = await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert response.content == "from p1"
    assert attempts(ctx) == [("r0", "error", "connect", None), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]


async def test_the_attempt_budget_bounds_the_walk_and_the_last_error_is_the_answer() -> None:
    roots, root = _publish(
        Script({"p0": error(500), "p1": error(502), "p2": completion("unused")}),
        router_config(0, 1, 2, routing={"maxAttempts": 2, "sameRouteRetries": 0}),
    )
    ctx = request_context(root)

    with pytest.raises(ProviderFailed) as info:
        await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert (info.value.status, info.value.code) == (502, "provider_error")
    assert attempts(ctx) == [("r0", "error", "server", 500), ("r1", "error", "server", 502)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]


async def test_the_request_deadline_ends_an_attempt_that_gets_no_answer() -> None:
    """The provider accepts the call and never answers: the request's deadline, not the
    provider's read timeout (90 s), ends it, and no fallback starts past the deadline."""
    roots, root = _publish(Script({"p0": MockResponse(ends="stall"), "p1": completion("unused")}), router_config(0, 1))
    ctx = request_context(root, timeout_s=0.05)

    with pytest.raises(DeadlineExceeded) as info:
        await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert (info.value.status, info.value.code) == (504, "deadline_exceeded")
    assert attempts(ctx) == [("r0", "error", "timeout", None)]
    assert [r.provider for r in roots.requests] == ["p0"]


async def test_a_providers_read_timeout_is_a_retryable_timeout() -> None:
    """The provider's own ``requestTimeoutMs`` (here 50 ms) fires before the request's deadline:
    a timeout is retried elsewhere first ("last" in place), so the next route answers."""
    data = router_config(0, 1)
    data["providers"]["p0"].update(connectTimeoutMs=50, requestTimeoutMs=50)
    roots, root = _publish(Script({"p0": MockResponse(ends="stall"), "p1": completion("from p1")}), data)
    ctx = request_context(root)

    response = await Gateway(sleep=Sleeps()).complete(ctx, _request())

    assert response.content == "from p1"
    assert attempts(ctx) == [("r0", "error", "timeout", None), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]


async def test_a_request_cancelled_while_waiting_records_the_attempt_as_cancelled() -> None:
    """A client that goes away mid-attempt: the attempt says so, and the route's in-flight count
    and health verdicts are left as they were (an abandoned call says nothing of the provider)."""
    roots, root = _publish(Script({"p0": MockResponse(ends="stall"), "p1": completion("unused")}), router_config(0, 1))
    ctx = request_context(root)
    health = root.aliases["a"].groups[0][0].health

    task = asyncio.ensure_future(Gateway(sleep=Sleeps()).complete(ctx, _request()))
    async with asyncio.timeout(5):
        while not roots.requests:
            await asyncio.sleep(0)
    assert health.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert attempts(ctx) == [("r0", "cancelled", None, None)]
    assert (health.in_flight, health.consecutive_failures) == (0, 0)
    assert [r.provider for r in roots.requests] == ["p0"]
