"""The audit recorder as a stage: the trail's first event before any provider work, its terminal
event at the end; and, for a request refused before that, one ``request_rejected`` event.

The stage is last in every plan, so its ``before`` runs after every other stage accepted the
request (a full or dead WAL is a 503 there, with nothing sent upstream) and its ``finish`` sees
the cost the governance stage settled.
"""

from __future__ import annotations

import time

from tollway.audit.recorder import AuditRecorder
from tollway.pipeline.stage import BaseStage, Call

__all__ = ["AuditStage"]


class AuditStage(BaseStage):
    name = "audit"

    __slots__ = ("recorder",)

    def __init__(self, recorder: AuditRecorder) -> None:
        self.recorder = recorder

    async def before(self, call: Call) -> None:
        ctx = call.ctx
        assert ctx is not None
        self.recorder.admitted(ctx, stream=bool(call.stream))
        call.admitted_at = time.monotonic()

    async def finish(self, call: Call) -> None:
        ctx = call.ctx
        assert ctx is not None
        await self.recorder.request_finished(
            ctx,
            status=call.status,
            error_code=call.code,
            stream=bool(call.stream),
            admitted_at=call.admitted_at,
            cost=call.cost,
            commit=call.commit,
            pii=call.pii.manifest() if call.pii is not None else None,
        )

    def rejected(self, call: Call, root_digest: str) -> None:
        """A request that ended before the trail's first event: an authenticated 4xx is recorded.
        A shed for overload is counted by admission instead (shedding must cost less than
        serving), and a 5xx from the budget store or the WAL itself writes nothing."""
        principal, code = call.principal, call.code
        if principal is None or code is None or call.status >= 500 or code == "overloaded":
            return
        alias = call.alias
        self.recorder.request_rejected(
            request_id=call.request_id,
            principal=principal,
            alias=alias.name if alias is not None else None,
            status=call.status,
            code=code,
            stream=call.stream if alias is not None else None,
            root_digest=root_digest,
            operation=call.operation,
        )
