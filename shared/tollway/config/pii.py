"""``pii:`` compiled at publication: each profile's detector, and the placeholder keys.

Detectors are compiled once per publication (custom patterns and dictionaries included), so a
request only runs them. The keys come through the secret resolver like provider credentials:
``pii.keySecretRef`` is the current key, ``previousKeySecretRefs`` keys still accepted while
placeholders minted under them may be alive.

A profile with ``minPreservationRate`` admits only deployments measured to keep placeholders at
that rate (docs/pii.md, *Does the model keep the placeholders?*). Publication reads
``pii.conformanceFile`` (the results of ``tollway pii conformance``) every time, so a new
measurement takes effect on the next reload, and refuses each route of such an alias whose
result is missing or below the threshold. A route's result is the one labelled with its route id
(measured through a single-route alias) or, failing that, its alias's (all its routes together).
Embeddings aliases are not checked: no answer of theirs carries placeholders back.

A profile with ``engine: presidio`` gets a ``PresidioDetector``: its local rules plus Presidio's
``person`` and ``location`` (``tollway.pii.presidio``, which loads the model on first use, so only
a configuration with such a profile ever imports spaCy).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from tollway.config.schema import RouterConfig
from tollway.exceptions import ConfigError, ConfigIssue
from tollway.pii.conformance import ConformanceError, Results, load_results
from tollway.pii.detectors import CustomPattern, DetectorConfigError, Dictionary, build_detector
from tollway.pii.placeholders import PlaceholderKey, PlaceholderMinter
from tollway.pii.policy import PiiKeys, PiiProfile
from tollway.pii.presidio import PRESIDIO_KINDS, build_presidio_detector
from tollway.secrets import SecretResolver

__all__ = ["MIN_KEY_BYTES", "check_preservation", "compile_pii_profiles", "pii_keys"]

MIN_KEY_BYTES = 32


def compile_pii_profiles(cfg: RouterConfig, base: Path | None = None) -> dict[str, PiiProfile]:
    """Every profile an alias uses, by id (validation has refused unused and unknown ones).

    Raises ``ConfigError`` when a route is ineligible for its alias's profile (``base``: where a
    relative ``pii.conformanceFile`` is found)."""
    check_preservation(cfg, base)
    used = {m.piiProfileId for m in cfg.models if m.piiProfileId}
    out: dict[str, PiiProfile] = {}
    for i, p in enumerate(cfg.pii.profiles):
        if p.id not in used:
            continue
        detector = build_detector(
            [d for d in p.detectors if p.engine == "rules" or d not in PRESIDIO_KINDS],
            [CustomPattern(c.name, c.pattern) for c in p.customPatterns],
            [Dictionary(d.name, tuple(d.terms), d.caseSensitive) for d in p.dictionaries],
        )
        if p.engine == "presidio":
            try:
                detector = build_presidio_detector(detector, PRESIDIO_KINDS.intersection(p.detectors))
            except DetectorConfigError as exc:
                raise ConfigError([ConfigIssue(f"pii.profiles[{i}].engine", str(exc))]) from None
        out[p.id] = PiiProfile(
            id=p.id,
            detector=detector,
            scope=p.scope,
            unresolved=p.unresolvedTokenPolicy,
            streaming=p.streaming,
            enrichment=p.promptEnrichment,
            ttl_s=p.sessionTtlSeconds,
            offload=p.engine == "presidio",
        )
    return out


def pii_keys(cfg: RouterConfig, resolver: SecretResolver) -> PiiKeys:
    """The minter over the current and previous keys; each must hold at least 32 bytes."""
    refs = [cfg.pii.keySecretRef, *cfg.pii.previousKeySecretRefs]
    keys: list[PlaceholderKey] = []
    current = b""
    for i, ref in enumerate(refs):
        path = "pii.keySecretRef" if i == 0 else f"pii.previousKeySecretRefs[{i - 1}]"
        if ref is None:
            raise ConfigError([ConfigIssue(path, "required: placeholders are authenticated with this key")])
        raw = resolver.resolve(ref, path).reveal().encode("utf-8")
        if len(raw) < MIN_KEY_BYTES:
            raise ConfigError([ConfigIssue(path, f"the key must be at least {MIN_KEY_BYTES} bytes")])
        if i == 0:
            current = raw
        keys.append(PlaceholderKey(raw, hashlib.sha256(raw).hexdigest()[:8]))
    return PiiKeys(PlaceholderMinter(keys), current)


def check_preservation(cfg: RouterConfig, base: Path | None = None) -> None:
    """Refuse every route below its alias's profile's ``minPreservationRate`` (or never measured)."""
    thresholds = {p.id: p.minPreservationRate for p in cfg.pii.profiles if p.minPreservationRate is not None}
    gated = [
        (j, m) for j, m in enumerate(cfg.models) if m.piiProfileId in thresholds and "embeddings" not in m.operations
    ]
    if not gated:
        return
    results = _read_results(cfg.pii.conformanceFile, base)
    issues: list[ConfigIssue] = []
    for j, model in gated:
        profile = model.piiProfileId
        assert profile is not None
        need = thresholds[profile]
        assert need is not None
        for k, route in enumerate(model.routes):
            label = route.id if route.id in results.deployments else model.name
            found = results.deployments.get(label)
            if found is None:
                message = (
                    f"deployment {route.id!r} has no conformance result in pii.conformanceFile ({results.corpus}; "
                    f"looked up as {route.id!r} and {model.name!r}), required by PII profile {profile!r}'s "
                    f"minPreservationRate {_percent(need)}"
                )
            elif found.preserved < need:
                through = "" if found.alias == label else f" through {found.alias!r}"
                message = (
                    f"deployment {route.id!r} preserves {_percent(found.preserved, floor=True)} of placeholders "
                    f"({results.corpus}, measured as {label!r}{through}), below PII profile {profile!r}'s "
                    f"minPreservationRate {_percent(need)}"
                )
            else:
                continue
            issues.append(ConfigIssue(f"models[{j}].routes[{k}]", message))
    if issues:
        raise ConfigError(issues)


def _read_results(name: str, base: Path | None) -> Results:
    path = Path(name) if base is None or Path(name).is_absolute() else base / name
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([ConfigIssue("pii.conformanceFile", f"cannot read {name!r} ({exc.strerror})")]) from None
    try:
        return load_results(raw)
    except ConformanceError as exc:
        raise ConfigError([ConfigIssue("pii.conformanceFile", f"{name!r}: {exc}")]) from None


def _percent(rate: float, *, floor: bool = False) -> str:
    """``0.95`` as ``95%``. A measurement rounds down (``0.9549`` as ``95.4%``): never up to a threshold it misses."""
    tenths = math.floor(rate * 1000 + 1e-9) if floor else round(rate * 1000)
    return f"{tenths / 10:g}%"
