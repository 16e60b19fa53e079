"""``MockTransport``: the gateway's ``Transport`` answered by a test's handler, in the manner of
``httpx.MockTransport``, so the attempt loop can be driven with no socket and no server.

The handler sees each outgoing call as a ``MockRequest`` (what the codec encoded, the headers a
real client would send, and which provider the transport was built for) and answers with a
``MockResponse``: a status, headers, and a body or the chunks of a stream; or an error instead
of any answer (a refused connection); or, after the chunks, a cut or a stall.

It keeps the promises the real clients (``tollway.transport``) keep, so the gateway cannot tell
it from one: every call yields to the event loop before it answers, as a socket read would (so a
deadline already passed cancels it); header names arrive lower-cased; a buffered answer must
come within ``request_timeout_s`` and be no larger than ``max_response_bytes``; each stream
chunk must come within ``min(stream_idle_timeout_s, request_timeout_s)`` of the last, time the
consumer spends not reading aside; each of those failures is the ``UpstreamError`` a real client
raises; and leaving a stream's context closes it, as closing its connection would.
"""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import orjson

from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.transport import HttpClient, Transport, TransportSettings
from tollway.transport.base import MAX_ERROR_BODY, ConnectTiming, TransportFactory, read_prefix
from tollway.wire import UpstreamRequest

__all__ = [
    "DEFAULT_SETTINGS",
    "End",
    "Handler",
    "MockRequest",
    "MockResponse",
    "MockStream",
    "MockTransport",
    "Script",
    "connect_error",
    "connection_lost",
    "read_timeout",
]

DEFAULT_SETTINGS = TransportSettings(
    base_url="https://mock.invalid/v1", connect_timeout_s=1.0, request_timeout_s=60.0, stream_idle_timeout_s=60.0
)
"""For a transport used on its own: timeouts long enough never to be what a test observes."""

Chunks: TypeAlias = Iterable[bytes] | AsyncIterable[bytes]
End: TypeAlias = Literal["close", "stall"] | UpstreamError
"""How an answer ends after its last chunk: cleanly, by sending nothing more with the connection
left open (the client's read timeout or the caller's deadline decides), or with an error."""


def connect_error() -> UpstreamError:
    """What a real client raises for a refused or reset connection attempt."""
    return UpstreamError(UpstreamCategory.CONNECT, detail="connect failed")


def read_timeout() -> UpstreamError:
    """What a real client raises when an answer, or the next chunk of one, is late."""
    return UpstreamError(UpstreamCategory.TIMEOUT, detail="read timeout")


def connection_lost() -> UpstreamError:
    """What a real client raises when the connection drops in the middle of an answer."""
    return UpstreamError(UpstreamCategory.SERVER, detail="connection lost (ConnectionResetError)")


@dataclass(frozen=True, slots=True)
class MockRequest:
    """One call as it left the transport."""

    provider: str | None
    """The provider id the transport was built for (``None`` when it was not told)."""
    base_url: str
    path: str
    body: bytes
    headers: Mapping[str, str]
    """The codec's headers with the deployment's credential headers over them, as a real client sends."""
    stream: bool

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass(frozen=True, slots=True)
class MockResponse:
    """What the handler answers. A list of chunks can be answered again; a generator only once."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: Chunks | None = None
    """The body chunk by chunk (``None``: ``body`` in one chunk); what a stream reads."""
    raises: UpstreamError | None = None
    """Raised instead of any answer: a connection refused, a connect timeout."""
    ends: End = "close"

    @classmethod
    def json(cls, doc: object, status: int = 200, headers: Mapping[str, str] | None = None) -> MockResponse:
        return cls(status, {"content-type": "application/json", **(headers or {})}, orjson.dumps(doc))

    @classmethod
    def failing(cls, error: UpstreamError) -> MockResponse:
        return cls(raises=error)


Handler: TypeAlias = Callable[[MockRequest], MockResponse | Awaitable[MockResponse]]
"""Answers one call; an async handler that never returns is a provider that never answers."""


class MockStream:
    """An open streamed answer (``UpstreamStream``), which records whether it was closed."""

    def __init__(self, response: MockResponse, idle_s: float) -> None:
        self._status = response.status
        self._headers = {k.lower(): v for k, v in response.headers.items()}
        self._idle_s = idle_s
        self._source = _body(response)
        self.closed = False
        self.delivered = 0
        """Chunks handed to the reader so far."""

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The rest of the body; every call continues where the last one stopped, as a socket does."""
        while True:
            wait = asyncio.timeout(self._idle_s)
            try:
                async with wait:
                    chunk = await anext(self._source)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if wait.expired():
                    raise read_timeout() from None
                raise
            self.delivered += 1
            yield chunk

    async def read_bounded(self, limit: int = MAX_ERROR_BODY) -> bytes:
        return await read_prefix(self.aiter_bytes(), limit)

    async def aclose(self) -> None:
        self.closed = True
        await self._source.aclose()


async def _body(response: MockResponse) -> AsyncGenerator[bytes, None]:
    """The answer's chunks, then its end."""
    chunks = response.chunks if response.chunks is not None else ([response.body] if response.body else [])
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
    else:
        for chunk in chunks:
            yield chunk
    ends = response.ends
    if ends == "stall":
        await asyncio.get_running_loop().create_future()  # never resolved: only a timeout ends it
    elif isinstance(ends, UpstreamError):
        raise ends


class MockTransport:
    """A ``Transport`` whose calls the handler answers. Transports built from it with :meth:`bind`
    (or a ``Publisher`` given :meth:`factory`) share its handler and its logs, so one object
    sees every call a root's deployments make, each tagged with its provider."""

    def __init__(
        self,
        handler: Handler,
        *,
        settings: TransportSettings = DEFAULT_SETTINGS,
        auth_headers: Mapping[str, str] | None = None,
        provider: str | None = None,
    ) -> None:
        self.handler = handler
        self.settings = settings
        self.auth_headers: Mapping[str, str] = dict(auth_headers or {})
        self.provider = provider
        self.requests: list[MockRequest] = []
        """Every call, in the order sent, through this transport and those bound from it."""
        self.streams: list[MockStream] = []
        """Every stream opened, in order."""
        self.built: list[MockTransport] = []
        """The transports bound from this one."""
        self.closed = False

    def bind(
        self, settings: TransportSettings, auth_headers: Mapping[str, str], provider: str | None = None
    ) -> MockTransport:
        """A transport for one deployment: its own settings, credential and name, this one's handler and logs."""
        child = MockTransport(self.handler, settings=settings, auth_headers=auth_headers, provider=provider)
        child.requests, child.streams = self.requests, self.streams
        self.built.append(child)
        return child

    def factory(self, names: Mapping[str, str] | None = None) -> TransportFactory:
        """A ``Publisher.transport_factory`` binding one transport per provider; ``names`` (read at
        each build, so it may be filled in later) gives the provider id of each base URL."""

        def build(client: HttpClient, settings: TransportSettings, auth_headers: Mapping[str, str]) -> Transport:
            del client  # every client looks the same from the gateway's side
            return self.bind(settings, auth_headers, None if names is None else names.get(settings.base_url))

        return build

    def _record(self, req: UpstreamRequest, timing: ConnectTiming | None) -> MockRequest:
        if timing is not None and self.settings.trace_connect:
            timing.connect_s = 0.0  # no connection to set up: as for a pooled one, reused
        request = MockRequest(
            provider=self.provider,
            base_url=self.settings.base_url,
            path=req.path,
            body=req.body,
            headers={**req.headers, **self.auth_headers},
            stream=req.stream,
        )
        self.requests.append(request)
        return request

    async def _answer(self, request: MockRequest) -> MockResponse:
        await asyncio.sleep(0)  # a real call always waits on its socket at least once
        answer = self.handler(request)
        response = answer if isinstance(answer, MockResponse) else await answer
        if response.raises is not None:
            raise response.raises
        return response

    async def send(
        self, req: UpstreamRequest, timing: ConnectTiming | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        request = self._record(req, timing)
        budget = asyncio.timeout(self.settings.request_timeout_s)
        try:
            async with budget:
                response = await self._answer(request)
                body = b"".join([chunk async for chunk in _body(response)])
        except TimeoutError:
            if budget.expired():
                raise read_timeout() from None
            raise
        if len(body) > self.settings.max_response_bytes:
            raise UpstreamError(UpstreamCategory.MALFORMED, status=response.status, detail="response too large")
        return response.status, {k.lower(): v for k, v in response.headers.items()}, body

    @asynccontextmanager
    async def stream(self, req: UpstreamRequest, timing: ConnectTiming | None = None) -> AsyncIterator[MockStream]:
        request = self._record(req, timing)
        idle_s = min(self.settings.stream_idle_timeout_s, self.settings.request_timeout_s)
        head = asyncio.timeout(idle_s)
        try:
            async with head:
                response = await self._answer(request)
        except TimeoutError:
            if head.expired():
                raise read_timeout() from None
            raise
        stream = MockStream(response, idle_s)
        self.streams.append(stream)
        try:
            yield stream
        finally:
            await stream.aclose()

    async def aclose(self) -> None:
        self.closed = True


class Script:
    """A handler answering each provider from its own list, in order, the last answer repeating:
    ``Script({"p0": [error(503), completion()], "p1": completion()})``. A call to a provider the
    script does not name fails the test."""

    def __init__(self, answers: Mapping[str, MockResponse | Sequence[MockResponse]]) -> None:
        self._answers = {p: [a] if isinstance(a, MockResponse) else list(a) for p, a in answers.items()}
        self.calls: dict[str, int] = dict.fromkeys(self._answers, 0)
        """Calls answered per provider."""

    def __call__(self, request: MockRequest) -> MockResponse:
        provider = request.provider
        assert provider in self._answers, f"no answer scripted for provider {provider!r}"
        answers = self._answers[provider]
        n = self.calls[provider]
        self.calls[provider] = n + 1
        return answers[min(n, len(answers) - 1)]
