"""The HTTP surface: ``GET /v1/models``, ``POST /v1/chat/completions``, health, errors.

Handlers parse, call the runtime, and render. They are plain Starlette endpoints, and
``create_app`` mounts them on a bare Starlette application, so the Lambda entrypoints and server
mode share one app. FastAPI is deliberately not used here: it adds two middleware layers to every
request (every SSE frame passes through their ``send`` wrappers) and about 200 ms of imports to a
Lambda cold start (``fastapi.openapi.models``), for routing and OpenAPI features this surface does
not use (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tollway.api.chat_request import parse_body, to_canonical
from tollway.api.chat_response import ChunkRenderer, render_completion
from tollway.api.errors import error_body, error_headers
from tollway.audit.pipeline import AuditPipeline, external_shipper
from tollway.canonical import (
    CanonicalRequest,
    StreamFinish,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageEvidence,
    estimate_request_tokens,
    estimate_tokens,
)
from tollway.config.root import PublishedRoot
from tollway.exceptions import (
    AuthenticationFailed,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    ModelUnavailable,
    PermissionDenied,
    RequestTooLarge,
    UnsupportedMediaType,
    UpstreamError,
)
from tollway.gateway import CommittedStream, RequestContext
from tollway.governance.meter import Admitted, CostRecord
from tollway.governance.principals import Principal, authenticate
from tollway.metering.query import ADMIN_ROLE
from tollway.routing.plan import AliasPlan
from tollway.server.runtime import GatewayRuntime
from tollway.server.streaming import SseResponse

__all__ = ["create_app"]

access_log = logging.getLogger("tollway.access")
log = logging.getLogger("tollway.server")

_JSON = "application/json"


class RequestIdMiddleware:
    """Gives every request an id and puts ``x-request-id`` on every response, errors included.

    It is also where an unexpected exception stops. Starlette's outermost error middleware sends
    its 500 and then re-raises, and uvicorn answers a raised exception by closing the connection,
    so a client's next request on a kept-alive connection would meet a reset. Here an exception
    before the response started becomes the 500 envelope, one after the response completed is
    only logged, and only one in the middle of a body (nothing else can be said then) goes on.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = "req_" + secrets.token_hex(12)
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())
        progress = [False, False]  # started, completed

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
                progress[0] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                progress[1] = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if progress[0] and not progress[1]:
                raise
            log.exception("unhandled error (request %s)", rid)
            if not progress[0]:
                await _error(GatewayError())(scope, receive, send_with_id)


def _error(err: GatewayError) -> Response:
    return Response(error_body(err), status_code=err.status, media_type=_JSON, headers=error_headers(err))


def _runtime(request: Request) -> GatewayRuntime:
    runtime: GatewayRuntime = request.app.state.runtime
    return runtime


def _authenticate(request: Request, root: PublishedRoot) -> Principal:
    """The caller's principal. Two ``Authorization`` headers are refused, not resolved by order:
    a proxy that adds one in front of the client's would otherwise decide who the caller is."""
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        request.app.state.counters.unauthenticated += 1
        raise AuthenticationFailed("Send exactly one Authorization header.")
    try:
        return authenticate(values[0] if values else None, root.keys)
    except AuthenticationFailed:
        request.app.state.counters.unauthenticated += 1
        raise


class _Counters:
    """Answers that leave no audit record of their own, counted per process for ``/healthz``."""

    __slots__ = ("unauthenticated",)

    def __init__(self) -> None:
        self.unauthenticated = 0
        """401s: an unauthenticated caller has no principal to record a request under."""


async def _read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise InvalidRequest("Invalid Content-Length header.")
        if int(length) > max_bytes:
            raise RequestTooLarge(f"The request body exceeds {max_bytes} bytes.")
    encoding = request.headers.get("content-encoding")
    if encoding and encoding.lower() != "identity":
        raise UnsupportedMediaType("Content-Encoding is not supported; send an uncompressed body.")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise RequestTooLarge(f"The request body exceeds {max_bytes} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        err = InvalidRequest("The request body was not received in time.")
        err.status = 408
        err.code = "request_timeout"
        raise err from None
    return b"".join(chunks)


class _ClientGone(Exception):
    """The client disconnected while the gateway was still waiting on the provider."""


@contextlib.asynccontextmanager
async def _cancel_on_disconnect(request: Request) -> AsyncIterator[None]:
    """Cancel the enclosed upstream work as soon as the client disconnects.

    One watcher task per request (not per chunk). The body has been read, so the next ASGI
    message can only be ``http.disconnect``. Cancelling the request's own task unwinds the
    attempt, which closes the upstream connection.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise _ClientGone from None
        raise
    finally:
        watcher.cancel()


def _check_eligibility(principal: Principal, plan: AliasPlan) -> None:
    """Data class and region are hard rules: refuse before any provider work, never route around them."""
    if principal.data_class is not None and principal.data_class not in plan.data_classes:
        raise PermissionDenied("This model is not approved for your data classification.")
    if not plan.serves(principal.regions):
        raise PermissionDenied("No deployment of this model is approved for your regions.")


def _check_content_type(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != _JSON:
        raise UnsupportedMediaType()


def _log_access(ctx: RequestContext | None, principal: Principal | None, status: int, stream: bool, rid: str) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    record: dict[str, Any] = {"request_id": rid, "status": status, "stream": stream}
    if principal is not None:
        record["principal"] = principal.id
        record["tenant"] = principal.tenant
    if ctx is not None:
        record["alias"] = ctx.plan.name
        record["duration_ms"] = round((time.monotonic() - ctx.received) * 1000, 2)
        record["attempts"] = [(a.route_id, a.outcome, a.error_category) for a in ctx.attempts]
        if ctx.usage is not None:
            record["usage"] = [ctx.usage.prompt_tokens, ctx.usage.completion_tokens, ctx.usage.evidence.value]
    access_log.info(orjson.dumps(record).decode())


async def _finish(
    runtime: GatewayRuntime,
    ctx: RequestContext | None,
    principal: Principal | None,
    rid: str,
    status: int,
    code: str | None,
    stream: bool,
    admitted_at: float,
    alias: str | None = None,
    *,
    commit: bool = False,
) -> None:
    """The one end of every chat request: settle its reservation, write the access-log line, then
    the audit trail's terminal event when the request was admitted to it (``admitted_at`` is set
    once its first event is in), or a ``request_rejected`` event when an authenticated request was
    refused with a 4xx before that. A shed for overload is counted by admission instead: shedding
    must cost less than serving, so it writes nothing; nor does a 503 from the budget store or the
    WAL itself."""
    cost: CostRecord | None = None
    if ctx is not None and (ctx.governance is not None or ctx.root.pricing.snapshot is not None):
        last = ctx.attempts[-1].route_id if ctx.attempts else None
        billable = any(a.outcome != "error" or a.upstream_status is None for a in ctx.attempts)
        cost = runtime.governor.settle(ctx.governance, ctx.root.pricing, last, ctx.usage, billable)
    _log_access(ctx, principal, status, stream, rid)
    audit = runtime.audit.recorder if runtime.audit is not None else None
    if audit is None:
        return
    if ctx is not None and admitted_at:
        await audit.request_finished(
            ctx, status=status, error_code=code, stream=stream, admitted_at=admitted_at, cost=cost, commit=commit
        )
    elif principal is not None and code is not None and status < 500 and code != "overloaded":
        audit.request_rejected(
            request_id=rid,
            principal=principal,
            alias=ctx.plan.name if ctx is not None else alias,
            status=status,
            code=code,
            stream=stream if alias is not None or ctx is not None else None,
            root_digest=runtime.holder.root.digest if ctx is None else ctx.root.digest,
        )


async def _admit_budget(
    runtime: GatewayRuntime, root: PublishedRoot, key_id: str, plan: AliasPlan, creq: CanonicalRequest, stream: bool
) -> tuple[Admitted | None, int]:
    """Reserve the request's tokens and cost (after the parse, before any provider work), against
    the root the request captured at admission."""
    gov = root.governance
    policy = gov.policy(key_id, plan.name)
    if policy.max_output_tokens is not None:
        if creq.max_output_tokens is not None and creq.max_output_tokens > policy.max_output_tokens:
            raise InvalidRequest(
                f"'max_tokens' exceeds your limit of {policy.max_output_tokens} output tokens for this model.",
                param="max_tokens",
            )
        if creq.max_output_tokens is None:
            creq.max_output_tokens = min(plan.default_max_output_tokens, policy.max_output_tokens)
    input_tokens = estimate_request_tokens(creq)
    if policy.max_input_tokens is not None and input_tokens > policy.max_input_tokens:
        err = InvalidRequest(
            f"The messages exceed your limit of {policy.max_input_tokens} input tokens for this model."
        )
        err.code = "context_length_exceeded"
        raise err
    if creq.max_output_tokens is None and not policy.empty:
        # What is reserved is what the provider is allowed: without an explicit limit some formats
        # send none, and the answer could outgrow its reservation.
        creq.max_output_tokens = plan.default_max_output_tokens
    max_output = creq.max_output_tokens or plan.default_max_output_tokens
    admitted = await runtime.governor.admit(
        gov,
        root.pricing,
        key_id,
        plan.name,
        input_tokens=input_tokens,
        max_output_tokens=max_output,
        stream=stream,
    )
    return admitted, input_tokens + max_output


def _model_not_found(model: str) -> ModelNotFound:
    """The same answer for an alias that does not exist and one the caller may not see."""
    return ModelNotFound(f"The model '{model[:200]}' does not exist or you do not have access to it.")


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tollway"}


async def list_models(request: Request) -> Response:
    root = _runtime(request).holder.root
    try:
        principal = _authenticate(request, root)
    except GatewayError as err:
        return _error(err)
    data = [_model_object(name) for name in root.aliases if principal.may_use(name)]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type=_JSON)


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: one of the caller's aliases (the SDKs' ``models.retrieve``)."""
    root = _runtime(request).holder.root
    model: str = request.path_params["model"]
    try:
        principal = _authenticate(request, root)
        if model not in root.aliases or not principal.may_use(model):
            raise _model_not_found(model)
    except GatewayError as err:
        return _error(err)
    return Response(orjson.dumps(_model_object(model)), media_type=_JSON)


async def chat_completions(request: Request) -> Response:
    runtime = _runtime(request)
    root = runtime.holder.root
    rid: str = request.scope["state"]["request_id"]
    audit = runtime.audit.recorder if runtime.audit is not None else None
    governed = runtime.gateway.governor is not None and (root.governance.enabled or root.pricing.snapshot is not None)
    principal: Principal | None = None
    ctx: RequestContext | None = None
    alias: str | None = None
    stream = False
    admitted = False
    admitted_at = 0.0
    try:
        principal = _authenticate(request, root)
        _check_content_type(request)
        await runtime.admission.enter(root)
        admitted = True
        raw = await _read_body(request, root.limits.max_request_body_bytes, root.limits.body_read_timeout_s)
        env = parse_body(raw)
        plan = root.aliases.get(env.model)
        if plan is None or not principal.may_use(env.model):
            raise _model_not_found(env.model)
        alias = plan.name
        _check_eligibility(principal, plan)
        creq = to_canonical(env, plan)
        if creq.stream:
            runtime.admission.acquire_stream(root)
            stream = True
        loop = asyncio.get_running_loop()
        session_id = request.headers.get(root.limits.session_header)
        ctx = RequestContext(
            request_id=rid,
            principal=principal,
            root=root,
            plan=plan,
            deadline=loop.time() + root.limits.request_timeout_s,
            session_id=session_id[:128] if session_id else None,
            audit=audit,
        )
        if governed:
            ctx.governance, ctx.reserved_tokens = await _admit_budget(
                runtime, root, principal.key_id, plan, creq, stream
            )
        if audit is not None:
            audit.admitted(ctx, stream=stream)  # before any provider work: a full or dead WAL is a 503 here
            admitted_at = time.monotonic()
        created = int(time.time())
        response_id = "chatcmpl-" + rid[4:]
        if stream:
            async with _cancel_on_disconnect(request):
                committed = await runtime.gateway.open_stream(ctx, creq)
            renderer = ChunkRenderer(response_id, created, ctx.response_model, creq.include_usage)
            admitted = False  # the stream session releases from here on
            session = _StreamSession(runtime, ctx, committed, renderer, creq.include_usage, admitted_at)
            return SseResponse(
                session.frames(),
                on_close=session.close,
                headers={},
                write_timeout_s=root.limits.downstream_write_timeout_s,
                lifetime_s=root.limits.max_stream_lifetime_s,
                lifetime_frame=ChunkRenderer.error(DeadlineExceeded("The stream exceeded its maximum lifetime.")),
                min_drain_bytes_per_s=root.limits.min_drain_bytes_per_s,
                drain_grace_s=root.limits.drain_grace_s,
            )
        async with _cancel_on_disconnect(request):
            result = await runtime.gateway.complete(ctx, creq)
        body = render_completion(response_id, created, ctx.response_model, result)
        await _finish(runtime, ctx, principal, rid, 200, None, False, admitted_at)
        return Response(body, media_type=_JSON)
    except GatewayError as err:
        await _finish(runtime, ctx, principal, rid, err.status, err.code, stream, admitted_at, alias)
        return _error(err)
    except (ClientDisconnect, _ClientGone):
        await _finish(runtime, ctx, principal, rid, 499, None, stream, admitted_at)
        return Response(status_code=499)
    finally:
        if admitted:
            runtime.admission.release(stream)


class _StreamSession:
    """One committed stream's frames and its cleanup, which runs exactly once.

    Cleanup is not left to the frame generator's ``finally``: a generator that never
    started (the client left before the first write) would never run it.
    """

    __slots__ = (
        "_admitted_at",
        "_closed",
        "_code",
        "_committed",
        "_ctx",
        "_error",
        "_hold_done",
        "_include_usage",
        "_renderer",
        "_runtime",
        "_status",
    )

    def __init__(
        self,
        runtime: GatewayRuntime,
        ctx: RequestContext,
        committed: CommittedStream,
        renderer: ChunkRenderer,
        include_usage: bool,
        admitted_at: float,
    ) -> None:
        self._admitted_at = admitted_at
        self._runtime = runtime
        self._ctx = ctx
        self._committed = committed
        self._renderer = renderer
        self._include_usage = include_usage
        self._error: BaseException | None = None
        self._status = 499
        self._code: str | None = None
        self._closed = False
        cfg = runtime.audit_config
        self._hold_done = admitted_at > 0 and cfg.durability == "local-durable" and cfg.terminalCommitBeforeDone
        """``terminalCommitBeforeDone``: the request is finished, and its terminal event durable,
        before ``[DONE]`` leaves; a client that saw ``[DONE]`` has a complete audit record."""

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """The client's frames. The finish frame is held back and leaves in one write with the
        usage and ``[DONE]`` frames: providers send those back to back, and each write is a
        syscall the loop pays for."""
        renderer = self._renderer
        held = b""
        try:
            async for ev in self._committed.events():
                if isinstance(ev, TextDelta):
                    yield held + renderer.text(ev.text)
                    held = b""
                elif isinstance(ev, ToolCallDelta):
                    yield held + renderer.tool_call(ev)
                    held = b""
                elif isinstance(ev, StreamFinish):
                    held += renderer.finish(ev.reason)
            if self._include_usage:
                usage = self._ctx.usage or Usage(
                    completion_tokens=estimate_tokens(self._committed.output_chars),
                    evidence=UsageEvidence.LOCAL_ESTIMATE,
                )
                held += renderer.usage(usage)
            if self._hold_done:
                self._status = 200
                await asyncio.shield(self.close())  # a disconnect now must not cut the commit short
            yield held + renderer.done
            self._status = 200
        except UpstreamError as exc:
            err = exc.to_stream_error()
            self._error, self._status, self._code = exc, err.status, err.code
            yield held + renderer.error(err)
        except BaseException as exc:
            self._error = exc
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._committed.aclose(self._error)
        finally:
            self._runtime.admission.release(True)
            ctx = self._ctx
            await _finish(
                self._runtime,
                ctx,
                ctx.principal,
                ctx.request_id,
                self._status,
                self._code,
                True,
                self._admitted_at,
                commit=self._hold_done and self._status == 200,
            )


async def usage(request: Request) -> Response:
    """``GET /v1/usage?from=&to=&group_by=``: the caller's own usage, its tenant's with the admin role."""
    from datetime import UTC, datetime

    from tollway.metering import (
        InvalidUsageQuery,
        UsageLedgerUnavailable,
        caller_scope,
        parse_usage_query,
        usage_response,
    )

    runtime = _runtime(request)
    try:
        principal = _authenticate(request, runtime.holder.root)
        try:
            query = parse_usage_query(
                dict(request.query_params), scope=caller_scope(principal), today=datetime.now(UTC).date()
            )
        except InvalidUsageQuery as exc:
            raise InvalidRequest(str(exc)) from None
        ledger = runtime.usage_ledger()
        if ledger is None:
            err = ModelUnavailable("Usage reporting is not configured on this gateway.")
            err.code = "usage_unavailable"
            raise err
        try:
            rows = await asyncio.to_thread(ledger.query, query)
        except UsageLedgerUnavailable:
            err = ModelUnavailable("The usage ledger cannot be read right now. Retry shortly.", retry_after=1)
            err.code = "usage_unavailable"
            raise err from None
    except GatewayError as err:
        return _error(err)
    return Response(orjson.dumps(usage_response(query, rows)), media_type=_JSON)


async def admin_routes(request: Request) -> Response:
    """``GET /admin/v1/routes``: read-only runtime state per alias plan, for principals with the
    admin role. Route and deployment ids, strategy, circuit state, in-flight counts and EWMA
    figures; never a URL, a credential or a physical model name beyond the configured id."""
    runtime = _runtime(request)
    root = runtime.holder.root
    try:
        principal = _authenticate(request, root)
        if ADMIN_ROLE not in principal.roles:
            raise PermissionDenied("This endpoint needs the admin role.")
    except GatewayError as err:
        return _error(err)
    aliases = []
    for name, plan in root.aliases.items():
        groups = [
            [
                {
                    "route": t.route_id,
                    "deployment": t.deployment.id,
                    "priority": t.priority,
                    "weight": t.weight,
                    "health": t.health.snapshot(),
                }
                for t in group
            ]
            for group in plan.groups
        ]
        aliases.append({"alias": name, "strategy": plan.strategy.name, "groups": groups})
    body = {"object": "list", "generation": root.generation, "data": aliases}
    return Response(orjson.dumps(body), media_type=_JSON)


async def healthz(request: Request) -> Response:
    runtime = _runtime(request)
    root = runtime.holder.root
    body = {
        "status": "ok",
        "generation": root.generation,
        "digest": root.digest[:12],
        "pid": os.getpid(),
        "in_flight": {"requests": runtime.admission.requests, "streams": runtime.admission.streams},
        "loop_lag_ms": round(runtime.admission.loop_lag_s * 1000, 1),
        "shed_for_loop_lag": runtime.admission.shed_lag,
        "unauthenticated": request.app.state.counters.unauthenticated,
    }
    if runtime.audit is not None:
        body["audit"] = runtime.audit.stats()
    return Response(orjson.dumps(body), media_type=_JSON)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        err: GatewayError = InvalidRequest("Unknown path.")
        err.status, err.code = 404, "not_found"
    elif status == 405:
        err = InvalidRequest("Method not allowed.")
        err.status, err.code = 405, "method_not_allowed"
    else:
        err = GatewayError()
    return _error(err)


def freeze_startup_heap(*, collect: bool) -> None:
    """Move everything alive after start-up into the collector's permanent generation.

    The modules, config root, codecs and pools built at start-up are some 50,000 objects that live
    as long as the process. Left in the oldest generation, every full collection walks all of
    them: 20-30 ms with the loop stopped, which lands in the tail latency of every request in
    flight. Frozen, a full collection walks only what requests left behind (docs/benchmarks.md).
    ``collect`` first frees start-up garbage so it is not frozen with the rest; it costs a few
    tens of milliseconds once, so Lambda's cold start skips it.
    """
    if collect:
        gc.collect()
    gc.freeze()


def create_app(config_path: str | Path | None = None, *, watch_interval_s: float | None = 1.0) -> Any:
    """Build the gateway ASGI app for ``config_path`` (default: ``$TOLLWAY_CONFIG``)."""
    from starlette.applications import Starlette

    path = Path(config_path or os.environ.get("TOLLWAY_CONFIG", ""))
    if not str(path):
        raise RuntimeError("no config: pass config_path or set TOLLWAY_CONFIG")
    runtime = GatewayRuntime.load(path)
    on_lambda = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))
    # On Lambda the WAL-shipper extension ships, under tollway serve its ship process; a task of
    # this process does only when the app runs under some other server.
    runtime.audit = AuditPipeline.open(runtime.audit_config, ship=not external_shipper())

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Future[Any]] = []
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, lambda: tasks.append(asyncio.ensure_future(runtime.reload())))
        if watch_interval_s:
            tasks.append(asyncio.ensure_future(runtime.watch(watch_interval_s)))
        if runtime.governance_config.pricing.bucket:
            tasks.append(asyncio.ensure_future(runtime.watch_pricing()))
        if runtime.audit is not None:
            # On Lambda the loop runs only during an invoke, and the extension ships at the
            # invoke's end: the WAL must be written by then, so the writer thread keeps it.
            runtime.audit.start(write_on_loop=not on_lambda)
        await runtime.warm()
        freeze_startup_heap(collect=not on_lambda)
        if not on_lambda:
            # On Lambda one environment serves one request at a time and is frozen between
            # invocations, so a lag sample would measure the freeze; concurrency is the limit there.
            tasks.append(asyncio.ensure_future(runtime.admission.monitor_loop_lag()))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGHUP)
            for t in tasks:
                t.cancel()
            if runtime.audit is not None:
                await runtime.audit.aclose()
            await runtime.aclose()

    app = Starlette(
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.runtime = runtime
    app.state.counters = _Counters()
    # A path with a trailing slash is a 404 like any unknown path: Starlette's redirect would build
    # its Location from the client's Host header.
    app.router.redirect_slashes = False
    prefix = runtime.holder.root.limits.path_prefix  # routes are fixed at start; a reload cannot move them
    app.router.add_route(f"{prefix}/models", list_models, methods=["GET"])
    app.router.add_route(f"{prefix}/models/{{model:path}}", retrieve_model, methods=["GET"])
    app.router.add_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])
    app.router.add_route(f"{prefix}/usage", usage, methods=["GET"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/admin/v1/routes", admin_routes, methods=["GET"])
    cors = runtime.cors_config
    if cors.allowedOrigins:  # off by default, and then no layer at all
        from tollway.server.cors import install_cors

        install_cors(app, cors)
    app.add_middleware(RequestIdMiddleware)
    return app
