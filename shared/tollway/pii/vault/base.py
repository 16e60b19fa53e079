"""The PII vault interface: a durable token → value map for placeholders that outlive one request.

A ``session`` (or ``host``) scoped placeholder must resolve on any gateway replica, after a
restart, and on a later turn of the conversation, so its mapping lives in a vault rather than in
the request's memory. The interface is deliberately narrow (the seed's *Token Scope And Vault
Boundary*): insert one entry with its expiry, resolve one exact token under one binding, revoke
one token, and close. Nothing lists, scans, searches or exports entries, so neither a bug in the
pipeline nor a compromised gateway role can read the vault in bulk; a caller that does not hold
both the token id and its binding learns nothing.

Contract, for every implementation (``tests/support/pii_vault_contract.py`` checks each):

* :meth:`PiiVault.insert` never overwrites a live or revoked entry: a token id that has one
  raises :class:`TokenExists` (with the live entry's deadline, so a caller can remember that it is
  stored) and leaves the entry as it was. An active entry past its deadline but not yet purged is
  replaced: a session's ids are keyed hashes of its values, so without that, a value could never
  be stored again in a session that outlived its entries' TTL while the table had not purged them.
* :meth:`PiiVault.resolve` returns the value only for the exact token id, under the binding it
  was inserted with, while the entry is active and ``now`` is before its expiry. Every other case
  (unknown token, another binding, revoked, expired, an entry that fails its integrity check) is
  ``None``: the caller cannot tell them apart, and the placeholder stays masked.
* Expiry has whole-second resolution and rounds up (:func:`expiry_deadline`), so an entry never
  expires early, and it is enforced on every read: a store whose TTL deletes items late (DynamoDB
  takes up to days; moto never does) still returns nothing for an expired entry.
* :meth:`PiiVault.revoke` is idempotent and also discards the stored value (ciphertext), so a
  revoked entry holds nothing that could be recovered later; an unknown token is a no-op.
* Failures of the store itself are :class:`VaultUnavailable`. The pipeline turns one on insert
  into a 503 before any provider work, and leaves the placeholder masked on resolve.

No message of these errors, and no log line of an implementation, contains a value, a token id,
a binding, a data key or a ciphertext.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from tollway.exceptions import TollwayError

__all__ = [
    "MAX_VALUE_BYTES",
    "PiiVault",
    "TokenExists",
    "VaultEntry",
    "VaultError",
    "VaultScope",
    "VaultUnavailable",
    "expiry_deadline",
]

MAX_VALUE_BYTES: Final = 4096
"""The largest value (UTF-8) a vault holds: PII spans are short; this bounds every item and a
memory vault's footprint."""
MIN_BINDING_BYTES: Final = 16
MAX_BINDING_BYTES: Final = 64

_TOKEN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_KIND: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TENANT_MAX: Final = 256

VaultScope = Literal["session", "host"]
"""The durable scopes; ``request`` scope never reaches a vault."""


class VaultError(TollwayError):
    """A PII vault operation failed; the message never holds a value, a token id or a key."""


class VaultUnavailable(VaultError):
    """The vault could not be read or written (unreachable, throttled, misconfigured, KMS refused).

    The message names the backend, the operation and the error code only.
    """


class TokenExists(VaultError):
    """An insert named a token id that already has a live or revoked entry; it was left as it was.

    A random id (80 bits) means a bug or a replayed insert, never a normal collision. A session's
    ids are keyed hashes of their values, so there it means the value is stored already: until
    ``expires_at``, the live entry's deadline (``None`` when revoked or not reported).
    """

    def __init__(self, message: str, expires_at: float | None = None) -> None:
        super().__init__(message)
        self.expires_at = expires_at


@dataclass(frozen=True, slots=True)
class VaultEntry:
    """What a vault stores beside the encrypted value. ``repr`` omits the token id and binding.

    ``binding`` is the non-reversible scope binding the placeholder was minted under (a digest
    of tenant, principal and session, ``tollway.pii.placeholders.scope_binding``), never the
    session id itself. ``expires_at`` is epoch seconds.
    """

    token_id: str = field(repr=False)
    kind: str
    binding: bytes = field(repr=False)
    tenant: str
    expires_at: float
    scope: VaultScope = "session"
    token_format: int = 1
    """The placeholder grammar's version (``TWPII1`` is 1)."""

    def __post_init__(self) -> None:
        if not valid_token_id(self.token_id):
            raise ValueError("a token id is 1-128 ASCII letters, digits, '_' or '-'")
        if not isinstance(self.kind, str) or _KIND.fullmatch(self.kind) is None:
            raise ValueError("a PII kind is 1-32 ASCII letters, digits, '_' or '-'")
        if not isinstance(self.binding, bytes) or not MIN_BINDING_BYTES <= len(self.binding) <= MAX_BINDING_BYTES:
            raise ValueError(f"a binding is {MIN_BINDING_BYTES}-{MAX_BINDING_BYTES} bytes")
        if not isinstance(self.tenant, str) or not 1 <= len(self.tenant) <= _TENANT_MAX:
            raise ValueError(f"a tenant is 1-{_TENANT_MAX} characters")
        if not math.isfinite(self.expires_at) or self.expires_at <= 0:
            raise ValueError("expires_at is a positive epoch time in seconds")
        if self.scope not in ("session", "host"):
            raise ValueError("a vault entry's scope is 'session' or 'host'")
        if not 1 <= self.token_format <= 255:
            raise ValueError("token_format is 1-255")

    @property
    def deadline(self) -> int:
        """:func:`expiry_deadline` of ``expires_at``: what is stored and compared."""
        return expiry_deadline(self.expires_at)


def expiry_deadline(expires_at: float) -> int:
    """The whole epoch second from which an entry is expired: ``expires_at`` rounded up.

    Whole seconds because DynamoDB's TTL attribute is; rounded up so that no entry expires early.
    An entry is expired when ``now >= expiry_deadline(expires_at)``.
    """
    return math.ceil(expires_at)


def valid_token_id(token_id: object) -> bool:
    """Whether ``token_id`` has a token id's shape (a resolve of anything else is ``None`` at once)."""
    return isinstance(token_id, str) and _TOKEN_ID.fullmatch(token_id) is not None


def check_value(value: str) -> bytes:
    """``value`` as UTF-8; ValueError (which never quotes it) when it is empty or too long."""
    if not isinstance(value, str) or not value:
        raise ValueError("a vault value is a non-empty string")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a vault value must be encodable as UTF-8 (no lone surrogates)") from None
    if len(raw) > MAX_VALUE_BYTES:
        raise ValueError(f"a vault value is at most {MAX_VALUE_BYTES} bytes of UTF-8")
    return raw


class PiiVault(Protocol):
    """Insert with expiry, resolve one exact scoped token, revoke, close. Nothing scans or exports."""

    async def insert(self, entry: VaultEntry, value: str) -> None:
        """Store ``value`` for ``entry.token_id`` until ``entry.expires_at``; never overwrites.

        Raises :class:`TokenExists`, :class:`VaultUnavailable`, or ValueError for a value that
        is empty or over :data:`MAX_VALUE_BYTES`.
        """
        ...

    async def resolve(self, token_id: str, binding: bytes, now: float) -> str | None:
        """The value of ``token_id`` if it was inserted under ``binding``, is active and ``now``
        (epoch seconds) is before its deadline; else ``None``. Raises :class:`VaultUnavailable`."""
        ...

    async def revoke(self, token_id: str) -> None:
        """Deactivate ``token_id`` and discard its value; idempotent, a no-op for an unknown token.
        Raises :class:`VaultUnavailable`."""
        ...

    async def aclose(self) -> None:
        """Release the vault's resources and forget any cached key material; later calls raise
        :class:`VaultUnavailable`."""
        ...
