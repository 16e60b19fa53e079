"""Both upstream clients behind the ``Transport`` interface, against the real mock over real TCP."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator

import orjson
import pytest

from tests.support.transports import transport_settings
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.mock import MockServer
from tollway.transport import HttpClient, build_transport
from tollway.wire import UpstreamRequest

CLIENTS: list[HttpClient] = ["h1", "aiohttp", "httpx"]


class CountingProxy:
    """A TCP relay in front of the mock that counts the connections the client opens."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._relay(reader, up_writer), self._relay(up_reader, writer))

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def mock() -> AsyncIterator[MockServer]:
    async with MockServer() as server:
        yield server


def _req(stream: bool, **extra: object) -> UpstreamRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream, **extra}
    return UpstreamRequest("chat/completions", orjson.dumps(body), {"content-type": "application/json"}, stream)


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.parametrize("client", CLIENTS)
async def test_buffered_send_and_credentials_are_added(client: HttpClient, mock: MockServer) -> None:
    t = build_transport(client, transport_settings(mock.base_url), {"authorization": "Bearer sk-x"})
    try:
        status, _, body = await t.send(_req(False))
        assert status == 200 and b"hello" in body
        assert mock.app.requests[-1]["auth"] is True
    finally:
        await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_finished_streams_reuse_one_connection(client: HttpClient, mock: MockServer) -> None:
    proxy = CountingProxy(_port(mock.base_url))
    async with proxy as base:
        t = build_transport(client, transport_settings(base), {})
        try:
            for _ in range(5):
                async with t.stream(_req(True)) as resp:
                    data = b"".join([c async for c in resp.aiter_bytes()])
                    assert resp.status == 200 and b"[DONE]" in data
            if client in ("h1", "aiohttp"):
                assert proxy.connections == 1, "a stream read to its end returns its connection to the pool"
            else:
                assert proxy.connections >= 1
        finally:
            await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_abandoned_stream_closes_its_connection(client: HttpClient, mock: MockServer) -> None:
    proxy = CountingProxy(_port(mock.base_url))
    async with proxy as base:
        t = build_transport(client, transport_settings(base), {})
        try:
            for _ in range(2):
                async with t.stream(_req(True)) as resp:
                    async for _chunk in resp.aiter_bytes():
                        break
            headers = {"x-mock-chunk-gap-ms": "200", "x-mock-chunks": "10"}
            req = _req(True)
            slow = UpstreamRequest(req.path, req.body, {**req.headers, **headers}, True)
            async with t.stream(slow) as resp:
                async for _chunk in resp.aiter_bytes():
                    break
            async with t.stream(_req(True)) as resp:
                assert resp.status == 200
            assert proxy.connections >= 2, "an unfinished stream must not be handed to the next request"
        finally:
            await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_connect_failure_is_typed(client: HttpClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = build_transport(client, transport_settings(f"http://127.0.0.1:{port}"), {})
    try:
        with pytest.raises(UpstreamError) as info:
            await t.send(_req(False))
        assert info.value.category is UpstreamCategory.CONNECT
        assert str(port) not in str(info.value) and str(port) not in info.value.detail
    finally:
        await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_read_timeout_and_stream_idle_timeout_are_typed(client: HttpClient, mock: MockServer) -> None:
    t = build_transport(client, transport_settings(mock.base_url, request=0.2, idle=0.2), {})
    try:
        req = _req(False)
        slow = UpstreamRequest(req.path, req.body, {**req.headers, "x-mock-delay-ms": "1000"}, False)
        with pytest.raises(UpstreamError) as info:
            await t.send(slow)
        assert info.value.category is UpstreamCategory.TIMEOUT
        sreq = _req(True)
        stall = UpstreamRequest(
            sreq.path, sreq.body, {**sreq.headers, "x-mock-stall-at": "1", "x-mock-stall-ms": "2000"}, True
        )
        with pytest.raises(UpstreamError) as info:
            async with t.stream(stall) as resp:
                async for _ in resp.aiter_bytes():
                    pass
        assert info.value.category is UpstreamCategory.TIMEOUT
    finally:
        await t.aclose()


class Timing:
    connect_s: float | None = None


@pytest.mark.parametrize("client", CLIENTS)
async def test_connect_timing_tells_a_new_connection_from_a_reused_one(client: HttpClient, mock: MockServer) -> None:
    t = build_transport(client, dataclasses.replace(transport_settings(mock.base_url), trace_connect=True), {})
    try:
        first, second, streamed = Timing(), Timing(), Timing()
        await t.send(_req(False), first)
        await t.send(_req(False), second)
        async with t.stream(_req(True), streamed) as resp:
            assert b"[DONE]" in b"".join([c async for c in resp.aiter_bytes()])
        assert first.connect_s is not None and 0 < first.connect_s < 1.0  # a new TCP connection
        assert second.connect_s == 0.0  # the pooled one, reused
        assert streamed.connect_s is not None and streamed.connect_s < 1.0
    finally:
        await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_without_tracing_nothing_is_timed(client: HttpClient, mock: MockServer) -> None:
    t = build_transport(client, transport_settings(mock.base_url), {})
    try:
        timing = Timing()
        await t.send(_req(False), timing)
        assert timing.connect_s is None
    finally:
        await t.aclose()
