"""Principals and Tollway keys: who is calling, and which aliases they may see.

Keys are stored as SHA-256 digests (or resolved from a secret reference at publication and
digested there). Authentication hashes the presented key once and looks the digest up in a
dict compiled into the published root: no I/O, no lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from tollway.exceptions import AuthenticationFailed

__all__ = ["Principal", "authenticate", "key_digest"]

_MAX_KEY_LENGTH = 512


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    tenant: str
    team: str | None
    kind: str
    roles: frozenset[str]
    allowed_aliases: frozenset[str]
    key_id: str
    regions: frozenset[str] = frozenset()
    """Where its traffic may be processed (empty: anywhere the alias allows)."""
    data_class: str | None = None

    def may_use(self, alias: str) -> bool:
        return alias in self.allowed_aliases


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authenticate(authorization: str | None, keys: Mapping[str, Principal]) -> Principal:
    """Resolve ``Authorization: Bearer <key>`` to its principal, or raise 401."""
    if not authorization:
        raise AuthenticationFailed("Missing API key. Send it as 'Authorization: Bearer <key>'.")
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or len(key) > _MAX_KEY_LENGTH:
        raise AuthenticationFailed("Invalid API key.")
    principal = keys.get(key_digest(key))
    if principal is None:
        raise AuthenticationFailed("Invalid API key.")
    return principal
