"""Enterprise egress for the three upstream clients: a ``CONNECT`` proxy and a CA bundle.

Everything is real sockets on 127.0.0.1: the mock provider behind a TLS front whose certificate
only a throwaway CA vouches for, and a ``CONNECT`` proxy that records what it was asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tests.support.connect_proxy import ConnectProxy
from tests.support.tls_upstream import ThrowawayCa, TlsFront
from tests.support.transports import transport_settings
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.mock import MockServer
from tollway.transport import HttpClient, ProxySettings, Transport, TransportSettings, build_transport
from tollway.transport.base import basic_proxy_authorization
from tollway.wire import UpstreamRequest

CLIENTS: list[HttpClient] = ["h1", "aiohttp", "httpx"]
PROXY_SECRET = "s3cret-proxy-password"
RIGHT = basic_proxy_authorization(f"egress-user:{PROXY_SECRET}")


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCa:
    return ThrowawayCa.create(tmp_path)


@pytest.fixture
async def mock() -> AsyncIterator[MockServer]:
    async with MockServer() as server:
        yield server


@pytest.fixture
async def front(ca: ThrowawayCa, mock: MockServer) -> AsyncIterator[TlsFront]:
    async with TlsFront(ca, mock.base_url) as server:
        yield server


def _req(stream: bool) -> UpstreamRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    return UpstreamRequest("chat/completions", orjson.dumps(body), {"content-type": "application/json"}, stream)


def _settings(
    base: str, proxy: ConnectProxy, *, ca: ThrowawayCa | None, authorization: str | None = None
) -> TransportSettings:
    return dataclasses.replace(
        transport_settings(base),
        proxy=ProxySettings(proxy.url, authorization),
        ca_bundle=str(ca.bundle) if ca is not None else None,
    )


async def _send(client: HttpClient, settings: TransportSettings, count: int = 1) -> list[bytes]:
    t: Transport = build_transport(client, settings, {"authorization": "Bearer sk-upstream"})
    try:
        bodies = []
        for _ in range(count):
            status, _, body = await t.send(_req(False))
            assert status == 200
            bodies.append(body)
        return bodies
    finally:
        await t.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_request_tunnels_through_the_proxy_to_a_provider_trusted_by_the_bundle(
    client: HttpClient, ca: ThrowawayCa, mock: MockServer, front: TlsFront
) -> None:
    async with ConnectProxy(require=RIGHT) as proxy:
        [body] = await _send(client, _settings(front.base_url, proxy, ca=ca, authorization=RIGHT))
    assert b"hello" in body
    assert proxy.targets == [f"127.0.0.1:{front.port}"]
    assert proxy.authorizations == [RIGHT]
    assert mock.app.requests[-1]["auth"] is True, "the provider credential reached the provider"
    assert b"sk-upstream" not in b"".join(proxy.requests), "the provider credential never goes to the proxy"


@pytest.mark.parametrize("client", CLIENTS)
async def test_pooled_requests_reuse_one_tunnel(client: HttpClient, ca: ThrowawayCa, front: TlsFront) -> None:
    async with ConnectProxy() as proxy:
        await _send(client, _settings(front.base_url, proxy, ca=ca), count=3)
    assert len(proxy.targets) == 1
    assert front.connections == 1


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_flows_through_the_tunnel(client: HttpClient, ca: ThrowawayCa, front: TlsFront) -> None:
    async with ConnectProxy() as proxy:
        t = build_transport(client, _settings(front.base_url, proxy, ca=ca), {})
        try:
            async with t.stream(_req(True)) as resp:
                chunks = [chunk async for chunk in resp.aiter_bytes()]
                assert resp.status == 200
        finally:
            await t.aclose()
    data = b"".join(chunks)
    assert b"data: " in data and b"[DONE]" in data
    assert proxy.targets == [f"127.0.0.1:{front.port}"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_provider_the_system_store_does_not_trust_is_a_connect_failure(
    client: HttpClient, front: TlsFront
) -> None:
    async with ConnectProxy() as proxy:
        with pytest.raises(UpstreamError) as info:
            await _send(client, _settings(front.base_url, proxy, ca=None))
    assert info.value.category is UpstreamCategory.CONNECT
    assert "TLS" in info.value.detail
    assert proxy.targets == [f"127.0.0.1:{front.port}"], "the tunnel opened; the provider's certificate failed"


@pytest.mark.parametrize("authorization", [None, basic_proxy_authorization(f"egress-user:wrong-{PROXY_SECRET}")])
@pytest.mark.parametrize("client", CLIENTS)
async def test_a_proxy_refusing_the_credentials_is_a_connect_failure_that_names_no_secret(
    client: HttpClient, authorization: str | None, ca: ThrowawayCa, front: TlsFront
) -> None:
    async with ConnectProxy(require=RIGHT) as proxy:
        settings = _settings(front.base_url, proxy, ca=ca, authorization=authorization)
        with pytest.raises(UpstreamError) as info:
            await _send(client, settings)
    error = info.value
    assert error.category is UpstreamCategory.CONNECT and error.status is None
    assert "proxy authentication required" in error.detail
    shown = f"{error} {error!r} {error.detail} {settings!r}"
    assert PROXY_SECRET not in shown and "Basic" not in shown
    assert proxy.authorizations == [authorization]


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_https_proxy_is_verified_by_the_bundle_and_tunnels_tls_in_tls(
    client: HttpClient, ca: ThrowawayCa, front: TlsFront
) -> None:
    async with ConnectProxy(tls=ca.server_context()) as proxy:
        assert proxy.url.startswith("https://")
        [body] = await _send(client, _settings(front.base_url, proxy, ca=ca))
    assert b"hello" in body
    assert proxy.targets == [f"127.0.0.1:{front.port}"]


async def test_h1_tunnels_a_plain_http_provider_with_connect_too(mock: MockServer) -> None:
    async with ConnectProxy(require=RIGHT) as proxy:
        [body] = await _send("h1", _settings(mock.base_url, proxy, ca=None, authorization=RIGHT), count=1)
    assert b"hello" in body
    port = mock.base_url.rsplit(":", 1)[1]
    assert proxy.targets == [f"127.0.0.1:{port}"]
    assert proxy.requests[0].startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())


async def _silent_proxy(answer: bytes) -> tuple[asyncio.Server, str]:
    """A proxy that reads the ``CONNECT`` and answers ``answer`` (maybe nothing), keeping the socket open."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await reader.read()  # until the client gives up
        except (ConnectionError, asyncio.CancelledError):
            pass  # returned from, not raised: asyncio 3.11 logs a stream handler task that ends cancelled
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (b"HTTP/1.1 200 OK\r\nx-padding: " + b"a" * 20000, "too large"),
        (b"", "connect timeout"),
        (b"SSH-2.0-nope\r\n\r\n", "malformed"),
        (b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n", "refused the tunnel (403)"),
    ],
)
async def test_h1_bounds_the_proxy_answer_in_size_and_time(answer: bytes, detail: str) -> None:
    server, url = await _silent_proxy(answer)
    settings = dataclasses.replace(
        transport_settings("https://127.0.0.1:9", connect=0.5), proxy=ProxySettings(url, RIGHT)
    )
    t = build_transport("h1", settings, {})
    try:
        async with asyncio.timeout(5):
            with pytest.raises(UpstreamError) as info:
                await t.send(_req(False))
    finally:
        await t.aclose()
        server.close()
    assert info.value.category is UpstreamCategory.CONNECT
    assert detail in info.value.detail


def test_the_proxy_credential_stays_out_of_the_settings_repr() -> None:
    settings = dataclasses.replace(
        transport_settings("https://127.0.0.1:9"), proxy=ProxySettings("http://127.0.0.1:3128", RIGHT)
    )
    assert "127.0.0.1:3128" in repr(settings)
    assert RIGHT not in repr(settings) and "authorization" not in repr(settings)
