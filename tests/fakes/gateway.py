"""What a test driving ``Gateway`` directly needs around it: the request context a handler would
build, a ``sleep`` that records instead of waiting, and a summary of the attempts made."""

from __future__ import annotations

import asyncio
import random

from tests.fakes.roots import ALIAS, PRINCIPAL
from tollway.config.root import PublishedRoot
from tollway.gateway import RequestContext
from tollway.governance.principals import Principal

__all__ = ["Sleeps", "attempts", "request_context"]


def request_context(
    root: PublishedRoot,
    *,
    timeout_s: float = 10.0,
    alias: str = ALIAS,
    principal: Principal = PRINCIPAL,
    seed: int = 0,
) -> RequestContext:
    """A context as the chat handler builds one: the deadline ``timeout_s`` from now on the loop's
    clock, and a generator of its own, so the weighted choice and the backoff jitter repeat."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    return RequestContext("req_1", principal, root, root.aliases[alias], deadline, rng=random.Random(seed))


def attempts(ctx: RequestContext) -> list[tuple[str, str, str | None, int | None]]:
    """Each attempt as (route, outcome, error category, upstream status)."""
    return [(a.route_id, a.outcome, a.error_category, a.upstream_status) for a in ctx.attempts]


class Sleeps:
    """A ``Gateway(sleep=...)`` that records each backoff instead of waiting it out."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
