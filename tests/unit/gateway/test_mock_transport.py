"""``MockTransport`` keeps the promises of the real clients the gateway tests rely on it for."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.fakes.transport import DEFAULT_SETTINGS, MockRequest, MockResponse, MockTransport, connect_error
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.wire import UpstreamRequest

REQUEST = UpstreamRequest("chat/completions", b"{}", {"content-type": "application/json"}, stream=False)


async def test_credential_headers_are_sent_over_the_codecs_and_response_names_are_lower_cased() -> None:
    seen: list[MockRequest] = []

    def handler(request: MockRequest) -> MockResponse:
        seen.append(request)
        return MockResponse(200, {"Retry-After": "1", "X-Request-Id": "abc"}, b"ok")

    transport = MockTransport(handler, auth_headers={"authorization": "Bearer sk-1"}, provider="p0")
    status, headers, body = await transport.send(dataclasses.replace(REQUEST, headers={"authorization": "client"}))

    assert (status, dict(headers), body) == (200, {"retry-after": "1", "x-request-id": "abc"}, b"ok")
    assert seen == transport.requests
    assert (seen[0].provider, seen[0].headers["authorization"]) == ("p0", "Bearer sk-1")


async def test_an_answer_over_max_response_bytes_is_malformed() -> None:
    settings = dataclasses.replace(DEFAULT_SETTINGS, max_response_bytes=4)
    transport = MockTransport(lambda _: MockResponse(200, body=b"12345"), settings=settings)

    with pytest.raises(UpstreamError) as info:
        await transport.send(REQUEST)

    assert (info.value.category, info.value.status) == (UpstreamCategory.MALFORMED, 200)


async def test_a_scripted_error_is_raised_instead_of_an_answer() -> None:
    transport = MockTransport(lambda _: MockResponse.failing(connect_error()))

    with pytest.raises(UpstreamError) as info:
        await transport.send(REQUEST)

    assert info.value.category is UpstreamCategory.CONNECT


async def test_a_deadline_already_passed_cancels_the_call_as_it_would_a_socket_read() -> None:
    transport = MockTransport(lambda _: MockResponse(200, body=b"too late"))
    loop = asyncio.get_running_loop()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout_at(loop.time() - 1):
            await transport.send(REQUEST)


async def test_a_stream_reads_on_where_its_error_body_read_stopped_and_closes_with_its_context() -> None:
    chunks = [b"ab", b"cd", b"ef"]
    transport = MockTransport(lambda _: MockResponse(200, chunks=chunks))

    async with transport.stream(REQUEST) as upstream:
        head = await upstream.read_bounded(3)
        rest = [chunk async for chunk in upstream.aiter_bytes()]

    assert (head, rest) == (b"abc", [b"ef"])  # the limit cuts the chunk it ends in, as read_prefix does
    assert [s.closed for s in transport.streams] == [True]


async def test_a_stream_that_stalls_fails_at_the_idle_timeout() -> None:
    settings = dataclasses.replace(DEFAULT_SETTINGS, stream_idle_timeout_s=0.02)
    transport = MockTransport(lambda _: MockResponse(200, chunks=[b"a"], ends="stall"), settings=settings)

    got: list[bytes] = []
    with pytest.raises(UpstreamError) as info:
        async with transport.stream(REQUEST) as upstream:
            async for chunk in upstream.aiter_bytes():
                got.append(chunk)

    assert got == [b"a"]
    assert info.value.category is UpstreamCategory.TIMEOUT
