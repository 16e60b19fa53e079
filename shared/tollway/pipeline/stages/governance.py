"""Governance as a stage: reserve the request's tokens and cost before any provider work, settle
what it used at the end.

The reservation is taken against the root the request captured at admission, after the body is
decoded (it needs the input estimate and the output limit) and before the audit trail's first
event. The stage is in a plan only when the root has governance or pricing: otherwise the
request path has no budget code at all.
"""

from __future__ import annotations

from tollway.exceptions import ContextLengthExceeded, InvalidRequest
from tollway.governance.meter import Governor
from tollway.pipeline.stage import BaseStage, Call

__all__ = ["GovernanceStage"]


class GovernanceStage(BaseStage):
    name = "governance"

    __slots__ = ("_governor",)

    def __init__(self, governor: Governor) -> None:
        self._governor = governor

    async def before(self, call: Call) -> None:
        ctx, creq = call.ctx, call.request
        assert ctx is not None and creq is not None
        plan, root = ctx.plan, ctx.root
        gov = root.governance
        policy = gov.policy(ctx.principal.key_id, plan.name)
        if policy.max_output_tokens is not None:
            if creq.max_output_tokens is not None and creq.max_output_tokens > policy.max_output_tokens:
                raise InvalidRequest(
                    f"'max_tokens' exceeds your limit of {policy.max_output_tokens} output tokens for this model.",
                    param="max_tokens",
                )
            if creq.max_output_tokens is None:
                creq.max_output_tokens = min(plan.default_max_output_tokens, policy.max_output_tokens)
        input_tokens = ctx.input_tokens
        if policy.max_input_tokens is not None and input_tokens > policy.max_input_tokens:
            raise ContextLengthExceeded(
                f"The messages exceed your limit of {policy.max_input_tokens} input tokens for this model."
            )
        if creq.max_output_tokens is None and not policy.empty:
            # What is reserved is what the provider is allowed: without an explicit limit some formats
            # send none, and the answer could outgrow its reservation.
            creq.max_output_tokens = plan.default_max_output_tokens
        max_output = creq.max_output_tokens if creq.max_output_tokens is not None else plan.default_max_output_tokens
        ctx.governance = await self._governor.admit(
            gov,
            root.pricing,
            ctx.principal.key_id,
            plan.name,
            input_tokens=input_tokens,
            max_output_tokens=max_output,
            stream=creq.stream,
        )
        ctx.reserved_tokens = input_tokens + max_output

    async def finish(self, call: Call) -> None:
        ctx = call.ctx
        assert ctx is not None
        if ctx.governance is None and ctx.root.pricing.snapshot is None:
            return
        last = ctx.attempts[-1].route_id if ctx.attempts else None
        billable = any(a.outcome != "error" or a.upstream_status is None for a in ctx.attempts)
        call.cost = self._governor.settle(ctx.governance, ctx.root.pricing, last, ctx.usage, billable)
