"""OAuth2 bearer tokens for Vertex AI: the request signer of a ``vertex`` deployment.

Vertex AI takes no API key. Each request carries ``authorization: Bearer <access token>``, a token
Google's credentials (a service account's key, or Application Default Credentials) exchange for
at the token endpoint, valid for about an hour. :class:`VertexTokenSigner` is a transport
``Signer`` (the same ``(method, url, headers, body) -> headers`` hook as SigV4's, so the transport
needs nothing new) that adds the current token.

Why the refresh is shaped this way: the hook is synchronous and runs on the event loop, and a
refresh is a blocking HTTPS round trip. So the token is fetched at publication
(:meth:`VertexTokenSigner.prime`), and a request that finds it within ``refresh_ahead_s`` of expiry
(5 minutes) starts one refresh in a background thread and is signed with the token it has, still
valid. A request that finds no valid token at all (none fetched yet, the process was frozen past
the expiry, or every refresh for the last five minutes failed) needs a refresh first: the
transports await :meth:`VertexTokenSigner.ready` before signing (every transport awaits a signer's
``ready`` when it has one), which waits for it, at most ``wait_s``, without blocking the loop. The
hook itself blocks only for a caller that did not await (``prime``, at publication), and never
while a refresh failed less than 10 s ago: then it fails at once as an authentication error, so a
token endpoint that is down costs each request nothing but that error. At most one refresh runs
at a time. The clock is injectable, so tests drive expiry without sleeping.

The token never leaves the header it is put in: reprs show the credentials' type, and a failed
refresh is reported by its exception's type only (a token endpoint's answer may quote the grant).

google-auth is imported when credentials are loaded or a token is fetched, never at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol

from tollway.exceptions import ConfigError, ConfigIssue, UpstreamCategory, UpstreamError
from tollway.single_flight import SingleFlight

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "GoogleCredentials",
    "VertexTokenSigner",
    "google_credentials",
]

CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
_TOKEN_TIMEOUT_S: Final = 10.0
"""A token request's own timeout; google-auth's default is two minutes."""
_RETRY_AFTER_FAILURE_S: Final = 10.0
"""How long a failed background refresh waits before the next request may start another."""


class GoogleCredentials(Protocol):
    """What the signer uses of ``google.auth.credentials.Credentials``."""

    token: str | None
    expiry: datetime | None
    """Naive UTC, as google-auth keeps it; ``None`` for a token without an expiry."""

    def refresh(self, request: Any) -> None: ...


class _Token(NamedTuple):
    header: str
    """``Bearer <token>``."""
    expires_at: float
    """On the signer's clock."""

    def __repr__(self) -> str:
        return f"_Token(expires_at={self.expires_at:.0f})"


def _transport_request() -> Callable[..., Any]:
    """google-auth's ``urllib3`` transport (urllib3 is already botocore's, so no ``requests``),
    with a bounded timeout per token request."""
    import google.auth.transport.urllib3
    import urllib3

    request = google.auth.transport.urllib3.Request(urllib3.PoolManager(num_pools=2, maxsize=2))  # type: ignore[no-untyped-call]

    def bounded(
        url: str, method: str = "GET", body: Any = None, headers: Any = None, timeout: Any = None, **kw: Any
    ) -> Any:
        limit = _TOKEN_TIMEOUT_S if timeout is None else min(float(timeout), _TOKEN_TIMEOUT_S)
        return request(url, method=method, body=body, headers=headers, timeout=limit, **kw)

    return bounded


class VertexTokenSigner:
    """Adds ``authorization: Bearer <token>`` to each request, from ``credentials`` scoped to
    ``cloud-platform``. ``clock`` is in seconds (``time.time`` by default); ``request`` makes
    google-auth's token requests (its ``urllib3`` transport by default)."""

    __slots__ = ("_ahead", "_clock", "_credentials", "_flight", "_request", "_token", "_wait")

    def __init__(
        self,
        credentials: GoogleCredentials,
        *,
        clock: Callable[[], float] = time.time,
        refresh_ahead_s: float = 300.0,
        wait_s: float = _TOKEN_TIMEOUT_S,
        request: Callable[..., Any] | None = None,
    ) -> None:
        self._credentials = credentials
        self._clock = clock
        self._ahead = refresh_ahead_s
        self._wait = wait_s
        self._request = request
        self._token: _Token | None = None
        self._flight = SingleFlight(self._fetch_and_keep, name="vertex-token", clock=clock)

    def __repr__(self) -> str:
        return f"VertexTokenSigner(credentials={type(self._credentials).__name__})"

    def __call__(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """The ``authorization`` header. Raises ``UpstreamError`` (authentication) when no valid
        token can be had within ``wait_s``."""
        token = self._token
        if token is not None:
            now = self._clock()
            if now < token.expires_at - self._ahead:
                return {"authorization": token.header}
            if now < token.expires_at:
                self._flight.start_unless_failed_within(_RETRY_AFTER_FAILURE_S)
                return {"authorization": token.header}
        flight = self._flight
        if flight.inflight is None and flight.failed_within(_RETRY_AFTER_FAILURE_S):
            raise UpstreamError(
                UpstreamCategory.AUTHENTICATION, detail="Google access token unavailable (refresh failed)"
            )
        return {"authorization": self._wait_for_token().header}

    def prime(self) -> None:
        """Fetch the first token now, blocking: at publication, so that credentials that cannot
        get one fail it. Raises ``UpstreamError`` (authentication)."""
        self._wait_for_token()

    async def ready(self) -> None:
        """Wait, without blocking the event loop, until a valid token is held (or the refresh
        failed: the next request then reports it)."""
        token = self._token
        if token is not None and self._clock() < token.expires_at:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(self._flight.start()), self._wait)

    @property
    def expires_at(self) -> float | None:
        """When the held token expires, on the signer's clock; ``None`` before the first."""
        token = self._token
        return token.expires_at if token is not None else None

    def _wait_for_token(self) -> _Token:
        future = self._flight.start()
        try:
            return future.result(timeout=self._wait)
        except FutureTimeout:
            raise UpstreamError(
                UpstreamCategory.AUTHENTICATION, detail="Google access token not fetched in time"
            ) from None
        except Exception as exc:
            raise UpstreamError(
                UpstreamCategory.AUTHENTICATION, detail=f"Google access token unavailable ({type(exc).__name__})"
            ) from None

    def _fetch_and_keep(self) -> _Token:
        """A new token, kept for the requests that follow (run by ``_flight``, in its thread)."""
        token = self._token = self._fetch_token()
        return token

    def _fetch_token(self) -> _Token:
        started, wall = self._clock(), datetime.now(UTC)
        if self._request is None:
            self._request = _transport_request()
        self._credentials.refresh(self._request)
        value, expiry = self._credentials.token, self._credentials.expiry
        if not value:
            raise ValueError("the credentials gave no access token")
        lifetime = 3600.0 if expiry is None else (expiry.replace(tzinfo=UTC) - wall).total_seconds()
        return _Token(f"Bearer {value}", started + lifetime)


def google_credentials(key_file: str | None = None, *, path: str = "providers") -> GoogleCredentials:
    """Credentials scoped to ``cloud-platform``: the service account key ``key_file`` (by default
    ``GOOGLE_APPLICATION_CREDENTIALS``), else Application Default Credentials (gcloud's user
    credentials, workload identity, the metadata server). Raises ``ConfigError`` at ``path`` when
    none are found or they cannot be read; the issue names the exception's type, never its text."""
    import google.auth
    import google.auth.exceptions
    from google.oauth2 import service_account

    key_file = key_file if key_file is not None else os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    where = "the service account key file" if key_file else "Application Default Credentials"
    try:
        if key_file and _is_service_account_key(key_file):
            from_file: Callable[..., GoogleCredentials] = service_account.Credentials.from_service_account_file
            return from_file(key_file, scopes=[CLOUD_PLATFORM_SCOPE])
        found, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except (google.auth.exceptions.GoogleAuthError, ValueError, OSError) as exc:
        problem = f"Google credentials could not be read from {where} ({type(exc).__name__})"
        raise ConfigError([ConfigIssue(path, problem)]) from None
    return found


def _is_service_account_key(key_file: str) -> bool:
    """Whether the file is a service account key; other kinds (a user's, an external account's)
    are left to ``google.auth.default``, which reads the same variable."""
    with open(key_file, "rb") as f:
        doc = json.load(f)
    return isinstance(doc, dict) and doc.get("type") == "service_account"
