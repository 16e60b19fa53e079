"""The protocol-neutral runtime: an authenticated request context plus a canonical request in,
a canonical response or a stream of semantic events out.

``Gateway.complete`` and ``Gateway.open_stream`` walk the alias plan under one attempt budget
(count and deadline). A retryable failure before the first semantic event moves to the next
target; a stream is *committed* as soon as its first semantic event is in hand, and nothing
moves after that. Handlers render; they never decide routing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from tollway.canonical import (
    SEMANTIC_EVENTS,
    CanonicalRequest,
    CanonicalResponse,
    StreamEvent,
    StreamFinish,
    StreamUsage,
    Usage,
    UsageEvidence,
    estimate_request_tokens,
    estimate_tokens,
)
from tollway.config.root import PublishedRoot
from tollway.exceptions import GatewayError, ModelUnavailable, RateLimited, UpstreamCategory, UpstreamError
from tollway.governance.meter import Admitted, Governor
from tollway.governance.principals import Principal
from tollway.routing.health import eject_outliers
from tollway.routing.plan import AliasPlan, RouteTarget
from tollway.routing.strategies import SelectionInput
from tollway.sse import SseFrameTooLarge, aiter_sse

__all__ = ["AttemptRecord", "CommittedStream", "Gateway", "RequestContext"]

_T = TypeVar("_T")
_SHARED_RNG = random.Random()

_HEALTH_NEUTRAL = frozenset(
    {
        UpstreamCategory.INVALID_REQUEST,
        UpstreamCategory.CONTEXT_LENGTH,
        UpstreamCategory.SAFETY,
        UpstreamCategory.RATE_LIMIT,
    }
)


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


class AttemptAudit(Protocol):
    """What the attempt loop tells the audit trail (``tollway.audit.recorder.AuditRecorder``)."""

    async def attempt_started(
        self, ctx: RequestContext, number: int, target: RouteTarget, reason: Literal["first", "retry", "fallback"]
    ) -> None: ...

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
    reserved_tokens: int = 0
    route_bucket: str | None = None
    """The canary/A-B bucket the route decision put the request in (audited with each attempt)."""
    """The input estimate plus the maximum output: what a dispatch takes from its quota group's TPM."""


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
        self.output_chars = 0

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Every event after commitment; raises ``UpstreamError`` on a midstream failure."""
        for ev in self._prelude:
            yield self._observe(ev)
        self._prelude = []
        try:
            async for ev in self._rest:
                yield self._observe(ev)
        except SseFrameTooLarge:
            raise UpstreamError(UpstreamCategory.MALFORMED, detail="stream frame too large") from None
        self._finished = True

    def _observe(self, ev: StreamEvent) -> StreamEvent:
        if isinstance(ev, StreamUsage):
            self._ctx.usage = ev.usage
        elif isinstance(ev, SEMANTIC_EVENTS):
            self.output_chars += len(getattr(ev, "text", "") or getattr(ev, "arguments", ""))
        return ev

    async def aclose(self, error: BaseException | None = None) -> None:
        """Close the upstream call (cancelling it if still open) and settle the attempt."""
        attempt, health = self._attempt, self._target.health
        attempt.ended = time.monotonic()
        if self._finished and error is None:
            attempt.outcome = "ok"
            health.on_success(attempt.ended - attempt.started, ticket=attempt.ticket)
        elif isinstance(error, UpstreamError):
            attempt.outcome = "midstream_error"
            attempt.error_category = error.category.value
            health.on_failure(counts=error.category not in _HEALTH_NEUTRAL, ticket=attempt.ticket)
        else:
            attempt.outcome = "cancelled"
            health.on_abandon(ticket=attempt.ticket)
        if self._ctx.usage is None:
            self._ctx.usage = Usage(
                prompt_tokens=0,
                completion_tokens=estimate_tokens(self.output_chars),
                evidence=UsageEvidence.LOCAL_ESTIMATE,
            )
        if self._ctx.audit is not None:
            self._ctx.audit.attempt_finished(self._ctx, attempt)
        await self._stack.aclose()


async def _prelude(events: AsyncIterator[StreamEvent], deadline: float) -> list[StreamEvent]:
    """The events up to and including the first semantic one (the commit point), by ``deadline``:
    a provider that stalls before its first token fails the attempt as a timeout, so the request
    can still fall back."""
    prelude: list[StreamEvent] = []
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                ev = await anext(events)
                prelude.append(ev)
                if isinstance(ev, (*SEMANTIC_EVENTS, StreamFinish)):
                    return prelude
    except StopAsyncIteration:
        raise UpstreamError(UpstreamCategory.MALFORMED, detail="stream ended before output") from None
    except SseFrameTooLarge:
        raise UpstreamError(UpstreamCategory.MALFORMED, detail="stream frame too large") from None
    except TimeoutError:
        raise UpstreamError(UpstreamCategory.TIMEOUT, detail="stream setup deadline") from None


class Gateway:
    """Executes requests against the targets of their alias plan."""

    def __init__(
        self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, governor: Governor | None = None
    ) -> None:
        self._sleep = sleep
        self.governor = governor
        """Takes each target's quota-group capacity before dispatch (``None``: no capacity limits)."""

    async def complete(self, ctx: RequestContext, req: CanonicalRequest) -> CanonicalResponse:
        async def attempt(target: RouteTarget, record: AttemptRecord) -> CanonicalResponse:
            upstream = target.deployment.codec.encode_request(req, target.target)
            timing = record if ctx.audit is not None else None
            status, headers, body = await target.deployment.transport.send(upstream, timing)
            if status >= 400:
                raise target.deployment.codec.decode_error(status, headers, body)
            record.upstream_status = status
            return target.deployment.codec.decode_response(status, body)

        response = await self._run(ctx, attempt)
        if response.usage is None:
            response.usage = Usage(
                prompt_tokens=estimate_request_tokens(req),
                completion_tokens=estimate_tokens(len(response.content or "")),
                evidence=UsageEvidence.LOCAL_ESTIMATE,
            )
        ctx.usage = response.usage
        return response

    async def open_stream(self, ctx: RequestContext, req: CanonicalRequest) -> CommittedStream:
        async def attempt(target: RouteTarget, record: AttemptRecord) -> CommittedStream:
            setup_deadline = asyncio.get_running_loop().time() + ctx.root.limits.stream_setup_timeout_s
            codec = target.deployment.codec
            upstream = codec.encode_request(req, target.target)
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
                events = codec.decode_stream(aiter_sse(response.aiter_bytes())).__aiter__()
                prelude = await _prelude(events, setup_deadline)
            except BaseException:
                await stack.aclose()
                raise
            record.first_event_s = time.monotonic() - record.started
            target.health.observe_ttft(record.first_event_s)
            return CommittedStream(ctx, target, record, stack, prelude, events)

        return await self._run(ctx, attempt, commits=True)

    async def _run(
        self,
        ctx: RequestContext,
        attempt: Callable[[RouteTarget, AttemptRecord], Awaitable[_T]],
        *,
        commits: bool = False,
    ) -> _T:
        """Walk the plan under one attempt budget; return the first success."""
        plan = ctx.plan
        selection = SelectionInput(ctx.principal.id, ctx.session_id, ctx.request_id)
        last_error: UpstreamError | None = None
        failed_at: dict[str, float | None] = {}
        limited_accounts: dict[str, str] = {}
        """Provider account → the deployment it answered 429 on: its other deployments are skipped."""
        saturated = False
        n = 0
        while n < plan.retry.max_attempts:
            decision = plan.decide(selection, ctx.rng, ctx.principal.regions)
            ctx.route_bucket = decision.bucket
            order = decision.targets
            if not order:
                break
            before = n
            for target in order:
                if n >= plan.retry.max_attempts:
                    break
                blocked = await self._blocked(ctx, target, limited_accounts)
                if blocked:
                    saturated = saturated or blocked == "capacity"
                    continue
                if target.deployment.id in failed_at:
                    await self._backoff(ctx, n, failed_at[target.deployment.id], last_error)
                record = await self._begin(ctx, n + 1, target, target.deployment.id in failed_at)
                if record is None:
                    continue  # lost the race for a half-open probe slot or an in-flight permit
                n += 1
                try:
                    async with asyncio.timeout_at(ctx.deadline):
                        result = await attempt(target, record)
                except UpstreamError as upstream_error:
                    self._fail(plan, target, record, upstream_error)
                    self._settled(ctx, record)
                    last_error = upstream_error
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
                    if not commits:
                        record.outcome, record.ended = "ok", time.monotonic()
                        target.health.on_success(record.ended - record.started, ticket=record.ticket)
                        self._settled(ctx, record)
                    return result
                self._after_failure(last_error, target, plan, failed_at, limited_accounts)
            if n == before:
                break  # every target was skipped: nothing left to try
        if saturated and last_error is None:
            raise RateLimited("The provider capacity approved for this model is in use. Retry shortly.", retry_after=1)
        raise self._final(last_error)

    async def _backoff(
        self, ctx: RequestContext, n: int, retry_after: float | None, last_error: UpstreamError | None
    ) -> None:
        """Wait before trying a target again; give up when the wait would pass the deadline."""
        delay = ctx.plan.retry.backoff(n, retry_after, ctx.rng)
        if asyncio.get_running_loop().time() + delay >= ctx.deadline:
            raise self._final(last_error)
        if delay > 0:
            await self._sleep(delay)

    async def _blocked(
        self, ctx: RequestContext, target: RouteTarget, limited_accounts: dict[str, str]
    ) -> Literal["", "account", "capacity"]:
        """Why ``target`` is skipped: its account answered 429 on another of its deployments (that
        is the same capacity under another name, never a way around the limit), or its quota group
        is at its approved RPM/TPM. Otherwise its capacity is taken."""
        dep = target.deployment
        if limited_accounts.get(dep.provider_account_id, dep.id) != dep.id:
            return "account"
        governor = self.governor
        gov = ctx.root.governance
        capacity = gov.capacity.get(dep.quota_group_id) if governor is not None else None
        if capacity and governor is not None:
            if not await governor.take_capacity(ctx.governance, capacity, ctx.reserved_tokens, gov.lease_wait_s):
                return "capacity"
        return ""

    def _after_failure(
        self,
        err: UpstreamError,
        target: RouteTarget,
        plan: AliasPlan,
        failed_at: dict[str, float | None],
        limited_accounts: dict[str, str],
    ) -> None:
        if not self._retryable(err, plan):
            raise err.to_gateway_error()
        failed_at[target.deployment.id] = err.retry_after
        if err.category is UpstreamCategory.RATE_LIMIT:
            limited_accounts.setdefault(target.deployment.provider_account_id, target.deployment.id)

    async def _begin(self, ctx: RequestContext, n: int, target: RouteTarget, retried: bool) -> AttemptRecord | None:
        """Take the target's health ticket and record the attempt's start (under local-durable,
        durably) before anything is sent; ``None`` when the target refuses the attempt."""
        ticket = target.health.try_start()
        if ticket is None:
            return None
        try:
            await self._audit_start(ctx, n, target, retried)
        except BaseException:
            target.health.on_abandon(ticket=ticket)
            raise
        record = AttemptRecord(n, target.route_id, target.deployment.id, time.monotonic(), ticket=ticket)
        ctx.attempts.append(record)
        return record

    @staticmethod
    async def _audit_start(ctx: RequestContext, n: int, target: RouteTarget, tried_before: bool) -> None:
        """Before dispatch: under local-durable this waits for the durable watermark, and an
        audit failure here fails the request with nothing sent upstream."""
        if ctx.audit is not None:
            reason: Literal["first", "retry", "fallback"] = (
                "first" if n == 1 else ("retry" if tried_before else "fallback")
            )
            await ctx.audit.attempt_started(ctx, n, target, reason)

    @staticmethod
    def _settled(ctx: RequestContext, record: AttemptRecord) -> None:
        """A committed stream settles later, in ``CommittedStream.aclose``; everything else here."""
        if ctx.audit is not None:
            ctx.audit.attempt_finished(ctx, record)

    @staticmethod
    def _retryable(err: UpstreamError, plan: AliasPlan) -> bool:
        if not err.retryable:
            return False
        return err.status is None or err.status in plan.retry.retry_statuses or err.status < 400

    @staticmethod
    def _fail(plan: AliasPlan, target: RouteTarget, record: AttemptRecord, err: UpstreamError) -> None:
        record.outcome, record.ended = "error", time.monotonic()
        record.error_category = err.category.value
        record.upstream_status = err.status or record.upstream_status
        counts = err.category not in _HEALTH_NEUTRAL
        target.health.on_failure(counts=counts, ticket=record.ticket)
        if counts and plan.outlier is not None:
            group = plan.group_of(target)
            if len(group) > 1:
                eject_outliers([t.health for t in group], plan.outlier)

    @staticmethod
    def _final(last_error: UpstreamError | None) -> GatewayError:
        if last_error is None:
            return ModelUnavailable()
        return last_error.to_gateway_error()
