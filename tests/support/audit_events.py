"""Audit events for tests: one logical request's events, as the gateway appends them."""

from __future__ import annotations

from tollway.audit import events

__all__ = ["request_events"]


def request_events(request_id: str, attempts: int, *, priced: bool = False) -> list[bytes]:
    """One logical request's events in append order: admitted, (started, finished) per attempt, finished.

    ``priced``: with the pricing fields the gateway adds once a price catalog is published (the
    pricing version on each attempt, the cost on ``request_finished``), as ``bench.ship`` ships."""
    digest = "d" * 64
    pricing_version = "models.dev@2026-11-28" if priced else None
    out = [
        events.request_admitted(
            request_id=request_id,
            root_digest=digest,
            principal_id="svc-a",
            tenant="acme",
            team="search",
            key_id="key-1",
            alias="chat-default",
            stream=attempts % 2 == 0,
            content_mode="metadata-only",
            max_attempts=3,
        )
    ]
    for n in range(1, attempts + 1):
        last = n == attempts
        out.append(
            events.attempt_started(
                request_id=request_id,
                root_digest=digest,
                attempt=n,
                route_id="r1",
                deployment_id=f"dep-{n}",
                provider_format="openai_chat",
                physical_model="gpt-x",
                reason="first" if n == 1 else "retry",
                pricing_version=pricing_version,
            )
        )
        out.append(
            events.attempt_finished(
                request_id=request_id,
                root_digest=digest,
                attempt=n,
                route_id="r1",
                deployment_id=f"dep-{n}",
                outcome="ok" if last else "error",
                error_category=None if last else "server_error",
                upstream_status=200 if last else 503,
                first_token_ms=12.5 if last else None,
                total_ms=40.0,
            )
        )
    out.append(
        events.request_finished(
            request_id=request_id,
            root_digest=digest,
            status=200,
            outcome="ok",
            error_code=None,
            attempts=attempts,
            admission_ms=0.4,
            total_ms=90.0,
            usage={"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            usage_evidence="provider-reported",
            cancellation=None,
            principal_id="p-1",
            tenant="t-1",
            team=None,
            key_id="k-1",
            alias="chat-fast-v1",
            cost_micro_usd=220 if priced else None,
            pricing_version=pricing_version,
            pricing_tier="standard" if priced else None,
            cost_evidence="provider-reported" if priced else None,
        )
    )
    return [e.encode() for e in out]
