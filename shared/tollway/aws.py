"""One botocore client per service and settings, built on first use and shared by the whole process.

Every store and sink that talks to AWS gets its client here: the audit store and the usage ledger
(DynamoDB), the lease store (DynamoDB: one client with retries, one without), the pricing store
(S3) and the audit shipper's SQS sink. A botocore client is thread-safe and keeps its own
connection pool, so one per distinct settings is enough. Building one loads the service's model,
which costs tens of milliseconds of CPU with the GIL held, so it is done once, under a lock, and the
client is reused: by the next store built with the same settings, and by a warm Lambda's next
invocation. The clients come from one botocore session, so a service's model is loaded once even
when several settings need their own client of it.

Each use passes its own timeouts, retries and pool size. They are part of the cache key: two uses
with different needs (the lease store's tight timeouts, the audit writer's wide pool) never share a
client. ``endpoint`` and ``region`` default to ``AWS_ENDPOINT_URL`` and to ``AWS_REGION``, then
``AWS_DEFAULT_REGION``, the order every store's settings read them in; the environment is read at
each call, so a changed environment gets a client of its own rather than a stale one.

At import this module needs only the standard library, and it imports botocore, never boto3, when
the first client is built: the Lambda extension imports the audit shipper (and so this module) with
only the standard library and the runtime's boto3, and the governance layer may not import boto3 at
all (the import-linter contracts in ``pyproject.toml``). Errors from botocore (no region, partial
credentials) propagate: each caller maps them to its own error.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from tollway.exceptions import TollwayError

__all__ = ["ClientsClosed", "Credentials", "ThreadedClients", "cache_clear", "cache_size", "client", "endpoint_url"]

DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0
DEFAULT_READ_TIMEOUT_S: Final = 10.0
DEFAULT_RETRIES: Final = 3
DEFAULT_MAX_POOL_CONNECTIONS: Final = 10
"""botocore's own default."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Keys given explicitly (the SQS sink's, from the environment it is handed); ``repr`` shows none of them."""

    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Credentials | None:
        """``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` of ``env``;
        ``None`` when it holds none of them, so botocore's default chain applies."""
        found = cls(env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN"))
        return found if found != cls() else None


_Key = tuple[str, str | None, str | None, float, float, int, int, bool, Credentials | None]

_T = TypeVar("_T")
_clients: dict[_Key, Any] = {}
_lock = threading.Lock()
_session: Any = None


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def endpoint_url(endpoint: str | None) -> str | None:
    """The ``endpoint_url`` to build a client with: ``None`` when ``endpoint`` is ``$AWS_ENDPOINT_URL`` (or unset).

    botocore resolves a client's endpoint itself: ``AWS_ENDPOINT_URL_<SERVICE>`` (``AWS_ENDPOINT_URL_DYNAMODB``)
    first, then ``AWS_ENDPOINT_URL``. An explicit ``endpoint_url`` skips both, so passing the generic
    variable's value explicitly would send every service there, even one the environment routes
    elsewhere (LocalStack for most services, moto for DynamoDB). Only an endpoint that differs from
    the environment's is passed on as given.
    """
    if endpoint is None:
        return None
    generic = _env("AWS_ENDPOINT_URL")
    if generic is not None and endpoint.rstrip("/") == generic.rstrip("/"):
        return None
    return endpoint


def client(
    service: str,
    *,
    region: str | None = None,
    endpoint: str | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
    max_pool_connections: int = DEFAULT_MAX_POOL_CONNECTIONS,
    s3_path_style: bool = False,
    credentials: Credentials | None = None,
) -> Any:
    """The botocore client of ``service`` for these settings: the same object for the same settings.

    ``retries`` counts the retries after the first attempt, as botocore's
    ``retries={"max_attempts": n}`` does (standard retry mode): 0 sends a call once, 1 up to twice.
    ``s3_path_style`` addresses buckets in the path (an emulator has no per-bucket host names).
    ``credentials`` ``None`` is botocore's default chain.
    """
    key: _Key = (
        service,
        endpoint or _env("AWS_ENDPOINT_URL"),
        region or _env("AWS_REGION") or _env("AWS_DEFAULT_REGION"),
        connect_timeout_s,
        read_timeout_s,
        retries,
        max_pool_connections,
        s3_path_style,
        credentials,
    )
    found = _clients.get(key)  # a dict read is atomic: the hot path takes no lock
    if found is not None:
        return found
    with _lock:
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = _build(key)
        return found


def _build(key: _Key) -> Any:
    """A new client; called under the lock (creating clients from one botocore session is not thread-safe)."""
    from botocore.config import Config
    from botocore.session import get_session

    global _session
    service, endpoint, region, connect_timeout_s, read_timeout_s, retries, pool, path_style, credentials = key
    config = Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"max_attempts": retries, "mode": "standard"},
        max_pool_connections=pool,
        s3={"addressing_style": "path"} if path_style else None,
    )
    if _session is None:
        _session = get_session()
    keys = credentials or Credentials()
    return _session.create_client(
        service,
        region_name=region,
        endpoint_url=endpoint_url(endpoint),
        config=config,
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        aws_session_token=keys.session_token,
    )


def cache_size() -> int:
    """How many clients are built (tests check that importing a handler builds none)."""
    return len(_clients)


def cache_clear() -> None:
    """Forget every client and the session (tests; a client in use keeps working)."""
    global _session
    with _lock:
        _clients.clear()
        _session = None


class ClientsClosed(TollwayError):
    """A call on :class:`ThreadedClients` after :meth:`ThreadedClients.close` (or during it)."""


class ThreadedClients:
    """botocore clients built on first use, and a small thread pool of their own to call them from
    async code: a store's calls never block the event loop, nor wait behind the loop's default
    executor. ``clients`` preset some (tests pass stubbed ones). The stores that use it (the PII
    vault, the content store) map botocore's errors, and :class:`ClientsClosed`, to their own."""

    def __init__(
        self,
        *,
        threads: int,
        thread_name: str,
        region: str | None,
        endpoint: str | None,
        connect_timeout_s: float,
        read_timeout_s: float,
        retries: int,
        s3_path_style: bool = False,
        clients: dict[str, Any] | None = None,
    ) -> None:
        self._settings = (region, endpoint, connect_timeout_s, read_timeout_s, retries, s3_path_style)
        self._threads = threads
        self._thread_name = thread_name
        self._clients: dict[str, Any] = dict(clients or {})
        self._executor: ThreadPoolExecutor | None = None
        self.closed = False

    @property
    def built(self) -> frozenset[str]:
        """The services whose client exists (built, or preset)."""
        return frozenset(self._clients)

    def client(self, service: str) -> Any:
        found = self._clients.get(service)
        if found is None:
            region, endpoint, connect_s, read_s, retries, path_style = self._settings
            found = self._clients[service] = client(
                service,
                region=region,
                endpoint=endpoint,
                connect_timeout_s=connect_s,
                read_timeout_s=read_s,
                retries=retries,
                s3_path_style=path_style and service == "s3",
            )
        return found

    def _pool(self) -> ThreadPoolExecutor:
        if self.closed:
            raise ClientsClosed
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix=self._thread_name)
        return self._executor

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in the pool; raises :class:`ClientsClosed` once closed, and what ``fn`` raises."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool(), fn, *args)
        except RuntimeError:
            if self.closed:  # the pool was shut down while the call waited for it
                raise ClientsClosed from None
            raise

    def call(self, service: str, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        """One botocore call, synchronously (what :meth:`run` runs)."""
        response: dict[str, Any] = getattr(self.client(service), operation)(**request)
        return response

    def close(self) -> None:
        self.closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
