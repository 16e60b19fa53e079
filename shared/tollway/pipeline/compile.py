"""Which stages an alias plan runs, decided once at publication.

The order is fixed: governance first (it may refuse, and it settles the cost the audit stage
records), the audit recorder last (its first event goes in only once every other stage accepted
the request). PII tokenization sits between them, in the plans of aliases with a PII profile;
capabilities that come later (guardrails, capture) slot in between too. A stage
the root does not enable is left out of the plan, so a request never asks whether it is on.

Content capture goes on the side of the PII stage that matches its mode: after it for
``tokenized-content`` (the exchange the provider saw), before it for ``encrypted-raw`` (what the
client sent and got back). An alias whose ``contentMode`` is ``disabled`` has no audit stage.
"""

from __future__ import annotations

from tollway.config.root import PublishedRoot, StageCompiler
from tollway.governance.meter import Governor
from tollway.pipeline.stage import Stage
from tollway.pipeline.stages.audit import AuditStage
from tollway.pipeline.stages.content import ContentStage
from tollway.pipeline.stages.governance import GovernanceStage
from tollway.pipeline.stages.pii import PiiStage
from tollway.routing.plan import AliasPlan

__all__ = ["stage_compiler"]


def stage_compiler(
    governor: Governor | None,
    audit: AuditStage | None,
    pii: PiiStage | None = None,
    content: ContentStage | None = None,
) -> StageCompiler:
    """The compiler ``Publisher.stages`` runs for every plan of every root it publishes."""
    governance = GovernanceStage(governor) if governor is not None else None
    pii_stage = pii if pii is not None else PiiStage()

    def compile_stages(root: PublishedRoot, plan: AliasPlan) -> tuple[Stage, ...]:
        stages: list[Stage] = []
        if governance is not None and (root.governance.enabled or root.pricing.snapshot is not None):
            stages.append(governance)
        capture = content if content is not None and plan.content is not None and audit is not None else None
        if capture is not None and plan.content is not None and plan.content.mode == "encrypted-raw":
            stages.append(capture)
            capture = None
        if plan.pii is not None:
            stages.append(pii_stage)
        if capture is not None:
            stages.append(capture)
        if audit is not None and plan.content_mode != "disabled":
            stages.append(audit)
        return tuple(stages)

    return compile_stages
