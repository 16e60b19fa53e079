"""The protocol-neutral runtime: an authenticated request context plus a canonical request in,
a canonical response or a stream of semantic events out.

``Gateway.complete`` and ``Gateway.open_stream`` walk the alias plan under one attempt budget
(count and deadline) and one retry policy (``tollway.routing.retry.RetryPolicy``): a retryable
failure before the first semantic event is retried on its own route or moves to the next
target, as the policy says. A stream is *committed* as soon as its first semantic event is in
hand, and nothing moves after that, except under the alias's opt-in ``streamRecovery:
continue``. Handlers render; they never decide routing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, TypeAlias, TypeVar

from tollway.canonical import (
    SEMANTIC_EVENTS,
    CanonicalRequest,
    CanonicalResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    Message,
    RedactedThinking,
    SkippedEvent,
    StreamEvent,
    StreamFinish,
    StreamUsage,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
    UsageEvidence,
    estimate_tokens,
)
from tollway.config.root import PublishedRoot
from tollway.eventstream import EventStreamError, EventStreamTooLarge, aiter_eventstream
from tollway.exceptions import GatewayError, ModelUnavailable, RateLimited, UpstreamCategory, UpstreamError
from tollway.governance.meter import Admitted, Governor
from tollway.governance.principals import Principal
from tollway.routing.health import eject_outliers
from tollway.routing.plan import AliasPlan, RouteTarget
from tollway.routing.retry import affects_health
from tollway.routing.strategies import SelectionInput
from tollway.sse import SseFrameTooLarge, aiter_sse
from tollway.wire import UpstreamRequest

if TYPE_CHECKING:
    from tollway.providers.base import AnyCodec
    from tollway.telemetry.metrics import GatewayMetrics
    from tollway.telemetry.tracing import RequestTrace
    from tollway.transport.base import UpstreamStream

__all__ = ["AttemptRecord", "CommittedStream", "Gateway", "RecoverableStream", "RequestContext"]

_T = TypeVar("_T")
_SHARED_RNG = random.Random()
_Reason: TypeAlias = Literal["first", "retry", "fallback", "continuation"]
_RECOVERABLE = frozenset({UpstreamCategory.TRUNCATED, UpstreamCategory.SERVER, UpstreamCategory.TIMEOUT})
"""What ``streamRecovery: continue`` recovers from, when the gateway observed it (never an error
the provider reported): a cut stream, a lost connection, a stall."""


@dataclass(slots=True)
class AttemptRecord:
    number: int
    route_id: str
    deployment_id: str
    started: float
    ended: float | None = None
    outcome: str = "pending"
    """ok, error, cancelled, or midstream_error."""
    error_category: str | None = None
    upstream_status: int | None = None
    first_event_s: float | None = None
    ticket: int | None = None
    """The health object's ticket for this attempt: only a current one may move the circuit."""
    connect_s: float | None = None
    """Connection set-up time (``0.0``: a pooled connection reused); set only while audited."""
    skipped_events: int = 0
    """Upstream stream events that did not decode and were skipped (at most one survives)."""
    reason: str = "first"
    """Why it was made: first, retry (the same route again), fallback, or continuation."""
    provider_name: str = ""
    """The deployment's ``gen_ai.provider.name`` (``openai``, ``gcp.vertex_ai``): metrics and spans."""


class AttemptAudit(Protocol):
    """What the attempt loop tells the audit trail (``tollway.audit.recorder.AuditRecorder``)."""

    async def attempt_started(self, ctx: RequestContext, number: int, target: RouteTarget, reason: _Reason) -> None:
        """``reason`` is also ``continuation`` for an attempt that continues a recovered stream."""

    def attempt_finished(self, ctx: RequestContext, record: AttemptRecord) -> None: ...


@dataclass(slots=True)
class RequestContext:
    request_id: str
    principal: Principal
    root: PublishedRoot
    plan: AliasPlan
    deadline: float
    """Absolute, on the event loop's clock."""
    received: float = field(default_factory=time.monotonic)
    session_id: str | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    usage: Usage | None = None
    rng: random.Random = field(default_factory=lambda: _SHARED_RNG)
    """Weighted choice and backoff jitter. One process-wide generator: seeding one per request
    read 2.5 KB from the OS each time (py-spy showed it on the hot path); tests pass their own."""
    audit: AttemptAudit | None = None
    """Set when the audit trail is on: told of each attempt before dispatch and when it settles."""
    governance: Admitted | None = None
    """What admission reserved for this request (``None``: no policy applies to its key and alias)."""
    input_tokens: int = 0
    """The request's input-token estimate, computed once when it is decoded: the alias's input
    bound, the reservation and the usage fallback all read it (each estimate re-serializes
    every tool schema)."""
    reserved_tokens: int = 0
    """The input estimate plus the maximum output: what a dispatch takes from its quota group's TPM."""
    route_bucket: str | None = None
    """The canary/A-B bucket the route decision put the request in (audited with each attempt)."""
    answered: RouteTarget | None = None
    """The route whose attempt succeeded (for a stream: the one that committed)."""
    trace: RequestTrace | None = None
    """Set only for a sampled request: its trace, whose spans are built when it ends."""
    operation: str = "chat.completions"
    """The API the client called, as the audit trail names it (``tollway.pipeline.core.OPERATIONS``)."""

    @property
    def response_model(self) -> str:
        """The response's ``model``: the alias, or under ``responseModel: route`` the public name of
        the route that answered, so a client can tell a fallback answer from a primary one."""
        answered = self.answered
        if self.plan.response_model == "route" and answered is not None:
            return answered.public_model
        return self.plan.name


class CommittedStream:
    """A stream whose first semantic event has arrived; it can no longer fall back."""

    def __init__(
        self,
        ctx: RequestContext,
        target: RouteTarget,
        attempt: AttemptRecord,
        stack: AsyncExitStack,
        prelude: list[StreamEvent],
        rest: AsyncIterator[StreamEvent],
    ) -> None:
        self._ctx = ctx
        self._target = target
        self._attempt = attempt
        self._stack = stack
        self._prelude = prelude
        self._rest = rest
        self._finished = False
        self._live = True
        """The current attempt is not settled yet (a recovered stream settles the cut one early)."""
        self.output_chars = 0
        self.tool_calls = False
        """A tool-call delta reached the client: a gap in the stream could corrupt its arguments."""
        self.thinking = False
        """A thinking block reached the client: a continuation would have to resend it, signed, as a prefill."""

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Every event after commitment; raises ``UpstreamError`` on a midstream failure."""
        for ev in self._prelude:
            yield self._observe(ev)
        self._prelude = []
        try:
            async for ev in self._rest:
                yield self._observe(ev)
        except _FRAMING_ERRORS as exc:
            raise _framing_error(exc) from None
        self._finished = True

    def _observe(self, ev: StreamEvent) -> StreamEvent:
        kind = type(ev)
        if kind is TextDelta:
            self.output_chars += len(ev.text)  # type: ignore[union-attr]
        elif kind is ToolCallDelta:
            self.output_chars += len(ev.arguments)  # type: ignore[union-attr]
            self.tool_calls = True
        elif kind is StreamUsage:
            self._ctx.usage = ev.usage  # type: ignore[union-attr]
        elif kind is SkippedEvent:
            self._skip()
        elif kind is ThinkingDelta:  # billed as output: the local estimate counts it too
            self.output_chars += len(ev.thinking)  # type: ignore[union-attr]
            self.thinking = True
        elif kind is RedactedThinking:
            self.thinking = True
        return ev

    def _skip(self) -> None:
        """One undecodable event between good ones is skipped and counted on the attempt; a second
        one, or one after a tool-call delta (whose arguments it may have carried), fails the stream."""
        attempt = self._attempt
        if attempt.skipped_events or self.tool_calls:
            raise UpstreamError(UpstreamCategory.MALFORMED, detail="undecodable stream event")
        attempt.skipped_events = 1

    def final_usage(self) -> Usage:
        """The stream's usage: what the provider reported, else (once, for the client's usage frame,
        the budget and the audit trail alike) a local estimate of what was sent and streamed."""
        usage = self._ctx.usage
        if usage is None:
            usage = self._ctx.usage = local_usage(self._ctx.input_tokens, self.output_chars)
        return usage

    async def aclose(self, error: BaseException | None = None) -> None:
        """Close the upstream call (cancelling it if still open) and settle the attempt."""
        if self._live:
            self._settle(error)
        self.final_usage()
        await self._stack.aclose()

    def _settle(self, error: BaseException | None) -> None:
        self._live = False
        attempt, health = self._attempt, self._target.health
        attempt.ended = time.monotonic()
        if self._finished and error is None:
            attempt.outcome = "ok"
            health.on_success(attempt.ended - attempt.started, ticket=attempt.ticket)
        elif isinstance(error, UpstreamError):
            attempt.outcome = "midstream_error"
            attempt.error_category = error.category.value
            health.on_failure(counts=affects_health(error), ticket=attempt.ticket)
        else:
            attempt.outcome = "cancelled"
            health.on_abandon(ticket=attempt.ticket)
        if self._ctx.audit is not None:
            self._ctx.audit.attempt_finished(self._ctx, attempt)


def local_usage(input_tokens: int, output_chars: int) -> Usage:
    """The usage of an answer its provider reported none for: the input estimate, and the output
    estimated from what was received. The one fallback, for buffered answers and streams."""
    return Usage(
        prompt_tokens=input_tokens,
        completion_tokens=estimate_tokens(output_chars),
        evidence=UsageEvidence.LOCAL_ESTIMATE,
    )


class _Resumed(NamedTuple):
    """A continuation that reached its first token: what the stream goes on with."""

    target: RouteTarget
    attempt: AttemptRecord
    stack: AsyncExitStack
    events: AsyncIterator[StreamEvent]


_Resume: TypeAlias = Callable[[str], Awaitable[_Resumed | None]]


class RecoverableStream(CommittedStream):
    """A committed stream under ``streamRecovery: continue``: a text-only stream cut or stalled
    after its first token continues on another route that declares ``assistantPrefill``, sent
    what the client already has as an assistant prefill, so only the continuation streams on.

    A subclass, so an alias without the opt-in pays nothing per chunk for it. Anything that is
    not a cut or a stall, a stream that carried a tool-call delta or thinking or already finished, or no
    route able to continue, still ends with the original error.
    """

    def __init__(
        self,
        ctx: RequestContext,
        target: RouteTarget,
        attempt: AttemptRecord,
        stack: AsyncExitStack,
        prelude: list[StreamEvent],
        rest: AsyncIterator[StreamEvent],
        resume: _Resume,
    ) -> None:
        super().__init__(ctx, target, attempt, stack, prelude, rest)
        self._resume = resume
        self._emitted: list[str] = []
        self._finish_seen = False

    async def events(self) -> AsyncIterator[StreamEvent]:
        for ev in self._prelude:
            yield self._observe(ev)
        self._prelude = []
        while True:
            try:
                async for ev in self._rest:
                    yield self._observe(ev)
                break
            except _FRAMING_ERRORS as exc:
                raise _framing_error(exc) from None
            except UpstreamError as err:
                if not self._recoverable(err):
                    raise
                self._settle(err)
                await self._stack.aclose()
                resumed = await self._resume("".join(self._emitted))
                if resumed is None:
                    raise err from None
                self._target, self._attempt, self._stack, self._rest = resumed
                self._live = True
        self._finished = True

    def _observe(self, ev: StreamEvent) -> StreamEvent:
        if type(ev) is TextDelta:
            self._emitted.append(ev.text)
        elif type(ev) is StreamFinish:
            self._finish_seen = True
        return super()._observe(ev)

    def _recoverable(self, err: UpstreamError) -> bool:
        return (
            not err.reported
            and err.category in _RECOVERABLE
            and not self.tool_calls
            and not self.thinking
            and not self._finish_seen
            and bool(self._emitted)
        )


def _without_leading_space(prelude: list[StreamEvent]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for ev in prelude:
        if type(ev) is TextDelta:
            text = ev.text.lstrip()
            if not text:
                continue
            ev = TextDelta(text)
        out.append(ev)
    return out


async def _chain(first: list[StreamEvent], rest: AsyncIterator[StreamEvent]) -> AsyncIterator[StreamEvent]:
    for ev in first:
        yield ev
    async for ev in rest:
        yield ev


async def _open_upstream(
    ctx: RequestContext, req: CanonicalRequest, target: RouteTarget, record: AttemptRecord
) -> tuple[AsyncExitStack, list[StreamEvent], AsyncIterator[StreamEvent]]:
    """Send a stream request and read up to its commit point (``_prelude``) within the stream
    setup deadline; the exit stack closes the upstream response."""
    setup_deadline = asyncio.get_running_loop().time() + ctx.root.limits.stream_setup_timeout_s
    codec = target.deployment.codec
    upstream = _traced(ctx, record, codec.encode_request(req, target.target))
    stack = AsyncExitStack()
    try:
        try:
            async with asyncio.timeout_at(setup_deadline):
                timing = record if ctx.audit is not None else None
                response = await stack.enter_async_context(target.deployment.transport.stream(upstream, timing))
        except TimeoutError:
            raise UpstreamError(UpstreamCategory.TIMEOUT, detail="stream setup deadline") from None
        if response.status >= 400:
            body = await response.read_bounded()
            raise codec.decode_error(response.status, response.headers, body)
        record.upstream_status = response.status
        events = _decode_stream(codec, response)
        prelude = await _prelude(events, setup_deadline)
    except BaseException:
        await stack.aclose()
        raise
    record.first_event_s = time.monotonic() - record.started
    target.health.observe_ttft(record.first_event_s)
    return stack, prelude, events


def _decode_stream(codec: AnyCodec, response: UpstreamStream) -> AsyncIterator[StreamEvent]:
    """The stream's events, framed as the codec's format frames them."""
    if codec.framing == "eventstream":
        return codec.decode_stream(aiter_eventstream(response.aiter_bytes())).__aiter__()
    return codec.decode_stream(aiter_sse(response.aiter_bytes())).__aiter__()


_FRAMING_ERRORS: tuple[type[Exception], ...] = (SseFrameTooLarge, EventStreamError)
"""What framing raises once a stream's bytes no longer frame (SSE or AWS event stream)."""


def _framing_error(exc: Exception) -> UpstreamError:
    """A stream whose framing broke is malformed, whichever framing it was."""
    too_large = isinstance(exc, SseFrameTooLarge | EventStreamTooLarge)
    return UpstreamError(
        UpstreamCategory.MALFORMED, detail="stream frame too large" if too_large else "stream framing corrupt"
    )


def _traced(ctx: RequestContext, record: AttemptRecord, upstream: UpstreamRequest) -> UpstreamRequest:
    """The upstream request, with ``traceparent`` naming the attempt's span when the request is
    traced and the tracing config propagates upstream (``RequestTrace.propagate``)."""
    trace = ctx.trace
    if trace is None or not trace.propagate:
        return upstream
    header = trace.upstream_traceparent(record.number)
    return dataclasses.replace(upstream, headers={**upstream.headers, "traceparent": header})


async def _prelude(events: AsyncIterator[StreamEvent], deadline: float) -> list[StreamEvent]:
    """The events up to and including the first semantic one (the commit point), by ``deadline``:
    a provider that stalls before its first token fails the attempt as a timeout, so the request
    can still fall back. An undecodable event here fails the attempt too: nothing has reached
    the client yet, and another attempt gives a whole answer instead of one with a gap."""
    prelude: list[StreamEvent] = []
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                ev = await anext(events)
                if isinstance(ev, SkippedEvent):
                    raise UpstreamError(UpstreamCategory.MALFORMED, detail="undecodable event before output")
                prelude.append(ev)
                if isinstance(ev, (*SEMANTIC_EVENTS, StreamFinish)):
                    return prelude
    except StopAsyncIteration:
        raise UpstreamError(UpstreamCategory.MALFORMED, detail="stream ended before output") from None
    except _FRAMING_ERRORS as exc:
        raise _framing_error(exc) from None
    except TimeoutError:
        raise UpstreamError(UpstreamCategory.TIMEOUT, detail="stream setup deadline") from None


class _Walk:
    """One request's walk over its plan: what was tried, what may not be tried again, and why."""

    __slots__ = ("done", "last_error", "limited_accounts", "min_window", "retry_after", "saturated", "tries")

    def __init__(self) -> None:
        self.tries: dict[str, int] = {}
        """Attempts per route id."""
        self.retry_after: dict[str, float | None] = {}
        """The last ``Retry-After`` per route id: the least a retry of it waits."""
        self.done: set[str] = set()
        """Routes not to be tried again in this request (deferred, or too small a context window)."""
        self.limited_accounts: dict[str, str] = {}
        """Provider account → the deployment it answered 429 on: its other deployments are skipped."""
        self.min_window = 0
        """After a context-length refusal, only routes that declare a larger window are tried."""
        self.last_error: UpstreamError | None = None
        self.saturated = False

    def may_try(self, target: RouteTarget, same_route_retries: int) -> bool:
        route = target.route_id
        if route in self.done or self.tries.get(route, 0) > same_route_retries:
            return False
        return not self.min_window or (target.context_window or 0) > self.min_window

    def account_limited(self, target: RouteTarget) -> bool:
        dep = target.deployment
        return self.limited_accounts.get(dep.provider_account_id, dep.id) != dep.id


class Gateway:
    """Executes requests against the targets of their alias plan."""

    def __init__(
        self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, governor: Governor | None = None
    ) -> None:
        self._sleep = sleep
        self.governor = governor
        """Takes each target's quota-group capacity before dispatch (``None``: no capacity limits)."""
        self.metrics: GatewayMetrics | None = None
        """Counts targets skipped for saturation (set by the runtime when metrics are on)."""

    async def complete(self, ctx: RequestContext, req: CanonicalRequest) -> CanonicalResponse:
        async def attempt(target: RouteTarget, record: AttemptRecord) -> CanonicalResponse:
            upstream = _traced(ctx, record, target.deployment.codec.encode_request(req, target.target))
            timing = record if ctx.audit is not None else None
            status, headers, body = await target.deployment.transport.send(upstream, timing)
            if status >= 400:
                raise target.deployment.codec.decode_error(status, headers, body)
            record.upstream_status = status
            return target.deployment.codec.decode_response(status, body)

        response = await self._run(ctx, attempt)
        if response.usage is None:
            response.usage = local_usage(ctx.input_tokens, len(response.content or ""))
        ctx.usage = response.usage
        return response

    async def embed(self, ctx: RequestContext, req: EmbeddingRequest) -> EmbeddingResponse:
        """An embeddings request under the same walk as a buffered chat request: retries, fallback,
        circuits and capacity apply alike."""
        count = len(req.inputs)

        async def attempt(target: RouteTarget, record: AttemptRecord) -> EmbeddingResponse:
            codec = target.deployment.embeddings
            if codec is None:  # configuration keeps such a route out of an embeddings alias
                raise ModelUnavailable()
            upstream = _traced(ctx, record, codec.encode_embeddings(req, target.target))
            timing = record if ctx.audit is not None else None
            status, headers, body = await target.deployment.transport.send(upstream, timing)
            if status >= 400:
                raise codec.decode_error(status, headers, body)
            record.upstream_status = status
            answer = codec.decode_embeddings(status, body, count)
            if req.dimensions is not None and len(answer.vectors[0]) != req.dimensions:
                raise UpstreamError(UpstreamCategory.MALFORMED, status=status, detail="embeddings of other dimensions")
            return answer

        response = await self._run(ctx, attempt)
        if response.usage is None:
            response.usage = Usage(prompt_tokens=ctx.input_tokens, evidence=UsageEvidence.LOCAL_ESTIMATE)
        ctx.usage = response.usage
        return response

    async def open_stream(self, ctx: RequestContext, req: CanonicalRequest) -> CommittedStream:
        async def attempt(target: RouteTarget, record: AttemptRecord) -> CommittedStream:
            stack, prelude, events = await _open_upstream(ctx, req, target, record)
            if ctx.plan.stream_recovery == "continue":
                resume = functools.partial(self._continue, ctx, req)
                return RecoverableStream(ctx, target, record, stack, prelude, events, resume)
            return CommittedStream(ctx, target, record, stack, prelude, events)

        return await self._run(ctx, attempt, commits=True)

    async def _continue(self, ctx: RequestContext, req: CanonicalRequest, emitted: str) -> _Resumed | None:
        """Continue a cut text stream on the next eligible route that declares ``assistantPrefill``
        and was not tried in this request, under the same attempt budget and deadline; ``None``
        when none can. Routes without the capability are never tried (a 400 from one would only
        mask the cut). The output limit shrinks by what was already emitted.

        The prefill leaves out trailing whitespace (Anthropic refuses a final assistant turn that
        ends in it); the client already has that whitespace, so the continuation's leading
        whitespace is dropped rather than sent twice."""
        plan = ctx.plan
        prefill = emitted.rstrip()
        if not prefill:
            return None
        limit = req.max_output_tokens
        cont = dataclasses.replace(
            req,
            messages=[*req.messages, Message("assistant", prefill)],
            max_output_tokens=None if limit is None else max(1, limit - estimate_tokens(len(emitted))),
        )
        tried = {a.route_id for a in ctx.attempts}
        decision = plan.decide(
            SelectionInput(ctx.principal.id, ctx.session_id, ctx.request_id), ctx.rng, ctx.principal.regions
        )
        walk = _Walk()
        for target in decision.targets:
            n = len(ctx.attempts)
            if n >= plan.retry.max_attempts or asyncio.get_running_loop().time() >= ctx.deadline:
                return None
            if not target.prefill or target.route_id in tried or await self._blocked(ctx, target, walk):
                continue
            record = await self._begin(ctx, n + 1, target, "continuation")
            if record is None:
                continue
            try:
                async with asyncio.timeout_at(ctx.deadline):
                    stack, prelude, events = await _open_upstream(ctx, cont, target, record)
            except UpstreamError as err:
                self._fail(plan, target, record, err)
                self._settled(ctx, record)
                continue
            except TimeoutError:
                self._fail(plan, target, record, UpstreamError(UpstreamCategory.TIMEOUT, detail="request deadline"))
                self._settled(ctx, record)
                return None
            except BaseException as exc:
                record.outcome = "error" if isinstance(exc, GatewayError) else "cancelled"
                record.ended = time.monotonic()
                target.health.on_abandon(ticket=record.ticket)
                self._settled(ctx, record)
                raise
            ctx.answered = target
            if len(prefill) < len(emitted):
                prelude = _without_leading_space(prelude)
            return _Resumed(target, record, stack, _chain(prelude, events))
        return None

    async def _run(
        self,
        ctx: RequestContext,
        attempt: Callable[[RouteTarget, AttemptRecord], Awaitable[_T]],
        *,
        commits: bool = False,
    ) -> _T:
        """Walk the plan under one attempt budget; return the first success.

        Each pass takes a fresh order from the plan (open circuits, ejected and deferred targets
        left out). A failed route is retried in place when the retry policy says so, otherwise
        the walk moves on; a route not exhausted may be retried in a later pass.
        """
        plan = ctx.plan
        policy = plan.retry
        selection = SelectionInput(ctx.principal.id, ctx.session_id, ctx.request_id)
        walk = _Walk()
        n = 0
        while n < policy.max_attempts:
            decision = plan.decide(selection, ctx.rng, ctx.principal.regions)
            ctx.route_bucket = decision.bucket
            order = decision.targets
            if not order:
                break
            before = n
            for i, target in enumerate(order):
                while n < policy.max_attempts and walk.may_try(target, policy.same_route_retries):
                    tries = walk.tries.get(target.route_id, 0)
                    if tries and not await self._backoff(ctx, tries, walk.retry_after.get(target.route_id)):
                        break  # the wait would pass the deadline: another target needs none
                    blocked = await self._blocked(ctx, target, walk)
                    if blocked:
                        walk.saturated = walk.saturated or blocked == "capacity"
                        break
                    reason: _Reason = "first" if n == 0 else ("retry" if tries else "fallback")
                    record = await self._begin(ctx, n + 1, target, reason)
                    if record is None:
                        break  # lost the race for a half-open probe slot or an in-flight permit
                    n += 1
                    walk.tries[target.route_id] = tries + 1
                    try:
                        async with asyncio.timeout_at(ctx.deadline):
                            result = await attempt(target, record)
                    except UpstreamError as upstream_error:
                        self._fail(plan, target, record, upstream_error)
                        self._settled(ctx, record)
                        walk.last_error = failure = upstream_error
                    except TimeoutError:
                        timeout = UpstreamError(UpstreamCategory.TIMEOUT, detail="request deadline")
                        self._fail(plan, target, record, timeout)
                        self._settled(ctx, record)
                        raise timeout.to_gateway_error() from None
                    except BaseException as exc:  # a gateway-side error, or a cancellation
                        record.outcome = "error" if isinstance(exc, GatewayError) else "cancelled"
                        record.ended = time.monotonic()
                        target.health.on_abandon(ticket=record.ticket)
                        self._settled(ctx, record)
                        raise
                    else:
                        ctx.answered = target
                        if not commits:
                            record.outcome, record.ended = "ok", time.monotonic()
                            target.health.on_success(record.ended - record.started, ticket=record.ticket)
                            self._settled(ctx, record)
                        return result
                    if not self._retry_in_place(plan, walk, target, failure, order[i + 1 :], n):
                        break
            if n == before:
                break  # every target was skipped: nothing left to try
        raise self._final(plan, walk)

    @staticmethod
    def _retry_in_place(
        plan: AliasPlan, walk: _Walk, target: RouteTarget, err: UpstreamError, rest: list[RouteTarget], n: int
    ) -> bool:
        """Settle a failed attempt's consequences for the walk; whether to retry the same route now.

        Raises the client's error when nothing may follow ``err``. A context-length refusal moves
        on to routes with a larger declared window only. A ``Retry-After`` too long to wait for
        takes the deployment out of rotation for that long. Otherwise the route is retried in place
        when the policy retries its failure in place first and no same-priority alternative is
        available, and only while the retry leaves an attempt for a remaining fallback.
        """
        policy = plan.retry
        route = target.route_id
        if err.category is UpstreamCategory.CONTEXT_LENGTH:
            if target.context_window is None:
                raise err.to_gateway_error()
            walk.done.add(route)
            walk.min_window = max(walk.min_window, target.context_window)
            return False
        if not policy.retryable(err):
            raise err.to_gateway_error()
        walk.retry_after[route] = err.retry_after
        if err.category is UpstreamCategory.RATE_LIMIT:
            walk.limited_accounts.setdefault(target.deployment.provider_account_id, target.deployment.id)
        defer = policy.defer_s(err)
        if defer is not None:
            target.health.defer(defer, rate_limited=err.category is UpstreamCategory.RATE_LIMIT)
            walk.done.add(route)
            return False
        if not walk.may_try(target, policy.same_route_retries):
            return False
        others = [
            t
            for t in rest
            if walk.may_try(t, policy.same_route_retries) and t.health.available() and not walk.account_limited(t)
        ]
        if any(t.priority == target.priority for t in others):
            return False
        if not policy.retries_in_place_first(err):
            return not others
        return not others or n + 1 < policy.max_attempts

    async def _backoff(self, ctx: RequestContext, retry_number: int, retry_after: float | None) -> bool:
        """Wait before trying a route again; ``False`` (and no wait) when the wait would reach the deadline."""
        delay = ctx.plan.retry.backoff(retry_number, retry_after, ctx.rng)
        if asyncio.get_running_loop().time() + delay >= ctx.deadline:
            return False
        if delay > 0:
            await self._sleep(delay)
        return True

    async def _blocked(
        self, ctx: RequestContext, target: RouteTarget, walk: _Walk
    ) -> Literal["", "account", "capacity"]:
        """Why ``target`` is skipped: its account answered 429 on another of its deployments (that
        is the same capacity under another name, never a way around the limit), or its quota group
        is at its approved RPM/TPM. Otherwise its capacity is taken."""
        if walk.account_limited(target):
            return "account"
        governor = self.governor
        gov = ctx.root.governance
        capacity = gov.capacity.get(target.deployment.quota_group_id) if governor is not None else None
        if capacity and governor is not None:
            if not await governor.take_capacity(ctx.governance, capacity, ctx.reserved_tokens, gov.lease_wait_s):
                self._saturated(ctx, target, "capacity")
                return "capacity"
        return ""

    async def _begin(self, ctx: RequestContext, n: int, target: RouteTarget, reason: _Reason) -> AttemptRecord | None:
        """Take the target's health ticket and record the attempt's start (under local-durable,
        durably: an audit failure here fails the request with nothing sent upstream) before
        anything is sent; ``None`` when the target refuses the attempt."""
        ticket = target.health.try_start()
        if ticket is None:
            self._saturated(ctx, target, "slots")
            return None
        try:
            if ctx.audit is not None:
                await ctx.audit.attempt_started(ctx, n, target, reason)
        except BaseException:
            target.health.on_abandon(ticket=ticket)
            raise
        record = AttemptRecord(
            n,
            target.route_id,
            target.deployment.id,
            time.monotonic(),
            ticket=ticket,
            reason=reason,
            provider_name=target.deployment.provider_name,
        )
        ctx.attempts.append(record)
        return record

    def _saturated(self, ctx: RequestContext, target: RouteTarget, reason: str) -> None:
        """A target skipped because its capacity was taken: quota-group RPM/TPM, or its in-flight
        and half-open probe slots."""
        if self.metrics is not None:
            self.metrics.route_saturation.child(ctx.plan.name, target.route_id, reason).inc()

    @staticmethod
    def _settled(ctx: RequestContext, record: AttemptRecord) -> None:
        """A committed stream settles later, in ``CommittedStream.aclose``; everything else here."""
        if ctx.audit is not None:
            ctx.audit.attempt_finished(ctx, record)

    @staticmethod
    def _fail(plan: AliasPlan, target: RouteTarget, record: AttemptRecord, err: UpstreamError) -> None:
        record.outcome, record.ended = "error", time.monotonic()
        record.error_category = err.category.value
        record.upstream_status = err.status or record.upstream_status
        counts = affects_health(err)
        target.health.on_failure(counts=counts, ticket=record.ticket)
        if counts and plan.outlier is not None:
            group = plan.group_of(target)
            if len(group) > 1:
                eject_outliers([t.health for t in group], plan.outlier)

    @staticmethod
    def _final(plan: AliasPlan, walk: _Walk) -> GatewayError:
        """The client's error when the walk found no answer: the last attempt's; else, when a
        deferral kept every target out, a 429 or 503 with the time left; else unavailable."""
        if walk.last_error is not None:
            return walk.last_error.to_gateway_error()
        if walk.saturated:
            return RateLimited("The provider capacity approved for this model is in use. Retry shortly.", retry_after=1)
        deferred = [t.health for g in plan.groups for t in g if t.health.deferred_for() > 0]
        if deferred:
            first = min(deferred, key=lambda h: h.deferred_until)
            wait = first.deferred_for()
            if first.deferred_rate_limited:
                return RateLimited("The model is rate limited. Retry later.", retry_after=wait)
            return ModelUnavailable(retry_after=wait)
        return ModelUnavailable()
