"""AWS Signature Version 4 for upstream requests: Amazon Bedrock authenticates each request by it.

A signature covers the method, the path, the signed headers, a hash of the body and the time, so
unlike an API key it cannot be a static header of the deployment: the transport asks a
``RequestSigner`` for the headers of each request just before sending it, and sends the request
exactly as signed (the same path bytes, and every header it passed with the same value).

The signature is botocore's own (``SigV4Auth``), so it follows AWS's canonicalization to the letter:
the path is URI-encoded once more (a model id's ``%3A`` is signed as ``%253A``), header values are
trimmed, and ``traceparent``, ``user-agent`` and the other headers proxies may rewrite are left
unsigned. Measured on CPython 3.11 with botocore 1.44.8 (one Converse request, 118-byte body),
``SigV4Auth.add_auth`` costs 49 µs of CPU per request and this signer, which drives the same steps
with its own clock, 43 µs: below the 100 µs at which a hand-written signer with a cached signing
key would pay for itself, so none is kept. A test checks the signatures against AWS's published
test vectors and against SigV4 written out from the specification.

Credentials come from a callable, read at every request, so temporary ones (an IAM role's, through
botocore's chain) are refreshed by their provider: ``botocore_credentials`` gives botocore's, and
refreshes temporary ones in a thread, never on the event loop (see ``_OffLoopCredentials``).
botocore is imported when a signer or a credentials provider is built, never at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from tollway.exceptions import ConfigError, ConfigIssue, UpstreamCategory, UpstreamError
from tollway.single_flight import SingleFlight

__all__ = ["AwsCredentials", "CredentialsProvider", "RequestSigner", "Signer", "botocore_credentials"]

_TIMESTAMP: Final = "%Y%m%dT%H%M%SZ"
_REFRESH_WAIT_S: Final = 10.0
"""How long a request whose credentials have expired waits for their refresh (off the loop)."""
_RETRY_AFTER_FAILURE_S: Final = 10.0
"""How long after a failed refresh the next one may start."""
_CHECK_EVERY_S: Final = 1.0
"""How long botocore's answer that no refresh is wanted is kept (see ``_OffLoopCredentials``)."""


class AwsCredentials(NamedTuple):
    """A key pair, and the session token of temporary credentials; botocore's signer reads these
    attribute names (as on its own ``ReadOnlyCredentials``)."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:
        return f"AwsCredentials(access_key={self.access_key[:4]}…)"


CredentialsProvider = Callable[[], AwsCredentials]
"""Current credentials; called once per signed request, so it must be cheap when nothing expires."""

Signer = Callable[[str, str, Mapping[str, str], bytes], Mapping[str, str]]
"""``(method, url, headers, body) -> headers to add``: the hook a transport calls per request."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RequestSigner:
    """Signs requests for one region and service (``bedrock`` for ``bedrock-runtime``).

    When the credentials provider has an async ``ready()`` (``botocore_credentials``' temporary
    credentials), the signer has it too, and the transports await it before signing."""

    __slots__ = ("_auth", "_clock", "_credentials", "_request", "ready", "region", "service")

    ready: Callable[[], Awaitable[None]]

    def __init__(
        self,
        credentials: CredentialsProvider,
        region: str,
        service: str = "bedrock",
        *,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        self._credentials = credentials
        self.region = region
        self.service = service
        self._clock = clock
        self._auth: Callable[[Any, str, str], Any] = SigV4Auth
        self._request: Callable[..., Any] = AWSRequest
        ready = getattr(credentials, "ready", None)
        if ready is not None:  # left unset otherwise: a transport then awaits nothing per request
            self.ready = ready

    def prime(self) -> None:
        """Fetch temporary credentials now, blocking (at publication, when a transport is built):
        ones that cannot be had fail it. Static credentials need nothing. Raises what the
        credentials provider raises."""
        prime = getattr(self._credentials, "prime", None)
        if prime is not None:
            prime()

    def __repr__(self) -> str:
        return f"RequestSigner(region={self.region!r}, service={self.service!r})"

    def __call__(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """The headers that authenticate this request: ``x-amz-date``, ``x-amz-security-token``
        for temporary credentials, and ``authorization``. ``headers`` are signed as given, and
        ``host`` as the URL names it (without a default port). Credentials that cannot be read
        (a role's refresh failed) fail the request as an ``UpstreamError`` of authentication."""
        try:
            creds = self._credentials()
        except Exception as exc:
            raise UpstreamError(
                UpstreamCategory.AUTHENTICATION, detail=f"AWS credentials unavailable ({type(exc).__name__})"
            ) from None
        timestamp = self._clock().astimezone(UTC).strftime(_TIMESTAMP)
        added = {"x-amz-date": timestamp}
        if creds.token:
            added["x-amz-security-token"] = creds.token
        request = self._request(method=method, url=url, data=body, headers={**headers, **added})
        request.context["timestamp"] = timestamp
        auth = self._auth(creds, self.service, self.region)
        string_to_sign = auth.string_to_sign(request, auth.canonical_request(request))
        signature = auth.signature(string_to_sign, request)
        signed = auth.signed_headers(auth.headers_to_sign(request))
        added["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, SignedHeaders={signed}, Signature={signature}"
        )
        return added


def botocore_credentials(profile: str | None = None, *, path: str = "providers") -> CredentialsProvider:
    """botocore's credential chain (environment, the shared files' ``profile``, the container's or
    the instance's role), as a provider that refreshes temporary credentials before they expire.

    Temporary credentials are fetched by the signer's ``prime()``, when a transport is built at
    publication, and then refreshed in a thread (botocore refreshes 15 minutes ahead of expiry; a
    refresh is a blocking call to the role's endpoint), so the event loop never waits on one. Raises ``ConfigError`` (at
    ``path``) when the chain finds no credentials or cannot read them (an unknown profile, a broken
    shared file): the issue names the exception's type, never its text, which may quote a file."""
    import botocore.credentials
    import botocore.exceptions
    import botocore.session

    where = f"profile {profile!r}" if profile else "the environment, shared files or instance role"
    try:
        found = botocore.session.Session(profile=profile).get_credentials()
    except botocore.exceptions.BotoCoreError as exc:
        problem = f"AWS credentials could not be read from {where} ({type(exc).__name__})"
        raise ConfigError([ConfigIssue(path, problem)]) from None
    if found is None:
        raise ConfigError([ConfigIssue(path, f"no AWS credentials found in {where}")])
    if isinstance(found, botocore.credentials.RefreshableCredentials):
        return _OffLoopCredentials(found)
    frozen: Callable[[], Any] = found.get_frozen_credentials
    return lambda: _aws(frozen())


def _aws(creds: Any) -> AwsCredentials:
    """botocore's frozen credentials as ``AwsCredentials``."""
    return AwsCredentials(creds.access_key, creds.secret_key, creds.token)


class _OffLoopCredentials:
    """botocore's temporary credentials for a signer on an event loop: refreshed in a thread.

    botocore refreshes temporary credentials inside ``get_frozen_credentials``, in whichever thread
    asks, once they are within 15 minutes of expiry: an HTTPS round trip to STS, or to the
    container's or the instance's endpoint, that would stall every request on the loop. Here the
    signing hook returns the credentials last read while they are valid and never calls botocore
    then; ``ready()``, which the transports await before signing, starts one refresh in a thread
    once botocore wants one. Requests meanwhile are signed with the credentials held (botocore wants
    a refresh at least 15 minutes before they expire); only a request that finds them expired waits
    for the refresh, at most ``_REFRESH_WAIT_S``, without blocking the loop. A failed refresh (or one
    after which botocore still wants another) is retried by a request ``_RETRY_AFTER_FAILURE_S``
    later, not by every request; while it is failing, expired credentials fail the request at once,
    as an authentication error. Only a caller that did not await ``ready()`` (a test, a script)
    refreshes in its own thread. ``prime()`` fetches the first credentials, blocking, when
    publication builds the transport; without it the first request fetches them in the thread.

    Asking botocore is not free: its expiry check takes about 11 µs (local time zones and datetime
    arithmetic), once in the hook and once in ``ready()`` per request. So while botocore wants no
    refresh, the answer is kept for ``_CHECK_EVERY_S``: credentials with more than botocore's
    15-minute window left are valid for the next second, and a request costs two clock reads.
    ``clock`` is wall-clock seconds (``time.time``: unlike a monotonic clock, it counts the time a
    frozen process slept past an expiry); it also times the retry after a failure.
    """

    __slots__ = ("_check_at", "_clock", "_current", "_flight", "_found")

    def __init__(self, found: Any, clock: Callable[[], float] = time.time) -> None:
        self._found = found
        self._clock = clock
        self._flight = SingleFlight(self._refresh, name="aws-credentials", clock=clock)
        self._check_at = 0.0
        """Until when (on ``clock``) botocore is known to want no refresh: the credentials hold."""
        self._current: AwsCredentials | None = None
        """The credentials last read; ``None`` until ``prime()`` or the first refresh."""

    def prime(self) -> None:
        """Fetch the credentials now, blocking: at publication, so that a role that cannot give
        them fails it. Raises what botocore raises."""
        self._current = self._read()

    def __repr__(self) -> str:
        return f"_OffLoopCredentials(method={getattr(self._found, 'method', None)!r})"

    def __call__(self) -> AwsCredentials:
        current = self._current
        if current is not None and (self._clock() < self._check_at or not self._found.refresh_needed(0)):
            return current  # not expired
        flight = self._flight
        if flight.inflight is not None or flight.failed_within(_RETRY_AFTER_FAILURE_S):
            raise RuntimeError("the AWS credentials expired and their refresh has not succeeded")
        self._current = self._read()
        return self._current

    async def ready(self) -> None:
        """Start a refresh in a thread when botocore wants one; wait for it (at most
        ``_REFRESH_WAIT_S``) only when the credentials held have expired."""
        now = self._clock()
        if now < self._check_at:
            return
        if self._current is not None and not self._found.refresh_needed():
            self._check_at = now + _CHECK_EVERY_S
            return
        future = self._flight.start_unless_failed_within(_RETRY_AFTER_FAILURE_S)
        if future is None:
            return
        if self._current is None or self._found.refresh_needed(0):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), _REFRESH_WAIT_S)

    def _read(self) -> AwsCredentials:
        return _aws(self._found.get_frozen_credentials())

    def _refresh(self) -> None:
        """Run by ``_flight``, in its thread: the credentials, read through botocore's refresh, kept."""
        self._current = self._read()
        if self._found.refresh_needed():
            # botocore logs and swallows a failed refresh until 10 minutes before expiry: still
            # wanting one means this one did not happen; as a failure, the next one waits out the
            # retry interval.
            raise RuntimeError("botocore still wants a refresh")
