"""The gateway's side of the audit trail: append each request's events to the WAL, in order.

One recorder per process, built from the ``audit:`` block at start. The request path calls it at
four points (admission, before each dispatch, after each attempt, at the end); every call is an
in-memory append to the WAL writer's queue except where durability demands a wait:

- ``bounded-async``: nothing waits. A full or dead WAL still fails the request *before dispatch*
  (503 ``audit_unavailable``), so an admitted request always has room for its events. Records
  appended but not yet written are lost if the process crashes (the loss window the WAL reports).
- ``local-durable``: ``attempt_started`` waits until its record is at or below the durable
  watermark (fdatasync'd) before the provider sees anything; with
  ``terminalCommitBeforeResponse`` a buffered response also waits for its ``request_finished``.
  A commit timeout or I/O failure fails the request before dispatch.

After dispatch nothing can be undone, so ``attempt_finished`` and ``request_finished`` failures are
logged and counted, never raised (the store reports the missing terminal as an incomplete attempt).

A request answered 4xx after authentication but before admission is one ``request_rejected``
event, appended without waiting under either profile: it is the whole record of a request that
reached no provider. A WAL that refuses it must not turn the 4xx into a 5xx, so that failure is
counted too, never raised. An unauthenticated 401 names no principal: the app counts it.
``contentMode: disabled`` records no request-level events at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from tollway.audit import events
from tollway.exceptions import AuditUnavailable

if TYPE_CHECKING:
    from tollway.audit.wal import WalWriter
    from tollway.canonical import UsageEvidence
    from tollway.gateway import AttemptRecord, RequestContext
    from tollway.governance.meter import CostRecord
    from tollway.governance.principals import Principal
    from tollway.routing.plan import RouteTarget

__all__ = ["AuditRecorder"]

log = logging.getLogger("tollway.audit")


class AuditRecorder:
    __slots__ = (
        "_commit_timeout_s",
        "_content_mode",
        "_durable",
        "_terminal_commit",
        "dropped",
        "rejected_unrecorded",
        "writer",
    )

    def __init__(
        self,
        writer: WalWriter,
        *,
        durable: bool,
        terminal_commit: bool,
        commit_timeout_s: float,
        content_mode: Literal["metadata-only", "disabled"],
    ) -> None:
        self.writer = writer
        self._durable = durable
        self._terminal_commit = terminal_commit
        self._commit_timeout_s = commit_timeout_s
        self._content_mode: Literal["metadata-only", "disabled"] = content_mode
        self.dropped = 0
        """Post-dispatch events the WAL refused (logged; the store shows the attempt incomplete)."""
        self.rejected_unrecorded = 0
        """``request_rejected`` events the WAL refused (logged): rejected requests the store will not show."""

    @property
    def enabled(self) -> bool:
        return self._content_mode != "disabled"

    def _append(self, event: events.AuditEvent) -> int:
        try:
            return self.writer.append(event.encode())
        except Exception as exc:
            # Imported here, on the failure path only: a function-level import of a package's name
            # costs about a microsecond per call (importlib's fromlist handling), four times a request.
            from tollway.audit.wal.format import WalError

            if not isinstance(exc, (WalError, ValueError)):
                raise
            log.error("audit WAL refused %s for request %s: %s", event.kind, event.request_id, type(exc).__name__)
            raise AuditUnavailable() from None

    async def _durable_wait(self, seq: int, what: str, request_id: str) -> None:
        try:
            await self.writer.wait_durable(seq, self._commit_timeout_s)
        except Exception as exc:
            from tollway.audit.wal.format import WalError

            if not isinstance(exc, WalError):
                raise
            log.error("audit commit of %s for request %s failed: %s", what, request_id, type(exc).__name__)
            raise AuditUnavailable() from None

    def admitted(self, ctx: RequestContext, *, stream: bool) -> None:
        """At admission, before any provider work; raises ``AuditUnavailable`` (503) if the WAL cannot take it."""
        if not self.enabled:
            return
        p = ctx.principal
        self._append(
            events.request_admitted(
                request_id=ctx.request_id,
                root_digest=ctx.root.digest,
                principal_id=p.id,
                tenant=p.tenant,
                team=p.team,
                key_id=p.key_id,
                alias=ctx.plan.name,
                stream=stream,
                content_mode=ctx.plan.content_mode or self._content_mode,  # type: ignore[arg-type]
                max_attempts=ctx.plan.retry.max_attempts,
                trace_id=ctx.trace.trace_id_hex if ctx.trace is not None else None,
                operation=ctx.operation,
            )
        )

    def content_stored(self, request_id: str, root_digest: str, ref: Mapping[str, object]) -> None:
        """A request's content is in the store (the writer's callback): its reference. Never raises."""
        self._after_the_fact(events.content_stored(request_id=request_id, root_digest=root_digest, ref=ref))

    def content_dropped(self, request_id: str, root_digest: str, mode: str, reason: str) -> None:
        """A request's content was not stored, and why. Never raises."""
        self._after_the_fact(
            events.content_dropped(request_id=request_id, root_digest=root_digest, mode=mode, reason=reason)
        )

    def _after_the_fact(self, event: events.AuditEvent) -> None:
        try:
            self._append(event)
        except AuditUnavailable:
            self.dropped += 1

    def request_rejected(
        self,
        *,
        request_id: str,
        principal: Principal,
        alias: str | None,
        status: int,
        code: str,
        stream: bool | None,
        root_digest: str,
        operation: str = "chat.completions",
    ) -> None:
        """An authenticated request answered ``status`` (4xx) before admission. Never raises.

        ``alias`` must be a published alias or ``None``, never the model name as the caller typed
        it; ``stream`` is ``None`` when the body was not parsed. Appended without a durable wait
        under either profile: nothing was dispatched, so there is nothing to guard. A WAL that
        refuses it (full, dead, failed) is logged and counted in ``rejected_unrecorded``.
        """
        if not self.enabled:
            return
        try:
            self._append(
                events.request_rejected(
                    request_id=request_id,
                    root_digest=root_digest,
                    principal_id=principal.id,
                    tenant=principal.tenant,
                    team=principal.team,
                    key_id=principal.key_id,
                    alias=alias,
                    status=status,
                    error_code=code,
                    stream=stream,
                    operation=operation,
                )
            )
        except AuditUnavailable:
            self.rejected_unrecorded += 1
        except Exception as exc:  # the answer is a 4xx whatever happens here
            log.error("audit request_rejected for request %s not recorded: %s", request_id, type(exc).__name__)
            self.rejected_unrecorded += 1

    async def attempt_started(
        self,
        ctx: RequestContext,
        number: int,
        target: RouteTarget,
        reason: Literal["first", "retry", "fallback", "continuation"],
    ) -> None:
        """Before dispatch; under local-durable, returns only once the record is durable."""
        if not self.enabled:
            return
        seq = self._append(
            events.attempt_started(
                request_id=ctx.request_id,
                root_digest=ctx.root.digest,
                attempt=number,
                route_id=target.route_id,
                deployment_id=target.deployment.id,
                provider_format=target.deployment.format.value,
                physical_model=target.target.model,
                reason=reason,
                root_generation=ctx.root.generation,
                route_bucket=ctx.route_bucket,
                pricing_version=ctx.root.pricing.version,
            )
        )
        if self._durable:
            await self._durable_wait(seq, "attempt_started", ctx.request_id)

    def attempt_finished(self, ctx: RequestContext, record: AttemptRecord) -> None:
        """After an attempt settles (for a stream: when it ends). Never raises."""
        if not self.enabled:
            return
        ended = record.ended if record.ended is not None else time.monotonic()
        try:
            self._append(
                events.attempt_finished(
                    request_id=ctx.request_id,
                    root_digest=ctx.root.digest,
                    attempt=record.number,
                    route_id=record.route_id,
                    deployment_id=record.deployment_id,
                    outcome=record.outcome,
                    error_category=record.error_category,
                    upstream_status=record.upstream_status,
                    first_token_ms=None if record.first_event_s is None else record.first_event_s * 1000,
                    total_ms=(ended - record.started) * 1000,
                    connect_ms=None if record.connect_s is None else record.connect_s * 1000,
                    skipped_events=record.skipped_events,
                )
            )
        except AuditUnavailable:
            self.dropped += 1

    async def request_finished(
        self,
        ctx: RequestContext,
        *,
        status: int,
        error_code: str | None,
        stream: bool,
        admitted_at: float,
        cost: CostRecord | None = None,
        commit: bool = False,
        evidence: UsageEvidence | None = None,
        pii: Mapping[str, object] | None = None,
    ) -> None:
        """At the end. A buffered local-durable response waits for it when ``terminalCommitBeforeResponse``,
        and so does a stream whose ``[DONE]`` is held for it (``commit``, ``terminalCommitBeforeDone``).

        Never raises: the response is already decided. A failed commit is logged and counted.
        """
        if not self.enabled:
            return
        usage = ctx.usage
        outcome = "ok" if status < 400 else ("cancelled" if status == 499 else "error")
        try:
            seq = self._append(
                events.request_finished(
                    request_id=ctx.request_id,
                    root_digest=ctx.root.digest,
                    status=status,
                    outcome=outcome,
                    error_code=error_code,
                    attempts=len(ctx.attempts),
                    admission_ms=(admitted_at - ctx.received) * 1000,
                    total_ms=(time.monotonic() - ctx.received) * 1000,
                    usage=None
                    if usage is None
                    else {
                        "promptTokens": usage.prompt_tokens,
                        "completionTokens": usage.completion_tokens,
                        "totalTokens": usage.total_tokens,
                        "cachedPromptTokens": usage.cached_prompt_tokens,
                        "reasoningTokens": usage.reasoning_tokens,
                    },
                    usage_evidence=evidence.value
                    if evidence is not None
                    else ("unknown" if usage is None else usage.evidence.value),
                    cancellation="client_disconnected" if status == 499 else None,
                    principal_id=ctx.principal.id,
                    tenant=ctx.principal.tenant,
                    team=ctx.principal.team,
                    key_id=ctx.principal.key_id,
                    alias=ctx.plan.name,
                    cost_micro_usd=cost.micro_usd if cost is not None else None,
                    pricing_version=cost.pricing_version if cost is not None else None,
                    pricing_tier=cost.tier if cost is not None else None,
                    cost_evidence=cost.evidence if cost is not None else None,
                    pii=pii,
                )
            )
            if self._durable and (commit or (self._terminal_commit and not stream)):
                await self._durable_wait(seq, "request_finished", ctx.request_id)
        except AuditUnavailable:
            self.dropped += 1
