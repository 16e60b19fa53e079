"""Stages: the hooks a capability plugs into the request path with.

A stage sees one request before the provider is called (``before``), the canonical response of
a buffered one after (``after``), a streamed one's events through an optional transform with
bounded state (``transform``), and the request's end (``finish``). Stages are compiled into each
alias plan at publication, in order (:mod:`tollway.pipeline.compile`); a stage a root does not
enable is not in the plan, so it costs nothing per request.

Order: ``before`` and ``finish`` run in plan order, ``after`` and the transforms in reverse (the
stage nearest the provider sees its answer first). ``finish`` runs once for every stage whose
``before`` returned, on every path (success, error, timeout, disconnect, cancellation); a stage
whose ``before`` raised cleans up after itself. Governance is the first stage and the audit
recorder the last, so the audit record's terminal event sees the settled cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from tollway.canonical import CanonicalRequest, CanonicalResponse, EmbeddingRequest, StreamEvent

if TYPE_CHECKING:
    from tollway.gateway import RequestContext
    from tollway.governance.meter import CostRecord
    from tollway.governance.principals import Principal
    from tollway.pipeline.stages.content import Capture
    from tollway.pipeline.stages.pii import PiiState
    from tollway.routing.plan import AliasPlan
    from tollway.telemetry.tracing import RequestTrace

__all__ = ["BaseStage", "Call", "Stage", "StreamTransform"]


class Call:
    """One request's state as the pipeline and its stages see it, from authentication to the end."""

    __slots__ = (
        "admitted_at",
        "alias",
        "capture",
        "code",
        "commit",
        "committed_at",
        "cost",
        "ctx",
        "cut",
        "operation",
        "pii",
        "principal",
        "request",
        "request_id",
        "started",
        "status",
        "stream",
        "trace",
    )

    def __init__(self, request_id: str, started: float = 0.0, operation: str = "chat.completions") -> None:
        self.request_id = request_id
        self.operation = operation
        """The API the client called, as the audit trail names it (``chat.completions``, ``embeddings``…)."""
        self.started = started
        """Monotonic time the pipeline took the request (its duration and overhead start here)."""
        self.trace: RequestTrace | None = None
        """The request's trace, when it is sampled (:mod:`tollway.telemetry.tracing`)."""
        self.committed_at = 0.0
        """Monotonic time a stream committed (its first token was in hand); 0 for no stream."""
        self.cut: str | None = None
        """Why the gateway ended a stream early (slow, stalled, lifetime, disconnect), if it did."""
        self.principal: Principal | None = None
        self.alias: AliasPlan | None = None
        """The resolved alias plan (set before the body is checked against it)."""
        self.stream: bool | None = None
        """Whether the body asked to stream (``None`` until it is parsed)."""
        self.request: CanonicalRequest | EmbeddingRequest | None = None
        """The decoded request; an embeddings request has no ``after`` or transform: nothing is generated."""
        self.ctx: RequestContext | None = None
        """The attempt loop's context, once the request is decoded and eligible."""
        self.status = 499
        """The answer's status as it stands; a disconnect before any answer is a 499."""
        self.code: str | None = None
        self.admitted_at = 0.0
        """Monotonic time the audit trail's first event went in (0: the request was not admitted to it)."""
        self.cost: CostRecord | None = None
        """What the request cost, settled by the governance stage's ``finish``."""
        self.pii: PiiState | None = None
        """The request's PII state (its mapping, what the audit trail records), under a PII profile."""
        self.capture: Capture | None = None
        """What the content stage keeps of a sampled request, under a capturing ``contentMode``."""
        self.commit = False
        """The terminal audit event must be durable before the stream's end frame leaves."""


class StreamTransform(Protocol):
    """Rewrites a stream's events with bounded state: it may hold events back and release them later."""

    def feed(self, ev: StreamEvent) -> Iterable[StreamEvent]:
        """The events to pass on for ``ev`` (none, itself, or what it held back plus it)."""
        ...

    def flush(self) -> Iterable[StreamEvent]:
        """What is still held when the stream ends."""
        ...


class Stage(Protocol):
    name: str

    async def before(self, call: Call) -> None:
        """Before any provider work; raise a ``GatewayError`` to refuse the request."""
        ...

    async def after(self, call: Call, response: CanonicalResponse) -> None:
        """A buffered answer, before it is encoded for the client."""
        ...

    def transform(self, call: Call) -> StreamTransform | None:
        """This stream's transform, or ``None`` to leave its events alone (no per-event cost)."""
        ...

    async def finish(self, call: Call) -> None:
        """The request's end, whatever it was: ``call.status`` and ``call.code`` are final. Never raises."""
        ...


class BaseStage:
    """No-op defaults, so a stage implements only the hooks it needs."""

    name = "stage"

    async def before(self, call: Call) -> None:
        return None

    async def after(self, call: Call, response: CanonicalResponse) -> None:
        return None

    def transform(self, call: Call) -> StreamTransform | None:
        return None

    async def finish(self, call: Call) -> None:
        return None
