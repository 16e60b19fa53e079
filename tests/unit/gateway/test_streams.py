"""``Gateway.open_stream``: a stream falls back until its first token and never after it (unless the
alias opts into ``streamRecovery: continue``), over a ``MockTransport``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.fakes.gateway import Sleeps, attempts, request_context
from tests.fakes.openai_chat import completion, error, stream
from tests.fakes.roots import MockRoots, router_config
from tests.fakes.transport import End, MockRequest, MockResponse, Script, connect_error, connection_lost
from tollway.canonical import CanonicalRequest, Message, StreamEvent, StreamFinish, TextDelta
from tollway.config.root import PublishedRoot
from tollway.exceptions import DeadlineExceeded, UpstreamCategory, UpstreamError
from tollway.gateway import CommittedStream, Gateway


def _request() -> CanonicalRequest:
    return CanonicalRequest(messages=[Message("user", "hello world")], stream=True)


def _publish(answers: Script, data: dict[str, Any]) -> tuple[MockRoots, PublishedRoot]:
    roots = MockRoots(answers)
    return roots, roots.publish(data)


def _texts(events: list[StreamEvent]) -> list[str]:
    return [ev.text for ev in events if isinstance(ev, TextDelta)]


async def _drain(committed: CommittedStream) -> tuple[list[StreamEvent], UpstreamError | None]:
    """Every event up to the end, and the error that ended the stream; then closes it, as the
    chat handler does (told the error, so the attempt settles as a midstream failure)."""
    seen: list[StreamEvent] = []
    failure: UpstreamError | None = None
    try:
        async for ev in committed.events():
            seen.append(ev)
    except UpstreamError as exc:
        failure = exc
    await committed.aclose(failure)
    return seen, failure


async def test_a_stream_commits_at_its_first_token_and_delivers_the_rest() -> None:
    roots, root = _publish(Script({"p0": stream("Hel", "lo"), "p1": stream("unused")}), router_config(0, 1))
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    assert attempts(ctx) == [("r0", "pending", None, 200)]  # committed, not settled until closed
    seen, failure = await _drain(committed)

    assert failure is None
    assert _texts(seen) == ["Hel", "lo"]
    assert StreamFinish("stop") in seen
    assert attempts(ctx) == [("r0", "ok", None, 200)]
    assert ctx.usage is not None and (ctx.usage.prompt_tokens, ctx.usage.completion_tokens) == (5, 2)
    [sent] = roots.requests
    assert (sent.provider, sent.stream) == ("p0", True)
    assert sent.json()["stream"] is True
    assert [s.closed for s in roots.transport.streams] == [True]


@pytest.mark.parametrize(
    ("cut", "category"),
    [
        pytest.param(connection_lost(), UpstreamCategory.SERVER, id="connection-lost"),
        pytest.param("close", UpstreamCategory.TRUNCATED, id="clean-end-before-finish"),
    ],
)
async def test_a_stream_cut_after_its_first_token_fails_from_events_without_fallback(
    cut: End, category: UpstreamCategory
) -> None:
    answer = stream("Hel", "lo", complete=False, ends=cut)
    roots, root = _publish(Script({"p0": answer, "p1": stream("never sent")}), router_config(0, 1))
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, failure = await _drain(committed)

    assert _texts(seen) == ["Hel", "lo"]
    assert failure is not None and failure.category is category and not failure.reported
    assert failure.to_stream_error().code == "upstream_stream_cut"
    assert attempts(ctx) == [("r0", "midstream_error", category.value, 200)]
    assert [r.provider for r in roots.requests] == ["p0"]
    assert [s.closed for s in roots.transport.streams] == [True]


async def test_a_stream_that_stalls_after_its_first_token_fails_as_stalled() -> None:
    """The provider's idle timeout (``streamIdleTimeoutMs``, here 50 ms) ends a silent stream."""
    roots, root = _publish(
        Script({"p0": stream("Hel", complete=False, ends="stall"), "p1": stream("never sent")}),
        router_config(0, 1, streamIdleTimeoutMs=50),
    )
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, failure = await _drain(committed)

    assert _texts(seen) == ["Hel"]
    assert failure is not None and failure.category is UpstreamCategory.TIMEOUT
    assert failure.to_stream_error().code == "upstream_stream_stalled"
    assert attempts(ctx) == [("r0", "midstream_error", "timeout", 200)]
    assert [r.provider for r in roots.requests] == ["p0"]


@pytest.mark.parametrize(
    ("first", "category", "status"),
    [
        pytest.param(error(500), "server", 500, id="error-status"),
        pytest.param(MockResponse.failing(connect_error()), "connect", None, id="connect-error"),
        pytest.param(stream(complete=False, ends=connection_lost()), "server", 200, id="cut-before-output"),
        pytest.param(stream(complete=False), "truncated", 200, id="ended-before-output"),
        pytest.param(MockResponse(chunks=[b"data: {not json\n\n"]), "malformed", 200, id="undecodable-frame"),
    ],
)
async def test_a_stream_that_fails_before_its_first_token_falls_back(
    first: MockResponse, category: str, status: int | None
) -> None:
    roots, root = _publish(
        Script({"p0": first, "p1": stream("from ", "p1")}), router_config(0, 1, routing={"sameRouteRetries": 0})
    )
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, failure = await _drain(committed)

    assert failure is None
    assert _texts(seen) == ["from ", "p1"]
    assert attempts(ctx) == [("r0", "error", category, status), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]
    assert all(s.closed for s in roots.transport.streams)  # the failed one was closed, not leaked


@pytest.mark.parametrize("head", [True, False], ids=["head-then-silence", "no-head"])
async def test_a_stream_silent_before_its_first_token_falls_back_at_the_setup_deadline(head: bool) -> None:
    """``admission.streamSetupTimeoutMs`` (here 50 ms) bounds the wait for the first token."""
    fallback = stream("from p1")

    async def handler(request: MockRequest) -> MockResponse:
        if request.provider == "p1":
            return fallback
        if head:
            return stream(complete=False, ends="stall")
        await asyncio.get_running_loop().create_future()  # accepts the call, never sends a response head
        raise AssertionError("unreachable")

    roots = MockRoots(handler)
    root = roots.publish(router_config(0, 1, admission={"streamSetupTimeoutMs": 50}))
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, failure = await _drain(committed)

    assert failure is None
    assert _texts(seen) == ["from p1"]
    assert attempts(ctx) == [("r0", "error", "timeout", 200 if head else None), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]


async def test_the_request_deadline_ends_a_stream_still_waiting_for_its_first_token() -> None:
    roots, root = _publish(
        Script({"p0": stream(complete=False, ends="stall"), "p1": stream("never sent")}), router_config(0, 1)
    )
    ctx = request_context(root, timeout_s=0.05)

    with pytest.raises(DeadlineExceeded):
        await Gateway(sleep=Sleeps()).open_stream(ctx, _request())

    assert attempts(ctx) == [("r0", "error", "timeout", 200)]
    assert [r.provider for r in roots.requests] == ["p0"]
    assert [s.closed for s in roots.transport.streams] == [True]


async def test_a_cut_stream_continues_on_a_prefill_route_under_stream_recovery() -> None:
    """``streamRecovery: continue``: the cut text stream goes on at a route declaring
    ``assistantPrefill``, sent what the client already has as an assistant message."""
    data = router_config(
        0,
        1,
        model={"streamRecovery": "continue"},
        routes={1: {"capabilities": ["streaming", "assistantPrefill"]}},
    )
    roots, root = _publish(
        Script({"p0": stream("Hello", " wor", complete=False, ends=connection_lost()), "p1": stream("ld")}), data
    )
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, failure = await _drain(committed)

    assert failure is None
    assert _texts(seen) == ["Hello", " wor", "ld"]
    assert attempts(ctx) == [("r0", "midstream_error", "server", 200), ("r1", "ok", None, 200)]
    continued = roots.requests[1]
    assert continued.provider == "p1"
    assert continued.json()["messages"][-1] == {"role": "assistant", "content": "Hello wor"}


async def test_a_buffered_answer_to_a_stream_request_is_not_a_stream() -> None:
    """A provider that answers a stream request with a JSON body has sent no SSE frame: the
    attempt fails before output (nothing decodes as an event) and the next route streams."""
    roots, root = _publish(
        Script({"p0": completion("json, not sse"), "p1": stream("from p1")}),
        router_config(0, 1, routing={"sameRouteRetries": 0}),
    )
    ctx = request_context(root)

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    seen, _ = await _drain(committed)

    assert _texts(seen) == ["from p1"]
    assert attempts(ctx) == [("r0", "error", "truncated", 200), ("r1", "ok", None, 200)]
    assert [r.provider for r in roots.requests] == ["p0", "p1"]


async def test_a_client_that_leaves_mid_stream_closes_the_upstream_and_cancels_the_attempt() -> None:
    roots, root = _publish(Script({"p0": stream("Hel", "lo", "!"), "p1": stream("unused")}), router_config(0, 1))
    ctx = request_context(root)
    health = root.aliases["a"].groups[0][0].health

    committed = await Gateway(sleep=Sleeps()).open_stream(ctx, _request())
    first: list[StreamEvent] = []
    async for ev in committed.events():
        first.append(ev)
        if isinstance(ev, TextDelta):
            break  # the client reads one token and leaves
    assert health.in_flight == 1
    await committed.aclose()

    assert _texts(first) == ["Hel"]
    assert attempts(ctx) == [("r0", "cancelled", None, 200)]
    assert (health.in_flight, health.consecutive_failures) == (0, 0)
    [upstream] = roots.transport.streams
    assert upstream.closed and upstream.delivered == 1


async def test_a_cut_stream_that_carried_thinking_is_not_continued() -> None:
    """A continuation would have to resend the thinking block, signed, as a prefill (Anthropic
    refuses a prefill without it): the cut ends the stream with its own error, resume never asked."""
    from contextlib import AsyncExitStack

    from tollway.canonical import ThinkingDelta
    from tollway.gateway import AttemptRecord, RecoverableStream

    data = router_config(
        0, 1, model={"streamRecovery": "continue"}, routes={1: {"capabilities": ["streaming", "assistantPrefill"]}}
    )
    _, root = _publish(Script({}), data)
    ctx = request_context(root)
    target = root.aliases[ctx.plan.name].groups[0][0]
    cut = UpstreamError(UpstreamCategory.TRUNCATED, detail="cut")

    async def rest() -> Any:
        yield TextDelta("Hello")
        raise cut

    asked: list[str] = []

    async def resume(emitted: str) -> None:
        asked.append(emitted)

    committed = RecoverableStream(
        ctx,
        target,
        AttemptRecord(1, target.route_id, "p0", 0.0),
        AsyncExitStack(),
        [ThinkingDelta(0, "hm")],
        rest(),
        resume,
    )
    seen, failure = await _drain(committed)
    assert failure is cut and asked == []
    assert _texts(seen) == ["Hello"] and committed.output_chars == len("hm") + len("Hello")
