"""``pii:`` compiled at publication: each profile's detector, and the placeholder keys.

Detectors are compiled once per publication (custom patterns and dictionaries included), so a
request only runs them. The keys come through the secret resolver like provider credentials:
``pii.keySecretRef`` is the current key, ``previousKeySecretRefs`` keys still accepted while
placeholders minted under them may be alive.
"""

from __future__ import annotations

import hashlib

from tollway.config.schema import RouterConfig
from tollway.exceptions import ConfigError, ConfigIssue
from tollway.pii.detectors import CustomPattern, Dictionary, build_detector
from tollway.pii.placeholders import PlaceholderKey, PlaceholderMinter
from tollway.pii.policy import PiiKeys, PiiProfile
from tollway.secrets import SecretResolver

__all__ = ["MIN_KEY_BYTES", "compile_pii_profiles", "pii_keys"]

MIN_KEY_BYTES = 32


def compile_pii_profiles(cfg: RouterConfig) -> dict[str, PiiProfile]:
    """Every profile an alias uses, by id (validation has refused unused and unknown ones)."""
    used = {m.piiProfileId for m in cfg.models if m.piiProfileId}
    out: dict[str, PiiProfile] = {}
    for p in cfg.pii.profiles:
        if p.id not in used:
            continue
        detector = build_detector(
            p.detectors,
            [CustomPattern(c.name, c.pattern) for c in p.customPatterns],
            [Dictionary(d.name, tuple(d.terms), d.caseSensitive) for d in p.dictionaries],
        )
        out[p.id] = PiiProfile(
            id=p.id,
            detector=detector,
            scope=p.scope,
            unresolved=p.unresolvedTokenPolicy,
            streaming=p.streaming,
            enrichment=p.promptEnrichment,
            ttl_s=p.sessionTtlSeconds,
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
