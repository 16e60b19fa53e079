"""The pipeline's one guarantee of release, on every exit path, with real roots and a scripted
transport: permits come back, every stage that began is finished exactly once with the final
status, and a stage that was never entered is never finished."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from tests.fakes import openai_chat as oa
from tests.fakes.roots import ALIAS, MockRoots, router_config
from tests.fakes.transport import MockRequest, MockResponse
from tollway.api.chat_completions import CHAT_COMPLETIONS
from tollway.canonical import StreamEvent, TextDelta
from tollway.config.root import PublishedRoot, RootHolder
from tollway.exceptions import BudgetExceeded
from tollway.gateway import Gateway
from tollway.pipeline.admission import Admission
from tollway.pipeline.core import ClientGone, Inbound, Pipeline, Reply, StreamReply
from tollway.pipeline.stage import BaseStage, Call, StreamTransform

KEY = "tw-test-key"
PRINCIPALS = [
    {
        "id": "svc",
        "tenant": "t",
        "allowedModels": [ALIAS],
        "keys": [{"id": "key-1", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
    }
]


class Recorder(BaseStage):
    """A stage that records each hook it sees, and can refuse or fail where a test says."""

    def __init__(self, name: str, log: list[tuple[Any, ...]], *, refuse: BaseException | None = None) -> None:
        self.name = name
        self.log = log
        self.refuse = refuse
        self.fail_finish = False

    async def before(self, call: Call) -> None:
        self.log.append((self.name, "before"))
        if self.refuse is not None:
            raise self.refuse

    async def finish(self, call: Call) -> None:
        self.log.append((self.name, "finish", call.status, call.code))
        if self.fail_finish:
            raise RuntimeError("finish failed")


class Upper:
    """A transform with bounded state: holds each text delta back until the next event, upper-cased."""

    def __init__(self) -> None:
        self.held: list[StreamEvent] = []

    def feed(self, ev: StreamEvent) -> Iterable[StreamEvent]:
        out, self.held = self.held, [TextDelta(ev.text.upper())] if isinstance(ev, TextDelta) else []
        return out if isinstance(ev, TextDelta) else [*out, ev]

    def flush(self) -> Iterable[StreamEvent]:
        out, self.held = self.held, []
        return out


class Transforming(Recorder):
    def transform(self, call: Call) -> StreamTransform | None:
        return Upper()


class FakeHeaders:
    """A request's headers as the HTTP layer hands them over: one key, JSON, no session header."""

    def __init__(self, authorization: str) -> None:
        self._values = {"authorization": [authorization], "content-type": ["application/json"]}

    def get(self, key: str, /) -> str | None:
        values = self._values.get(key.lower())
        return values[0] if values else None

    def getlist(self, key: str) -> list[str]:
        return list(self._values.get(key.lower(), []))


class Rig:
    def __init__(self, answer: MockResponse | BaseException | None = None, stages: tuple[BaseStage, ...] = ()) -> None:
        self.answer = answer
        self.roots = MockRoots(self._handle)
        self.roots.publisher.stages = lambda root, plan: stages
        self.root: PublishedRoot = self.roots.publish(router_config(0, principals=PRINCIPALS))
        self.admission = Admission()
        self.pipeline = Pipeline(RootHolder(self.root), self.admission, Gateway())
        self.gone = asyncio.Event()
        self.upstream_started = asyncio.Event()

    async def _handle(self, request: MockRequest) -> MockResponse:
        self.upstream_started.set()
        answer = self.answer
        if answer is None:
            await asyncio.Event().wait()  # never answers: the test cancels or disconnects
        if isinstance(answer, BaseException):
            raise answer
        assert answer is not None
        return answer

    def inbound(self, body: dict[str, Any] | None = None, *, key: str = KEY) -> Inbound:
        raw = orjson.dumps(body or {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]})

        async def read_body(max_bytes: int, timeout_s: float) -> bytes:
            return raw

        async def disconnected() -> None:
            await self.gone.wait()

        return Inbound("req_0123456789ab", FakeHeaders(f"Bearer {key}"), read_body, disconnected)

    async def run(self, body: dict[str, Any] | None = None, **kw: Any) -> Reply | StreamReply:
        return await self.pipeline.run(CHAT_COMPLETIONS, self.inbound(body, **kw))

    def released(self) -> bool:
        return self.admission.requests == 0 and self.admission.streams == 0


STREAM = {"model": ALIAS, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def drain(reply: StreamReply) -> bytes:
    out = b""
    try:
        async for frame in reply.frames:
            out += frame
    finally:
        await reply.on_close()
    return out


async def test_a_buffered_answer_finishes_each_stage_once_in_plan_order_and_releases() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion("Hello"), (Recorder("one", log), Recorder("two", log)))
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 200
    assert orjson.loads(reply.body)["choices"][0]["message"]["content"] == "Hello"
    assert log == [("one", "before"), ("two", "before"), ("one", "finish", 200, None), ("two", "finish", 200, None)]
    assert rig.released()


async def test_a_stage_that_refuses_is_not_finished_but_those_before_it_are() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion(), (Recorder("one", log), Recorder("two", log, refuse=BudgetExceeded())))
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 429
    assert orjson.loads(reply.body)["error"]["code"] == "budget_exceeded"
    assert log == [("one", "before"), ("two", "before"), ("one", "finish", 429, "budget_exceeded")]
    assert rig.roots.requests == []  # refused before any provider work
    assert rig.released()


async def test_an_unexpected_exception_in_a_stage_still_finishes_and_releases_then_propagates() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion(), (Recorder("one", log), Recorder("two", log, refuse=KeyError("bug"))))
    with pytest.raises(KeyError):
        await rig.run()
    assert log[-1] == ("one", "finish", 500, "internal_error")
    assert rig.released()


async def test_a_provider_error_finishes_with_the_clients_status() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.error(400, kind="invalid_request_error"), (Recorder("one", log),))
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 400
    assert log == [("one", "before"), ("one", "finish", 400, "invalid_request")]
    assert rig.released()


async def test_the_request_deadline_finishes_with_a_timeout() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(None, (Recorder("one", log),))
    rig.roots.publisher.stages = lambda root, plan: (Recorder("one", log),)
    rig.pipeline.holder.swap(rig.roots.publish(router_config(0, principals=PRINCIPALS, requestTimeoutMs=50)))
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 504
    assert log[-1] == ("one", "finish", 504, orjson.loads(reply.body)["error"]["code"])
    assert rig.released()


async def test_a_client_that_leaves_during_the_attempt_finishes_as_499() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(None, (Recorder("one", log),))
    task = asyncio.ensure_future(rig.run())
    await asyncio.wait_for(rig.upstream_started.wait(), 10)
    rig.gone.set()
    reply = await asyncio.wait_for(task, 10)
    assert isinstance(reply, Reply) and reply.status == 499
    assert log == [("one", "before"), ("one", "finish", 499, None)]
    assert rig.released()


async def test_a_client_that_leaves_while_the_body_is_read_releases_its_permit() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion(), (Recorder("one", log),))
    inbound = rig.inbound()

    async def gone(max_bytes: int, timeout_s: float) -> bytes:
        raise ClientGone

    reply = await rig.pipeline.run(
        CHAT_COMPLETIONS,
        Inbound(inbound.request_id, inbound.headers, gone, inbound.disconnected),
    )
    assert isinstance(reply, Reply) and reply.status == 499
    assert log == []  # the plan was never resolved: no stage began
    assert rig.released()


async def test_a_cancelled_request_finishes_as_499_and_the_cancellation_propagates() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(None, (Recorder("one", log),))
    task = asyncio.ensure_future(rig.run())
    await asyncio.wait_for(rig.upstream_started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == [("one", "before"), ("one", "finish", 499, None)]
    assert rig.released()


async def test_a_stage_whose_finish_fails_does_not_cost_the_others_their_end() -> None:
    log: list[tuple[Any, ...]] = []
    first = Recorder("one", log)
    first.fail_finish = True
    rig = Rig(oa.completion(), (first, Recorder("two", log)))
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 200
    assert log[-1] == ("two", "finish", 200, None)
    assert rig.released()


async def test_an_unknown_model_is_refused_before_any_stage() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion(), (Recorder("one", log),))
    reply = await rig.run({"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(reply, Reply) and reply.status == 404
    assert log == []
    assert rig.released()


async def test_a_bad_key_holds_no_permit_and_is_counted() -> None:
    rig = Rig(oa.completion())
    reply = await rig.run(key="wrong")
    assert isinstance(reply, Reply) and reply.status == 401
    assert rig.pipeline.counters.unauthenticated == 1
    assert rig.released()


async def test_the_input_estimate_is_checked_against_the_alias_bound_before_any_stage() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.completion(), (Recorder("one", log),))
    rig.roots.publisher.stages = lambda root, plan: (Recorder("one", log),)
    rig.pipeline.holder.swap(rig.roots.publish(router_config(0, principals=PRINCIPALS, model={"maxInputTokens": 10})))
    reply = await rig.run({"model": ALIAS, "messages": [{"role": "user", "content": "x" * 400}]})
    assert isinstance(reply, Reply) and reply.status == 400
    assert orjson.loads(reply.body)["error"]["code"] == "context_length_exceeded"
    assert log == []
    assert rig.released()


async def test_a_stream_ends_its_lifecycle_when_the_response_closes() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.stream("Hel", "lo"), (Recorder("one", log),))
    reply = await rig.run(STREAM)
    assert isinstance(reply, StreamReply)
    assert log == [("one", "before")]  # still streaming: nothing finished yet
    assert rig.admission.streams == 1
    body = await drain(reply)
    assert body.endswith(b"data: [DONE]\n\n")
    assert log == [("one", "before"), ("one", "finish", 200, None)]
    await reply.on_close()  # a second close changes nothing
    assert len(log) == 2
    assert rig.released()


async def test_a_stream_the_client_never_read_still_ends_once_as_499() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.stream("Hel", "lo"), (Recorder("one", log),))
    reply = await rig.run(STREAM)
    assert isinstance(reply, StreamReply)
    await reply.frames.aclose()
    await reply.on_close()
    assert log == [("one", "before"), ("one", "finish", 499, None)]
    assert rig.released()


async def test_a_stream_cut_after_its_first_token_ends_with_the_cut_code() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.stream("Hel", complete=False, ends=oa_cut()), (Recorder("one", log),))
    reply = await rig.run(STREAM)
    assert isinstance(reply, StreamReply)
    body = await drain(reply)
    assert b"upstream_stream_cut" in body
    assert log[-1] == ("one", "finish", 502, "upstream_stream_cut")
    assert rig.released()


def oa_cut() -> Any:
    from tests.fakes.transport import connection_lost

    return connection_lost()


async def streamed_texts(stages: tuple[BaseStage, ...]) -> list[str]:
    """The text deltas a client gets for a stream of "ab", "cd" through ``stages``."""
    reply = await Rig(oa.stream("ab", "cd"), stages).run(STREAM)
    assert isinstance(reply, StreamReply)
    texts = [
        c["delta"].get("content")
        for frame in (await drain(reply)).split(b"\n\n")
        if frame.startswith(b"data: {")
        for c in orjson.loads(frame[6:])["choices"]
    ]
    return [t for t in texts if t]


async def test_stream_transforms_run_and_flush_what_they_hold() -> None:
    log: list[tuple[Any, ...]] = []
    assert await streamed_texts((Transforming("t", log),)) == ["AB", "CD"]


class Suffix:
    """A stateless transform: each text delta with an ``x`` after it."""

    def feed(self, ev: StreamEvent) -> Iterable[StreamEvent]:
        return [TextDelta(ev.text + "x")] if isinstance(ev, TextDelta) else [ev]

    def flush(self) -> Iterable[StreamEvent]:
        return []


class Suffixing(Recorder):
    def transform(self, call: Call) -> StreamTransform | None:
        return Suffix()


async def test_several_stream_transforms_run_nearest_the_provider_first() -> None:
    # Plan order: the suffix stage, then the upper-casing one, which is nearer the provider, so the
    # text is upper-cased first and suffixed after ("ABx"; the other order would give "ABX"). What
    # the upper-casing transform holds at the end goes through the suffix as well.
    log: list[tuple[Any, ...]] = []
    assert await streamed_texts((Suffixing("s", log), Transforming("t", log))) == ["ABx", "CDx"]


async def test_a_plan_with_no_stages_runs_none() -> None:
    rig = Rig(oa.completion())
    assert rig.root.aliases[ALIAS].stages == ()
    reply = await rig.run()
    assert isinstance(reply, Reply) and reply.status == 200
    assert rig.released()


class _BrokenEncoder:
    """The Chat Completions front end, except that building a stream's encoder fails."""

    name = CHAT_COMPLETIONS.name
    api_key_header = None
    check_headers = staticmethod(CHAT_COMPLETIONS.check_headers)
    decode = staticmethod(CHAT_COMPLETIONS.decode)
    encode_response = staticmethod(CHAT_COMPLETIONS.encode_response)
    encode_error = staticmethod(CHAT_COMPLETIONS.encode_error)

    def encode_stream(self, meta: Any, req: Any) -> Any:
        raise RuntimeError("encoder failed")


async def test_a_committed_stream_nothing_will_read_is_closed_and_its_attempt_settled() -> None:
    log: list[tuple[Any, ...]] = []
    rig = Rig(oa.stream("Hel", "lo"), (Recorder("one", log),))
    with pytest.raises(RuntimeError):
        await rig.pipeline.run(_BrokenEncoder(), rig.inbound(STREAM))
    assert [s.closed for s in rig.roots.transport.streams] == [True]
    assert log == [("one", "before"), ("one", "finish", 500, "internal_error")]
    assert rig.released()


class _Hangs(Recorder):
    """A stage whose ``finish`` waits until cancelled (an audit commit during a shutdown)."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        super().__init__("hangs", log)
        self.finishing = asyncio.Event()

    async def finish(self, call: Call) -> None:
        self.finishing.set()
        await asyncio.Event().wait()


async def test_a_cancellation_during_a_stage_finish_still_finishes_the_rest_and_releases() -> None:
    log: list[tuple[Any, ...]] = []
    hangs = _Hangs(log)
    rig = Rig(oa.completion(), (hangs, Recorder("two", log)))
    task = asyncio.ensure_future(rig.run())
    await asyncio.wait_for(hangs.finishing.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log[-1] == ("two", "finish", 200, None)
    assert rig.released()
