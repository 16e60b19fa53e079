"""The transports' signer hook: each request is signed over exactly the URL, headers and body sent.

A raw TCP server records the bytes each client writes, so what the signer saw can be compared with
what went over the wire: the request target with the model id's escapes as they were signed (``%3A``
kept, not decoded nor encoded again), every header passed to the signer sent with that value, and
the signer's own headers added to that request alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.support.transports import transport_settings
from tollway.transport import HttpClient, build_transport
from tollway.wire import UpstreamRequest

CLIENTS: list[HttpClient] = ["h1", "aiohttp", "httpx"]
PATH = "model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
BODY = b'{"messages":[{"role":"user","content":[{"text":"hi"}]}]}'
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


@dataclass
class Received:
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """A signer that records its calls and signs each with a fresh counter."""

    calls: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    def __call__(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        self.calls.append((method, url, dict(headers), body))
        n = len(self.calls)
        return {"x-amz-date": f"20261202T00000{n}Z", "authorization": f"AWS4-HMAC-SHA256 Signature=sig{n}"}


class RawServer:
    """HTTP/1.1 on a bare socket: parses each request head and content-length body, answers ``{}``."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                target = lines[0].split(" ")[1]
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.received.append(Received(target, headers, body))
                writer.write(REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def server() -> AsyncIterator[RawServer]:
    yield RawServer()


def _request(stream: bool) -> UpstreamRequest:
    return UpstreamRequest(PATH, BODY, {"content-type": "application/json", "accept": "application/json"}, stream)


@pytest.mark.parametrize("client", CLIENTS)
async def test_each_request_is_signed_over_the_url_headers_and_body_sent(client: HttpClient, server: RawServer) -> None:
    signer = Recorder()
    async with server as base:
        t = build_transport(client, transport_settings(base), {}, signer=signer)
        try:
            status, _, _ = await t.send(_request(False))
            assert status == 200
            async with t.stream(_request(True)) as resp:
                assert resp.status == 200
                await resp.read_bounded()
        finally:
            await t.aclose()
    assert len(signer.calls) == len(server.received) == 2
    for n, ((method, url, signed, body), got) in enumerate(zip(signer.calls, server.received, strict=True), 1):
        assert method == "POST"
        assert url == f"{base}/v1/{PATH}"
        assert got.target == urlsplit(url).path == f"/v1/{PATH}", "the path is sent byte for byte as signed"
        assert body == got.body == BODY
        assert {k.lower(): v for k, v in signed.items()} == {
            "content-type": "application/json",
            "accept": "application/json",
        }
        for name, value in signed.items():
            assert got.headers[name.lower()] == value
        assert got.headers["authorization"] == f"AWS4-HMAC-SHA256 Signature=sig{n}"
        assert got.headers["x-amz-date"] == f"20261202T00000{n}Z"


@pytest.mark.parametrize("client", CLIENTS)
async def test_without_a_signer_nothing_is_added(client: HttpClient, server: RawServer) -> None:
    async with server as base:
        t = build_transport(client, transport_settings(base), {"x-api-key": "k"})
        try:
            await t.send(_request(False))
        finally:
            await t.aclose()
    (got,) = server.received
    assert "authorization" not in got.headers and "x-amz-date" not in got.headers
    assert got.headers["x-api-key"] == "k"
