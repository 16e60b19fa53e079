"""Compiled alias plans: what a request may use, and in which order to try it.

Everything here is built once at publication. A request asks its plan for an attempt order
(priority groups, weighted random inside a group, skipping open circuits) and walks it under
one attempt budget.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from tollway.providers.base import ProviderCodec, ProviderFormat, Target
from tollway.routing.health import DeploymentHealth
from tollway.transport.base import Transport

__all__ = ["AliasPlan", "Deployment", "RetryPolicy", "RouteTarget"]


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """A provider binding: its codec and pooled transport, prebound at publication."""

    id: str
    format: ProviderFormat
    codec: ProviderCodec
    transport: Transport
    provider_account_id: str
    quota_group_id: str

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


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    base_backoff_s: float
    max_backoff_s: float
    retry_statuses: frozenset[int]

    def backoff(self, retry_number: int, retry_after: float | None, rng: random.Random) -> float:
        """Exponential backoff with full jitter, never shorter than the provider's Retry-After."""
        ceiling = min(self.max_backoff_s, self.base_backoff_s * (2 ** max(0, retry_number - 1)))
        delay = rng.uniform(0, ceiling) if ceiling > 0 else 0.0
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay


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
    weighted: bool = True

    def attempt_order(self, rng: random.Random) -> Iterator[RouteTarget]:
        """Targets in the order to try them: every target at most once per pass.

        Within a group, a weighted random permutation; open circuits are skipped, and a whole
        pass of skipped targets ends the order (the caller then reports the alias unavailable).
        """
        for group in self.groups:
            candidates = [t for t in group if t.weight > 0 and t.health.available()]
            if not self.weighted:
                yield from candidates
                continue
            while candidates:
                if len(candidates) == 1:
                    yield candidates.pop()
                    break
                total = sum(t.weight for t in candidates)
                pick = rng.uniform(0, total)
                acc = 0.0
                for i, t in enumerate(candidates):
                    acc += t.weight
                    if pick <= acc:
                        yield candidates.pop(i)
                        break
                else:
                    yield candidates.pop()
