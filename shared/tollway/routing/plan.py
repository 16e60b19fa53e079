"""Compiled alias plans: what a request may use, and in which order to try it.

Everything here is built once at publication. A request asks its plan for an attempt order
(priority groups, weighted random inside a group, skipping open circuits) and walks it under
one attempt budget.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tollway.providers.base import AnyCodec, EmbeddingsCodec, ProviderFormat, Target
from tollway.routing.health import DeploymentHealth, OutlierPolicy
from tollway.routing.retry import RetryPolicy
from tollway.routing.strategies import RouteDecision, SelectionInput, Strategy, WeightedRandom, decide
from tollway.transport.base import Transport

if TYPE_CHECKING:
    from tollway.pii.policy import PiiProfile
    from tollway.pipeline.stage import Stage

__all__ = ["AliasPlan", "Deployment", "RetryPolicy", "RouteTarget"]


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """A provider binding: its codec and pooled transport, prebound at publication."""

    id: str
    format: ProviderFormat
    codec: AnyCodec
    transport: Transport
    provider_account_id: str
    quota_group_id: str
    embeddings: EmbeddingsCodec | None = None
    """The format's embeddings capability, when its providers embed."""
    provider_name: str = ""
    """``gen_ai.provider.name`` in metrics and spans: the conventions' well-known value for the
    provider's type and format (``openai``, ``anthropic``, ``gcp.gemini``, ``gcp.vertex_ai``,
    ``aws.bedrock``)."""

    def __repr__(self) -> str:
        return f"Deployment({self.id!r}, {self.format.value})"


@dataclass(frozen=True, slots=True, eq=False)
class RouteTarget:
    route_id: str
    deployment: Deployment
    target: Target
    weight: int
    priority: int
    health: DeploymentHealth
    regions: frozenset[str] = frozenset()
    """Where this route processes traffic (the route's ``regions``, else the alias's)."""
    public_model: str = ""
    """The name a client sees as ``model`` under ``responseModel: route`` (``publicModel``, else the
    route id): never the physical model."""
    context_window: int | None = None
    """Declared context window in tokens (``contextWindowTokens``); ``None``: undeclared."""
    prefill: bool = False
    """The route declares ``assistantPrefill``: it continues a trailing assistant message."""


@dataclass(frozen=True, slots=True)
class ContentPolicy:
    """An alias's content capture, compiled from ``contentMode`` and its companions (docs/export.md)."""

    mode: str
    """``tokenized-content`` or ``encrypted-raw``."""
    sample_rate: float
    retention_class: str
    purposes: tuple[str, ...]
    """``audit`` and the consented ones (``contentPurposes``)."""
    max_record_bytes: int = 1024 * 1024

    def sampled(self, request_id: str) -> bool:
        """Whether this request's content is captured: a stable function of its id, so a replay or a
        second look at the same request decides the same way."""
        if self.sample_rate >= 1.0:
            return True
        if self.sample_rate <= 0.0:
            return False
        return zlib.crc32(request_id.encode()) < self.sample_rate * 0x1_0000_0000


@dataclass(frozen=True, slots=True, eq=False)
class AliasPlan:
    name: str
    capabilities: frozenset[str]
    max_input_tokens: int
    max_output_tokens: int
    default_max_output_tokens: int
    allowed_parameters: frozenset[str]
    reject_unknown_parameters: bool
    groups: tuple[tuple[RouteTarget, ...], ...]
    """Priority groups, lowest priority number first."""
    retry: RetryPolicy
    strategy: Strategy = field(default_factory=WeightedRandom)
    """How a target is chosen inside a priority group (``tollway.routing.strategies``)."""
    outlier: OutlierPolicy | None = None
    """Outlier ejection inside each priority group; ``None`` turns it off."""
    data_classes: frozenset[str] = frozenset()
    """The data classifications this alias is approved for (``dataClassifications``)."""
    image_url_policy: str = "https-public"
    """``data-only``, ``https-public`` or ``any`` (``imageUrlPolicy``; tollway.api.image_urls)."""
    response_model: str = "alias"
    """``alias`` or ``route``: what a response's ``model`` names (``responseModel``)."""
    stream_recovery: str = "none"
    """``none`` or ``continue`` (``streamRecovery``): may a text stream cut after its first token
    continue on another route with an assistant prefill."""
    client_formats: frozenset[str] = frozenset({"openai-chat-completions", "anthropic-messages", "openai-responses"})
    """The client APIs that may call this alias (``clientFormats``)."""
    operation: str = "chat"
    """``chat`` or ``embeddings`` (``operations``)."""
    max_embedding_inputs: int = 2048
    """The most inputs one embeddings request may carry (``maxEmbeddingInputs``)."""
    pii: PiiProfile | None = None
    """The PII profile its requests are tokenized under (``piiProfileId``); ``None``: none."""
    content: ContentPolicy | None = None
    """How its exchanges are captured (``contentMode`` tokenized-content or encrypted-raw); ``None``: never."""
    content_mode: str | None = None
    """Its own ``contentMode``; ``None``: the audit block's."""
    stages: tuple[Stage, ...] = ()
    """The request stages this alias runs, in order, compiled in at publication
    (``tollway.pipeline.compile``): a stage the root does not enable is not here at all."""

    @property
    def formats(self) -> frozenset[str]:
        """The provider wire formats of its routes: a client field one of them cannot carry is
        refused up front, since a fallback may land on any of them."""
        return frozenset(t.deployment.format.value for g in self.groups for t in g)

    def serves(self, regions: frozenset[str]) -> bool:
        """Whether some route may process traffic restricted to ``regions`` (empty: no restriction)."""
        return not regions or any(t.regions & regions for g in self.groups for t in g)

    def decide(
        self, selection: SelectionInput, rng: random.Random, regions: frozenset[str] = frozenset()
    ) -> RouteDecision[RouteTarget]:
        """Targets in the order to try them, every target at most once per pass: the lowest-numbered
        group with an available target first, the strategy's pick first inside it, then the rest
        as fallbacks. Open circuits, full half-open probes, ejected and saturated targets are
        skipped; an empty order means the alias is unavailable. ``regions`` is a hard filter, never a
        weight: a route outside them is not a candidate at all."""
        if not regions:
            return decide(self.groups, self.strategy, selection, rng)
        groups = [[t for t in g if t.regions & regions] for g in self.groups]
        return decide([g for g in groups if g], self.strategy, selection, rng)

    def group_of(self, target: RouteTarget) -> tuple[RouteTarget, ...]:
        for group in self.groups:
            if target in group:
                return group
        return (target,)
