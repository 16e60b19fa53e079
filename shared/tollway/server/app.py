"""The gateway's ASGI application: its routes, the request-id middleware, and start-up.

The routes (``tollway.server.routes``) parse, hand the request to the pipeline
(``tollway.pipeline``) and render what it returns. They are plain Starlette endpoints on a bare
Starlette application, so the Lambda entrypoints and server mode share one app. FastAPI is
deliberately not used: it adds two middleware layers to every request (every SSE frame passes
through their ``send`` wrappers) and 250-320 ms of imports to a Lambda cold start
(``fastapi.openapi.models``), for routing and OpenAPI features this surface does not use
(docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tollway.audit.pipeline import AuditPipeline, external_shipper
from tollway.exceptions import GatewayError, MethodNotAllowed, NotFound
from tollway.server.http import error_response
from tollway.server.observe import metrics_endpoint, start_sampler
from tollway.server.routes import admin, chat, embeddings, health, messages, models, responses, usage
from tollway.server.runtime import GatewayRuntime
from tollway.telemetry.logs import bind_request, reset_request

__all__ = ["create_app"]

log = logging.getLogger("tollway.server")


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

        tokens = bind_request(rid)  # every log line of this request carries its id (and trace id)
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if progress[0] and not progress[1]:
                raise
            log.exception("unhandled error (request %s)", rid)
            if not progress[0]:
                await error_response(GatewayError())(scope, receive, send_with_id)
        finally:
            reset_request(tokens)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        return error_response(NotFound("Unknown path."))
    if status == 405:
        return error_response(MethodNotAllowed("Method not allowed."))
    return error_response(GatewayError())


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
    runtime.attach_audit(AuditPipeline.open(runtime.audit_config, ship=not external_shipper()))

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
        if on_lambda and runtime.metrics is not None:
            # Under the Web Adapter the app is a server Lambda freezes between requests: its metrics
            # leave as CloudWatch EMF every 10 s of run time, and once more at shutdown.
            from tollway.telemetry.emf import EmfFlusher

            tasks.append(asyncio.ensure_future(EmfFlusher(runtime.metrics).run_periodic(10.0)))
        freeze_startup_heap(collect=not on_lambda)
        if not on_lambda:
            # On Lambda one environment serves one request at a time and is frozen between
            # invocations, so a lag sample would measure the freeze; concurrency is the limit there.
            tasks.append(asyncio.ensure_future(runtime.admission.monitor_loop_lag()))
            start_sampler(runtime, tasks)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGHUP)
            for t in tasks:
                t.cancel()
            if runtime.metrics is not None:
                runtime.metrics.flush()  # the last second's counts, for the shutdown's final scrape or EMF flush
            if runtime.content_writer is not None:
                # Content still queued goes to the store while the audit trail can take its references.
                await runtime.content_writer.aclose(timeout_s=5.0)
            if runtime.audit is not None:
                await runtime.audit.aclose()
            await runtime.aclose()

    app = Starlette(
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.runtime = runtime
    # A path with a trailing slash is a 404 like any unknown path: Starlette's redirect would build
    # its Location from the client's Host header.
    app.router.redirect_slashes = False
    prefix = runtime.holder.root.limits.path_prefix  # routes are fixed at start; a reload cannot move them
    app.router.add_route(f"{prefix}/models", models.list_models, methods=["GET"])
    app.router.add_route(f"{prefix}/models/{{model:path}}", models.retrieve_model, methods=["GET"])
    app.router.add_route(f"{prefix}/chat/completions", chat.chat_completions, methods=["POST"])
    app.router.add_route(f"{prefix}/messages", messages.messages, methods=["POST"])
    app.router.add_route(f"{prefix}/messages/count_tokens", messages.messages_count_tokens, methods=["POST"])
    app.router.add_route(f"{prefix}/responses", responses.responses, methods=["POST"])
    app.router.add_route(f"{prefix}/embeddings", embeddings.embeddings, methods=["POST"])
    app.router.add_route(f"{prefix}/usage", usage.usage, methods=["GET"])
    app.router.add_route("/healthz", health.healthz, methods=["GET"])
    app.router.add_route("/admin/v1/routes", admin.admin_routes, methods=["GET"])
    metrics = runtime.telemetry_config.metrics
    if metrics.enabled and metrics.port is None:  # with a port of its own, only that listener serves it
        app.router.add_route(metrics.path, metrics_endpoint, methods=["GET"])
    cors = runtime.cors_config
    if cors.allowedOrigins:  # off by default, and then no layer at all
        from tollway.server.cors import install_cors

        install_cors(app, cors)
    app.add_middleware(RequestIdMiddleware)
    return app
