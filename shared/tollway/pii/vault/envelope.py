"""Envelope encryption of vault values: AES-256-GCM under data keys that a KMS key wraps.

Each value is sealed with AES-256-GCM under a 256-bit *data key*, with a fresh random 96-bit
nonce, and associated data (:func:`associated_data`) that binds the ciphertext to its item: the
token id, the scope binding, the kind, the tenant, the scope and both format versions. A
ciphertext copied onto another item, or an item whose kind, tenant or binding was altered, fails
authentication. The data key itself is stored only wrapped (encrypted) by the KMS key, beside
the ciphertext, with the KMS key's id; only KMS can unwrap it, and only for a caller its key
policy and IAM allow.

Data keys are cached so that the request path does not call KMS on every insert and resolve:

* **Sealing** uses one current data key for at most :attr:`KeyCachePolicy.max_age_s` seconds
  and :attr:`KeyCachePolicy.max_uses` values, whichever comes first, then asks KMS for a new
  one (``GenerateDataKey``). Concurrent inserts share one request for it. The use bound keeps a
  data key far below the 2³² random-nonce limit of GCM; the age bound limits how much one
  plaintext data key in memory can decrypt, and how long a disabled KMS key still seals.
* **Opening** keeps up to :attr:`KeyCachePolicy.unwrap_cache_size` unwrapped data keys, keyed by
  (KMS key id, wrapped key), each for at most :attr:`KeyCachePolicy.unwrap_ttl_s` seconds, least
  recently used out first; a miss calls KMS ``Decrypt`` once however many resolves wait for it.
  The current sealing key is in that cache too, so a value resolves right after its insert
  without a KMS call.

Plaintext data keys live only in this process's memory, inside the AES-GCM objects; Python
cannot wipe memory, so :meth:`Envelope.forget` drops the references and leaves the rest to the
garbage collector. A new process (a restart, another replica) starts with empty caches and
unwraps what it needs through KMS.

The KMS calls are behind :class:`DataKeySource`, so this module does no I/O itself and unit
tests count the calls. ``cryptography`` is imported when the first key is used.

The envelope knows nothing of the vault but its default error: the captured-content store
(``tollway.content.s3``) seals objects with it too, passing its own ``unavailable`` error and its
own associated data.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from tollway.pii.vault.base import VaultUnavailable

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ITEM_FORMAT", "DataKeySource", "Envelope", "KeyCachePolicy", "Sealed", "associated_data"]

ITEM_FORMAT: Final = 1
"""The version of the stored item's layout and of :func:`associated_data`'s encoding."""
DATA_KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12

_AAD_DOMAIN: Final = b"tollway.pii.vault"


@dataclass(frozen=True, slots=True)
class Sealed:
    """A sealed value as stored; ``repr`` shows none of it."""

    key_id: str
    """The KMS key (ARN) that wrapped the data key."""
    wrapped_key: bytes
    nonce: bytes
    ciphertext: bytes
    """AES-GCM ciphertext followed by its 16-byte tag."""

    def __repr__(self) -> str:
        return "Sealed(...)"


@dataclass(frozen=True, slots=True)
class KeyCachePolicy:
    """How long and how much a data key is used in memory (see the module docstring)."""

    max_age_s: float = 300.0
    max_uses: int = 100_000
    unwrap_cache_size: int = 256
    unwrap_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        if not (0 < self.max_age_s <= 86_400 and 1 <= self.max_uses <= 2**30):
            raise ValueError("max_age_s is (0, 86400] and max_uses 1..2**30")
        if not (0 <= self.unwrap_cache_size <= 100_000 and 0 < self.unwrap_ttl_s <= 86_400):
            raise ValueError("unwrap_cache_size is 0..100000 and unwrap_ttl_s (0, 86400]")


class DataKeySource(Protocol):
    """The KMS side: a new data key, and the unwrapping of a stored one."""

    async def generate(self) -> tuple[bytes, bytes, str]:
        """A new 256-bit data key: ``(plaintext, wrapped, key id)``. Raises :class:`VaultUnavailable`."""
        ...

    async def unwrap(self, wrapped: bytes, key_id: str) -> bytes | None:
        """The plaintext of ``wrapped``; ``None`` when KMS says it is not a valid ciphertext of
        ``key_id`` (a tampered item). Raises :class:`VaultUnavailable` for anything else."""
        ...


def associated_data(*, token_id: str, binding: bytes, kind: str, tenant: str, scope: str, token_format: int) -> bytes:
    """The AES-GCM associated data of one item: every field length-prefixed, so it parses one way."""
    parts = (
        _AAD_DOMAIN,
        str(ITEM_FORMAT).encode("ascii"),
        scope.encode("ascii"),
        str(token_format).encode("ascii"),
        token_id.encode("ascii"),
        kind.encode("ascii"),
        tenant.encode("utf-8"),
        bytes(binding),
    )
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def _vault_unavailable(detail: str) -> Exception:
    return VaultUnavailable(f"pii vault: {detail}")


def _aead(key: bytes, unavailable: Callable[[str], Exception] = _vault_unavailable) -> AESGCM:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:  # pragma: no cover - a broken install
        raise unavailable("the cryptography package is not installed") from None
    if len(key) != DATA_KEY_BYTES:
        raise unavailable(f"KMS returned a data key of {len(key)} bytes, not {DATA_KEY_BYTES}")
    return AESGCM(key)


class _DataKey:
    __slots__ = ("aead", "born", "key_id", "uses", "wrapped")

    def __init__(self, aead: AESGCM, key_id: str, wrapped: bytes, born: float) -> None:
        self.aead, self.key_id, self.wrapped, self.born, self.uses = aead, key_id, wrapped, born, 0

    def __repr__(self) -> str:
        return "_DataKey(...)"


_CacheKey = tuple[str, bytes]


class Envelope:
    """Seals and opens values with cached data keys; one per vault (and event loop).

    ``unavailable`` makes the error raised when a data key is unusable (a broken install, a key of
    the wrong size) from a message naming no key material; :class:`VaultUnavailable` by default.
    """

    def __init__(
        self,
        source: DataKeySource,
        policy: KeyCachePolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        unavailable: Callable[[str], Exception] = _vault_unavailable,
    ) -> None:
        self._source = source
        self._unavailable = unavailable
        self.policy = policy or KeyCachePolicy()
        self._clock = clock
        self._current: _DataKey | None = None
        self._lock = asyncio.Lock()
        self._unwrapped: OrderedDict[_CacheKey, tuple[AESGCM, float]] = OrderedDict()
        self._pending: dict[_CacheKey, asyncio.Task[AESGCM | None]] = {}

    def __repr__(self) -> str:
        return f"Envelope(policy={self.policy!r})"

    def _usable(self, key: _DataKey) -> bool:
        return key.uses < self.policy.max_uses and self._clock() - key.born < self.policy.max_age_s

    async def _sealing_key(self) -> _DataKey:
        while True:
            key = self._current
            if key is not None and self._usable(key):
                key.uses += 1  # no await between the check and the count: the loop runs one task at a time
                return key
            async with self._lock:
                key = self._current
                if key is None or not self._usable(key):
                    plaintext, wrapped, key_id = await self._source.generate()
                    fresh = _DataKey(_aead(plaintext, self._unavailable), key_id, wrapped, self._clock())
                    del plaintext
                    self._current = fresh
                    self._remember((key_id, wrapped), fresh.aead)

    async def seal(self, plaintext: bytes, aad: bytes) -> Sealed:
        """``plaintext`` under the current data key. Raises :class:`VaultUnavailable`."""
        key = await self._sealing_key()
        nonce = os.urandom(NONCE_BYTES)
        return Sealed(key.key_id, key.wrapped, nonce, key.aead.encrypt(nonce, plaintext, aad))

    async def open(self, sealed: Sealed, aad: bytes) -> bytes | None:
        """The plaintext, or ``None`` when the item fails authentication (tampered ciphertext,
        nonce, associated data or wrapped key). Raises :class:`VaultUnavailable` when KMS fails."""
        aead = await self._unwrap(sealed.key_id, sealed.wrapped_key)
        if aead is None:
            return None
        from cryptography.exceptions import InvalidTag  # present: an AES-GCM object exists

        try:
            return aead.decrypt(sealed.nonce, sealed.ciphertext, aad)
        except (InvalidTag, ValueError):  # ValueError: a nonce of the wrong length
            return None

    def _remember(self, cache_key: _CacheKey, aead: AESGCM) -> None:
        if self.policy.unwrap_cache_size == 0:
            return
        self._unwrapped[cache_key] = (aead, self._clock() + self.policy.unwrap_ttl_s)
        self._unwrapped.move_to_end(cache_key)
        while len(self._unwrapped) > self.policy.unwrap_cache_size:
            self._unwrapped.popitem(last=False)

    def _cached(self, cache_key: _CacheKey) -> AESGCM | None:
        found = self._unwrapped.get(cache_key)
        if found is None:
            return None
        aead, expires = found
        if self._clock() >= expires:
            del self._unwrapped[cache_key]
            return None
        self._unwrapped.move_to_end(cache_key)
        return aead

    async def _unwrap(self, key_id: str, wrapped: bytes) -> AESGCM | None:
        cache_key = (key_id, bytes(wrapped))
        found = self._cached(cache_key)
        if found is not None:
            return found
        task = self._pending.get(cache_key)
        if task is None:
            task = asyncio.ensure_future(self._fetch(cache_key))
            self._pending[cache_key] = task
            task.add_done_callback(lambda done: self._settled(cache_key, done))
        # shield: a resolve that is cancelled does not cancel the unwrap others wait for.
        return await asyncio.shield(task)

    def _settled(self, cache_key: _CacheKey, task: asyncio.Task[AESGCM | None]) -> None:
        if self._pending.get(cache_key) is task:
            del self._pending[cache_key]
        if not task.cancelled():
            task.exception()  # retrieved here, so an unwrap nobody awaits any more logs nothing

    async def _fetch(self, cache_key: _CacheKey) -> AESGCM | None:
        key_id, wrapped = cache_key
        plaintext = await self._source.unwrap(wrapped, key_id)
        if plaintext is None:
            return None
        aead = _aead(plaintext, self._unavailable)
        del plaintext
        self._remember(cache_key, aead)
        return aead

    def forget(self) -> None:
        """Drop every cached data key (and any unwrap in flight)."""
        self._current = None
        self._unwrapped.clear()
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()
