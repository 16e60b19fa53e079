"""Target selection within priority groups: pure functions of targets, health and a request key.

``decide`` (and its list-returning twin ``order_targets``) walks the priority groups lowest
number first, drops unavailable targets (zero weight, open circuit without a free probe slot,
ejected, saturated), lets the strategy rank what is left in each group, and concatenates the
groups. The first element is the pick; the rest is the fallback order, each target at most once.
A group with nothing available is skipped, so the lowest *healthy* group leads.

Strategies (``STRATEGIES`` maps the ``routing.strategy`` names):

``ordered``
    Declaration order inside a group.
``priority-weighted`` (``WeightedRandom``)
    A weighted random permutation (Efraimidis-Spirakis keys ``u ** (1 / weight)``): the first
    pick is target *i* with probability ``weight_i / sum weight``.
``least-in-flight`` (``LeastInFlight``)
    Lowest ``in_flight / effective_weight`` first, ties broken by weighted random. Effective
    weights are clamped to ``[max_weight / max_weight_bias, max_weight]`` so a heavy target
    carries at most ``max_weight_bias`` times the in-flight load of a light one before the light
    one is preferred; an idle target always beats a busy one.
``latency-aware`` (``LatencyAware``)
    Lowest EWMA score first, ``ttft_weight * ewma_ttft + (1 - ttft_weight) * ewma_latency``
    (total latency alone when no TTFT was observed). With probability ``explore_probability``
    (at most 0.5) the pick is instead a weighted random target, taken among those with fewer
    than ``min_samples`` samples when there are any, so new and recovering targets are measured
    and slow ones are re-measured. Targets without samples rank after measured ones otherwise.
``sticky`` (``Sticky``)
    Weighted rendezvous hashing of (principal id, session id) with each route id: the score is
    ``-weight / ln(h)`` for ``h`` in (0, 1) from BLAKE2b, highest first. A session keeps its
    route while that route is available, and removing a route moves only that route's sessions.
    The principal id is part of the key, so tenants never share a session's placement. Without
    a session id the request falls back to ``WeightedRandom``.
``canary`` (``Canary``)
    BLAKE2b of (principal id — or request id —, alias, salt) to a basis point in [0, 10000), mapped
    to the first split whose cumulative share exceeds it. The split's routes lead (weighted
    random among them), the group's other routes follow as fallback. The bucket name is returned
    in ``RouteDecision.bucket`` for the audit record.

Every hash is BLAKE2b over length-prefixed UTF-8 fields, so placements are stable across
processes, restarts and Python versions (never the salted built-in ``hash``). Nothing here does
I/O, logs or reads a clock; ``SelectionInput.now`` is handed to the health objects.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

__all__ = [
    "BASIS_POINTS",
    "MAX_SESSION_ID_CHARS",
    "STRATEGIES",
    "Canary",
    "CanarySplit",
    "HealthView",
    "LatencyAware",
    "LeastInFlight",
    "Ordered",
    "Routable",
    "RouteDecision",
    "SelectionInput",
    "Sticky",
    "Strategy",
    "WeightedRandom",
    "basis_point",
    "decide",
    "order_targets",
    "rendezvous_score",
]

BASIS_POINTS = 10_000
MAX_SESSION_ID_CHARS = 256
"""Longer session ids are truncated before hashing; the gateway should reject them earlier."""


class HealthView(Protocol):
    """What selection reads from a target's runtime health (``DeploymentHealth`` has it)."""

    @property
    def in_flight(self) -> int: ...
    @property
    def ewma_ttft_s(self) -> float: ...
    @property
    def ewma_latency_s(self) -> float: ...
    @property
    def ttft_samples(self) -> int: ...
    @property
    def latency_samples(self) -> int: ...
    def available(self, now: float | None = None) -> bool: ...


class Routable(Protocol):
    """What a target must expose (``tollway.routing.plan.RouteTarget`` has it)."""

    @property
    def route_id(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def health(self) -> HealthView: ...


T = TypeVar("T", bound=Routable)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class SelectionInput:
    """The request facts a strategy may use. ``principal_id`` is the authenticated principal,
    never the OpenAI ``user`` field; ``now`` is the health clock's time (``None``: ask it)."""

    principal_id: str
    session_id: str | None = None
    request_id: str = ""
    now: float | None = None


@dataclass(slots=True)
class RouteDecision(Generic[R]):
    targets: list[R]
    """The pick first, then the fallback order; empty when nothing is available."""
    bucket: str | None = None
    """The canary/A-B bucket the request was assigned to, for the audit record."""


class Strategy(Protocol):
    """Ranks the available targets of one priority group. ``assign`` runs once per decision;
    its result (a bucket name, or ``None``) is passed to every ``rank`` call."""

    name: ClassVar[str]

    def assign(self, selection: SelectionInput) -> str | None: ...

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        """Return ``candidates`` reordered, best first (may reorder the list in place)."""
        ...


def _weighted_key(weight: int, rng: random.Random) -> float:
    """Efraimidis-Spirakis key: sorting by it descending gives a weighted random permutation."""
    key: float = rng.random() ** (1.0 / weight)
    return key


def _weighted_shuffle(candidates: list[T], rng: random.Random) -> list[T]:
    if len(candidates) > 1:
        keys = {id(t): _weighted_key(t.weight, rng) for t in candidates}
        candidates.sort(key=lambda t: keys[id(t)], reverse=True)
    return candidates


@dataclass(frozen=True, slots=True)
class Ordered:
    name: ClassVar[str] = "ordered"

    def assign(self, selection: SelectionInput) -> str | None:
        return None

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        return candidates


@dataclass(frozen=True, slots=True)
class WeightedRandom:
    name: ClassVar[str] = "priority-weighted"

    def assign(self, selection: SelectionInput) -> str | None:
        return None

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        return _weighted_shuffle(candidates, rng)


@dataclass(frozen=True, slots=True)
class LeastInFlight:
    name: ClassVar[str] = "least-in-flight"
    max_weight_bias: float = 4.0
    """A heavy target carries at most this many times a light one's in-flight load."""

    def __post_init__(self) -> None:
        if self.max_weight_bias < 1:
            raise ValueError("max_weight_bias must be at least 1")

    def assign(self, selection: SelectionInput) -> str | None:
        return None

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        if len(candidates) < 2:
            return candidates
        top = max(t.weight for t in candidates)
        floor = top / self.max_weight_bias
        keys = {
            id(t): (t.health.in_flight / max(float(t.weight), floor), -_weighted_key(t.weight, rng)) for t in candidates
        }
        candidates.sort(key=lambda t: keys[id(t)])
        return candidates


@dataclass(frozen=True, slots=True)
class LatencyAware:
    name: ClassVar[str] = "latency-aware"
    explore_probability: float = 0.1
    ttft_weight: float = 0.5
    """Share of the score from EWMA time to first token; the rest is EWMA total latency."""
    min_samples: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.explore_probability <= 0.5:
            raise ValueError("explore_probability must be within [0, 0.5]")
        if not 0 <= self.ttft_weight <= 1:
            raise ValueError("ttft_weight must be within [0, 1]")

    def assign(self, selection: SelectionInput) -> str | None:
        return None

    def score(self, health: HealthView) -> float:
        """Lower is better; ``inf`` without enough samples."""
        if health.latency_samples < self.min_samples:
            return math.inf
        if health.ttft_samples == 0:
            return health.ewma_latency_s
        return self.ttft_weight * health.ewma_ttft_s + (1 - self.ttft_weight) * health.ewma_latency_s

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        if len(candidates) < 2:
            return candidates
        keys = {id(t): (self.score(t.health), -_weighted_key(t.weight, rng)) for t in candidates}
        candidates.sort(key=lambda t: keys[id(t)])
        if self.explore_probability and rng.random() < self.explore_probability:
            unmeasured = [t for t in candidates if keys[id(t)][0] == math.inf]
            pool = unmeasured or candidates
            pick = pool[0] if len(pool) == 1 else _weighted_shuffle(list(pool), rng)[0]
            candidates.remove(pick)
            candidates.insert(0, pick)
        return candidates


def _field(h: hashlib.blake2b, value: str) -> None:
    raw = value.encode()
    h.update(len(raw).to_bytes(4, "big"))
    h.update(raw)


def rendezvous_score(key: hashlib.blake2b, route_id: str, weight: int) -> float:
    """Weighted rendezvous (highest random weight) score of ``route_id`` for a prepared key hash."""
    h = key.copy()
    _field(h, route_id)
    unit = (int.from_bytes(h.digest(), "big") + 1) / (2**64 + 1)
    return -weight / math.log(unit)


@dataclass(frozen=True, slots=True)
class Sticky:
    name: ClassVar[str] = "sticky"
    fallback: WeightedRandom = field(default_factory=WeightedRandom)

    def assign(self, selection: SelectionInput) -> str | None:
        return None

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        if not selection.session_id:
            return self.fallback.rank(candidates, selection, bucket, rng)
        if len(candidates) < 2:
            return candidates
        key = hashlib.blake2b(digest_size=8, person=b"tollway-sticky")
        _field(key, selection.principal_id)
        _field(key, selection.session_id[:MAX_SESSION_ID_CHARS])
        scores = {id(t): rendezvous_score(key, t.route_id, t.weight) for t in candidates}
        candidates.sort(key=lambda t: scores[id(t)], reverse=True)
        return candidates


def basis_point(key: str, alias: str, salt: str) -> int:
    """The stable allocation point of ``key`` for ``alias`` under ``salt``, in [0, 10000)."""
    h = hashlib.blake2b(digest_size=8, person=b"tollway-canary")
    _field(h, key)
    _field(h, alias)
    _field(h, salt)
    return int.from_bytes(h.digest(), "big") % BASIS_POINTS


@dataclass(frozen=True, slots=True)
class CanarySplit:
    name: str
    basis_points: int
    """This bucket's share of [0, 10000)."""
    route_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class Canary:
    """A stable A/B split of one alias's traffic. The splits must cover exactly 10000 basis
    points; changing ``salt`` reshuffles every assignment, changing a share moves only the
    keys at the boundary."""

    name: ClassVar[str] = "canary"
    alias: str
    salt: str
    splits: tuple[CanarySplit, ...]
    key: Literal["principal", "request"] = "principal"
    _bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = 0
        bounds = []
        for split in self.splits:
            if split.basis_points < 0:
                raise ValueError(f"canary split {split.name!r} has a negative share")
            total += split.basis_points
            bounds.append(total)
        if total != BASIS_POINTS:
            raise ValueError(f"canary splits must total {BASIS_POINTS} basis points, not {total}")
        if len({s.name for s in self.splits}) != len(self.splits):
            raise ValueError("canary split names must be unique")
        object.__setattr__(self, "_bounds", tuple(bounds))

    def point(self, selection: SelectionInput) -> int:
        key = selection.principal_id if self.key == "principal" else selection.request_id
        return basis_point(key, self.alias, self.salt)

    def assign(self, selection: SelectionInput) -> str | None:
        point = self.point(selection)
        for split, bound in zip(self.splits, self._bounds, strict=True):
            if point < bound:
                return split.name
        return None  # pragma: no cover - bounds end at BASIS_POINTS

    def rank(self, candidates: list[T], selection: SelectionInput, bucket: str | None, rng: random.Random) -> list[T]:
        routes = next((s.route_ids for s in self.splits if s.name == bucket), frozenset[str]())
        keys = {id(t): (t.route_id in routes, _weighted_key(t.weight, rng)) for t in candidates}
        candidates.sort(key=lambda t: keys[id(t)], reverse=True)
        return candidates


STRATEGIES: Mapping[str, Strategy] = {
    s.name: s for s in (Ordered(), WeightedRandom(), LeastInFlight(), LatencyAware(), Sticky())
}
"""The parameterless strategies by ``routing.strategy`` name (``canary`` needs its splits)."""


def decide(
    groups: Sequence[Sequence[T]], strategy: Strategy, selection: SelectionInput, rng: random.Random
) -> RouteDecision[T]:
    """Order every available target: priority groups as given (lowest number first), each
    group ranked by ``strategy``. Zero-weight and unavailable targets are left out."""
    bucket = strategy.assign(selection)
    now = selection.now
    out: list[T] = []
    for group in groups:
        candidates = [t for t in group if t.weight > 0 and t.health.available(now)]
        if candidates:
            out.extend(t for t in strategy.rank(candidates, selection, bucket, rng) if t not in out)
    return RouteDecision(out, bucket)


def order_targets(
    groups: Sequence[Sequence[T]], strategy: Strategy, selection: SelectionInput, rng: random.Random
) -> list[T]:
    """``decide(...).targets``: the pick first, then the fallback order."""
    return decide(groups, strategy, selection, rng).targets
