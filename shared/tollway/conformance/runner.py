"""Running the suite against one deployment, through the gateway's own provider layer.

A deployment is reached exactly as the gateway reaches it: the caller publishes a configuration
(``tollway.config.root.Publisher``) and each case goes through the published deployment's codec
(``encode_request``, ``decode_response``, ``decode_stream``, ``decode_error``) and pooled transport,
with the credentials publication resolved for it. What is published is the configuration cut down
to that one provider and its chat routes (:func:`conformance_config`), so principals' keys, PII
profiles and pricing files need not resolve to test a provider.

The publisher is passed in (a :class:`Publishes`): this package sits below ``tollway.config`` in
the layers, so that publication can call :mod:`tollway.conformance.policy`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import orjson

from tollway.canonical import (
    CanonicalResponse,
    SkippedEvent,
    StreamEvent,
    StreamFinish,
    StreamUsage,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageEvidence,
)
from tollway.conformance.result import CaseOutcome, ConformanceResult
from tollway.conformance.suite import CASES, CITY_SCHEMA, SUITE_VERSION, WEATHER_TOOL, Case, suite_digest
from tollway.eventstream import EventStreamError, aiter_eventstream
from tollway.exceptions import TollwayError, UpstreamCategory, UpstreamError
from tollway.providers import FORMAT_CAPABILITIES
from tollway.providers.base import AnyCodec, Target
from tollway.sse import SseFrameTooLarge, aiter_sse

if TYPE_CHECKING:
    from tollway.config.root import PublishedRoot
    from tollway.config.schema import RouteConfig, RouterConfig
    from tollway.routing.plan import Deployment

__all__ = [
    "CONFORMANCE_ALIAS",
    "NotServed",
    "Publishes",
    "chat_targets",
    "conformance_config",
    "run_case",
    "run_deployment",
]

CONFORMANCE_ALIAS = "tollway-conformance"
"""The one alias of the cut-down configuration that is published to reach a deployment."""


class Publishes(Protocol):
    """What :func:`run_deployment` needs of ``tollway.config.root.Publisher``."""

    def publish(self, cfg: RouterConfig) -> PublishedRoot: ...

    async def aclose(self) -> None: ...


class NotServed(TollwayError, ValueError):
    """The configuration has no such provider, or it serves no chat route (or not that model)."""


class CaseFailed(TollwayError):
    """A check did not hold; the message is a reason safe to store (no content, no credentials)."""


def chat_targets(cfg: RouterConfig, deployment: str) -> list[str]:
    """The physical models ``deployment`` serves to chat aliases, in configuration order, each once."""
    models: list[str] = []
    for m in cfg.models:
        if "embeddings" in m.operations:
            continue
        for r in m.routes:
            if r.provider == deployment and r.model not in models:
                models.append(r.model)
    return models


def conformance_config(cfg: RouterConfig, deployment: str) -> RouterConfig:
    """``cfg`` with only ``deployment`` and one alias whose routes are its chat routes (one per
    physical model); no principals, governance policies, pricing files or PII profiles, and no
    route that requires conformance (publication would otherwise refuse what is about to be measured)."""
    if deployment not in cfg.providers:
        raise NotServed(f"{deployment!r} is not a provider; known: {', '.join(cfg.providers)}")
    routes: list[RouteConfig] = []
    for m in cfg.models:
        if "embeddings" in m.operations:
            continue
        for r in m.routes:
            if r.provider == deployment and all(r.model != seen.model for seen in routes):
                routes.append(
                    r.model_copy(
                        update={"id": f"conformance-{len(routes)}", "capabilities": None, "requireConformance": False}
                    )
                )
    if not routes:
        raise NotServed(f"{deployment!r} serves no chat route")
    template = next(m for m in cfg.models if "embeddings" not in m.operations and m.routes)
    alias = template.model_copy(
        update={
            "name": CONFORMANCE_ALIAS,
            "routes": routes,
            "capabilities": [],
            "piiProfileId": None,
            "contentMode": None,
            "strategy": None,
            "canary": None,
            "streamRecovery": "none",
        }
    )
    governance = cfg.governance.model_copy(
        update={
            "policies": [],
            "quotaGroups": {},
            "pricing": cfg.governance.pricing.model_copy(update={"catalogFile": "", "overridesFile": ""}),
        }
    )
    return cfg.model_copy(
        update={
            "providers": {deployment: cfg.providers[deployment]},
            "models": [alias],
            "principals": [],
            "governance": governance,
            "pii": cfg.pii.model_copy(update={"profiles": [], "keySecretRef": None, "previousKeySecretRefs": []}),
            # what is being measured cannot be required to have been measured already
            "conformance": cfg.conformance.model_copy(update={"requireConformance": False}),
        }
    )


async def run_deployment(
    cfg: RouterConfig,
    deployment: str,
    publisher: Publishes,
    *,
    models: Sequence[str] | None = None,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.time,
) -> list[ConformanceResult]:
    """The suite's result for each of ``models`` (default: every chat model ``deployment`` serves);
    :class:`NotServed` when the configuration does not serve them. ``publisher`` is closed after."""
    served = chat_targets(cfg, deployment)
    unknown = [m for m in models or () if m not in served]
    try:
        if unknown:
            raise NotServed(f"{deployment!r} serves {', '.join(served) or 'no chat route'}, not {unknown[0]!r}")
        root = publisher.publish(conformance_config(cfg, deployment))
    except BaseException:
        await publisher.aclose()
        raise
    try:
        dep = root.deployments[deployment]
        provider_type = cfg.providers[deployment].type
        results = []
        for model in models or served:
            started = round(clock(), 3)
            cases = [await run_case(case, dep, model, timeout_s) for case in CASES]
            results.append(
                ConformanceResult(
                    suite_version=SUITE_VERSION,
                    suite_digest=suite_digest(),
                    deployment=deployment,
                    provider_type=provider_type,
                    provider_format=dep.format.value,
                    model=model,
                    started_at=started,
                    finished_at=round(clock(), 3),
                    cases=tuple(cases),
                )
            )
        return results
    finally:
        await publisher.aclose()


async def run_case(case: Case, deployment: Deployment, model: str, timeout_s: float) -> CaseOutcome:
    """Send one case and judge it; every failure is an outcome, never an exception."""
    missing = [c for c in case.requires if c not in FORMAT_CAPABILITIES[deployment.format]]
    if missing:
        return CaseOutcome(
            case.id, case.capability, "skipped", f"the {deployment.format.value} format has no {missing[0]}"
        )
    started = time.monotonic()
    reason = ""
    try:
        async with asyncio.timeout(timeout_s):
            await _CHECKS[case.id](
                case, deployment, Target(model=model, default_max_output_tokens=case.max_output_tokens)
            )
    except CaseFailed as exc:
        reason = str(exc)
    except UpstreamError as exc:
        reason = _upstream(exc)
    except TimeoutError:
        reason = f"no complete answer within {timeout_s:g} s"
    except (SseFrameTooLarge, EventStreamError):
        reason = "the stream's framing broke"
    except Exception as exc:  # a codec's refusal, a transport's bug: recorded by type, never by message
        reason = f"unexpected {type(exc).__name__}"
    elapsed = int((time.monotonic() - started) * 1000)
    return CaseOutcome(case.id, case.capability, "fail" if reason else "pass", reason, elapsed)


def _upstream(exc: UpstreamError) -> str:
    return f"upstream error: {exc.category.value}" + (f" (HTTP {exc.status})" if exc.status else "")


async def _buffered(case: Case, dep: Deployment, target: Target) -> CanonicalResponse:
    codec = dep.codec
    status, headers, body = await dep.transport.send(codec.encode_request(case.request(), target))
    if status >= 400:
        raise codec.decode_error(status, headers, body)
    return codec.decode_response(status, body)


async def _events(codec: AnyCodec, chunks: AsyncIterator[bytes]) -> AsyncIterator[StreamEvent]:
    if codec.framing == "eventstream":
        async for ev in codec.decode_stream(aiter_eventstream(chunks)):
            yield ev
    else:
        async for ev in codec.decode_stream(aiter_sse(chunks)):
            yield ev


async def _streamed(case: Case, dep: Deployment, target: Target) -> list[StreamEvent]:
    """Every event of the stream, read to its end: a stream that does not terminate as its format
    says (``[DONE]``, ``message_stop``, the finish) fails in the codec, as truncated."""
    codec = dep.codec
    async with dep.transport.stream(codec.encode_request(case.request(), target)) as response:
        if response.status >= 400:
            raise codec.decode_error(response.status, response.headers, await response.read_bounded())
        events = [ev async for ev in _events(codec, response.aiter_bytes())]
    if any(isinstance(ev, SkippedEvent) for ev in events):
        raise CaseFailed("an event of the stream did not decode")
    finishes = [ev for ev in events if isinstance(ev, StreamFinish)]
    if len(finishes) != 1:
        raise CaseFailed(f"the stream carried {len(finishes)} finish events, not one")
    return events


def _check_usage(usage: Usage | None) -> None:
    if usage is None:
        raise CaseFailed("no usage reported")
    if usage.evidence is not UsageEvidence.PROVIDER_REPORTED:
        raise CaseFailed(f"usage is {usage.evidence.value}, not provider-reported")
    if usage.prompt_tokens <= 0 or usage.completion_tokens <= 0:
        raise CaseFailed("usage reports no prompt or no completion tokens")


def _check_text(text: str | None, finish: str) -> None:
    if not text or not text.strip():
        raise CaseFailed("the answer has no text")
    if finish not in ("stop", "length"):
        raise CaseFailed(f"finish reason {finish}, expected stop or length")


def _check_arguments(arguments: str) -> None:
    try:
        args = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise CaseFailed("the tool call's arguments are not JSON") from None
    if not isinstance(args, dict):
        raise CaseFailed("the tool call's arguments are not a JSON object")
    if not isinstance(args.get("city"), str):
        raise CaseFailed("the tool call's arguments lack the required string 'city'")


async def _chat_buffered(case: Case, dep: Deployment, target: Target) -> None:
    answer = await _buffered(case, dep, target)
    _check_text(answer.content, answer.finish_reason)


async def _usage_buffered(case: Case, dep: Deployment, target: Target) -> None:
    _check_usage((await _buffered(case, dep, target)).usage)


async def _chat_stream(case: Case, dep: Deployment, target: Target) -> None:
    events = await _streamed(case, dep, target)
    deltas = [ev.text for ev in events if isinstance(ev, TextDelta)]
    finish = next(ev.reason for ev in events if isinstance(ev, StreamFinish))
    if not deltas:
        raise CaseFailed("the stream carried no text delta")
    _check_text("".join(deltas), finish)


async def _usage_stream(case: Case, dep: Deployment, target: Target) -> None:
    events = await _streamed(case, dep, target)
    usages = [ev.usage for ev in events if isinstance(ev, StreamUsage)]
    _check_usage(usages[-1] if usages else None)


async def _tools_buffered(case: Case, dep: Deployment, target: Target) -> None:
    answer = await _buffered(case, dep, target)
    calls = answer.tool_calls or []
    if len(calls) != 1:
        raise CaseFailed(f"{len(calls)} tool calls, expected one")
    call = calls[0]
    if call.name != WEATHER_TOOL.name:
        raise CaseFailed("the tool call names another tool")
    if not call.id:
        raise CaseFailed("the tool call has no id")
    _check_arguments(call.arguments)
    if answer.finish_reason not in ("tool_calls", "stop"):
        raise CaseFailed(f"finish reason {answer.finish_reason}, expected tool_calls")


async def _tools_stream(case: Case, dep: Deployment, target: Target) -> None:
    """One call, opened by a delta that carries its id and name, its arguments in deltas of the
    same index that join into the JSON object the tool's schema asks for."""
    deltas = [ev for ev in await _streamed(case, dep, target) if isinstance(ev, ToolCallDelta)]
    if not deltas:
        raise CaseFailed("the stream carried no tool call delta")
    first = deltas[0]
    if {d.index for d in deltas} != {first.index}:
        raise CaseFailed("the stream carried more than one tool call")
    if first.name != WEATHER_TOOL.name or not first.id:
        raise CaseFailed("the first tool call delta lacks the tool's id or name")
    if any(d.id not in (None, first.id) or d.name not in (None, first.name) for d in deltas[1:]):
        raise CaseFailed("a later tool call delta changed the call's id or name")
    _check_arguments("".join(d.arguments for d in deltas))


async def _vision_buffered(case: Case, dep: Deployment, target: Target) -> None:
    answer = await _buffered(case, dep, target)
    _check_text(answer.content, answer.finish_reason)


def _json(content: str | None) -> object:
    try:
        return orjson.loads(content or "")
    except orjson.JSONDecodeError:
        raise CaseFailed("the answer is not JSON") from None


async def _json_object(case: Case, dep: Deployment, target: Target) -> None:
    if not isinstance(_json((await _buffered(case, dep, target)).content), dict):
        raise CaseFailed("the answer is not a JSON object")


async def _json_schema(case: Case, dep: Deployment, target: Target) -> None:
    value = _json((await _buffered(case, dep, target)).content)
    if not isinstance(value, dict):
        raise CaseFailed("the answer is not a JSON object")
    if set(value) - set(CITY_SCHEMA["properties"]):
        raise CaseFailed("the answer has properties the schema does not allow")
    if not isinstance(value.get("city"), str):
        raise CaseFailed("the answer's 'city' is missing or not a string")
    population = value.get("population")
    if not isinstance(population, int) or isinstance(population, bool):
        raise CaseFailed("the answer's 'population' is missing or not an integer")


async def _invalid_request(case: Case, dep: Deployment, target: Target) -> None:
    try:
        await _buffered(case, dep, target)
    except UpstreamError as exc:
        if exc.category is not UpstreamCategory.INVALID_REQUEST:
            raise CaseFailed(f"classified as {exc.category.value}, expected invalid_request") from None
        if exc.status is None or not 400 <= exc.status < 500:
            raise CaseFailed(f"HTTP {exc.status}, expected a 4xx") from None
        return
    raise CaseFailed("the provider accepted a request that forces an undeclared tool")


_CHECKS = {
    "chat.buffered": _chat_buffered,
    "usage.buffered": _usage_buffered,
    "chat.stream": _chat_stream,
    "usage.stream": _usage_stream,
    "tools.buffered": _tools_buffered,
    "tools.stream": _tools_stream,
    "vision.buffered": _vision_buffered,
    "json_object.buffered": _json_object,
    "json_schema.buffered": _json_schema,
    "errors.invalid_request": _invalid_request,
}
