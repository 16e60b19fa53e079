"""The h1 upstream client's own edges, against scripted HTTP/1.1 servers over real TCP (and TLS).

The behaviour it shares with the other clients (credentials, pooling, timeouts, connect
failures, timing) is tested for all three in ``test_transports.py``; here: content encodings,
size limits, header safety, ``Connection: close`` and close-delimited bodies, a server that
dies mid-body, the pool's bound, backpressure on a slow consumer, cancellation, keep-alive
expiry and TLS verification.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import ipaddress
import socket
import ssl
import struct
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from tests.support.transports import transport_settings
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.transport import build_transport
from tollway.transport import h1 as h1_module
from tollway.transport.h1 import PAUSE_BYTES, H1Transport
from tollway.wire import UpstreamRequest

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON = MappingProxyType({"content-type": "application/json"})


class Scripted:
    """An HTTP/1.1 server whose every connection runs ``handler``; it counts connections and
    keeps each request head it read."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.heads: list[bytes] = []
        self.disconnected = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.disconnected.set()
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        return await reader.readexactly(length)

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def answer(status: int, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def request(stream: bool = False, headers: MappingProxyType[str, str] | dict[str, str] = JSON) -> UpstreamRequest:
    return UpstreamRequest("chat/completions", b'{"model":"m"}', headers, stream)


@contextlib.asynccontextmanager
async def transport(base: str, auth: dict[str, str] | None = None, **kw: Any) -> AsyncIterator[H1Transport]:
    t = build_transport(
        "h1", transport_settings(base, **{"connect": 2.0, "max_response_bytes": 1 << 20, **kw}), auth or {}
    )
    assert isinstance(t, H1Transport)
    try:
        yield t
    finally:
        await t.aclose()


def replies(*payloads: bytes) -> Callable[[Scripted], Handler]:
    """A handler that answers successive requests on a connection with ``payloads`` in turn."""

    def make(server: Scripted) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for payload in payloads:
                await server.read_request(reader)
                writer.write(payload)
                await writer.drain()
            await reader.read()

        return handler

    return make


def scripted(make: Callable[[Scripted], Handler], tls: ssl.SSLContext | None = None) -> Scripted:
    server = Scripted(lambda r, w: asyncio.sleep(0), tls)
    server.handler = make(server)
    return server


async def test_the_request_head_is_the_transports_and_the_credential_cannot_be_overridden() -> None:
    server = scripted(replies(answer(200, b"{}")))
    async with server as base, transport(base, {"Authorization": "Bearer sk-real"}) as t:
        sneaky = {"content-type": "application/json", "authorization": "Bearer other", "host": "evil", "x-ok": "1"}
        status, headers, body = await t.send(request(headers=sneaky))
    assert (status, body) == (200, b"{}")
    assert headers["content-length"] == "2"
    lines = server.heads[0].decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    names = [line.split(":")[0].lower() for line in lines[1:] if line]
    assert names.count("authorization") == 1 and "Authorization: Bearer sk-real" in lines
    assert names.count("host") == 1 and f"host: {base.removeprefix('http://')}" in lines
    assert "x-ok: 1" in lines and "content-length: 13" in lines and "accept-encoding: identity" in lines


async def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="does not allow"):
        build_transport("h1", transport_settings("http://127.0.0.1:9"), {"authorization": "Bearer x\r\nx-injected: 1"})
    for name in ("host ", "x:y", "", "x-ä"):
        with pytest.raises(ValueError, match="does not allow"):
            build_transport("h1", transport_settings("http://127.0.0.1:9"), {name: "v"})
    server = scripted(replies(answer(200, b"{}")))
    async with server as base, transport(base) as t:
        with pytest.raises(ValueError, match="does not allow"):
            await t.send(request(headers={"x-bad": "a\r\nhost: evil"}))
        assert (await t.send(request()))[0] == 200, "the refused request left the pool usable"
    assert all(b"evil" not in head for head in server.heads)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_an_encoded_body_is_decoded_buffered_and_streamed(encoding: str) -> None:
    plain = b'{"choices":[{"message":{"content":"' + b"hello " * 2000 + b'"}}]}'
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    reply = answer(200, packed, f"content-encoding: {encoding}")
    server = scripted(replies(reply, reply))
    async with server as base, transport(base) as t:
        assert (await t.send(request()))[2] == plain
        async with t.stream(request(stream=True)) as resp:
            assert b"".join([c async for c in resp.aiter_bytes()]) == plain
    assert server.connections == 1


async def test_an_unknown_encoding_and_an_oversized_body_are_malformed() -> None:
    server = scripted(replies(answer(200, b"xx", "content-encoding: br")))
    async with server as base, transport(base) as t:
        with pytest.raises(UpstreamError) as info:
            await t.send(request())
    assert info.value.category is UpstreamCategory.MALFORMED and "encoding" in info.value.detail
    server = scripted(replies(answer(200, b"x" * 5000)))
    async with server as base, transport(base, max_response_bytes=4096) as t:
        with pytest.raises(UpstreamError) as info:
            await t.send(request())
    assert info.value.category is UpstreamCategory.MALFORMED and info.value.detail == "response too large"
    assert info.value.status == 200
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB
    server = scripted(replies(answer(200, bomb, "content-encoding: gzip")))
    async with server as base, transport(base, max_response_bytes=4096) as t:
        tracemalloc.start()
        try:
            with pytest.raises(UpstreamError) as info:
                await t.send(request())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert info.value.detail == "response too large"
    assert peak < 16 << 20, f"inflated {peak} bytes for a 4 KiB limit"


async def test_connection_close_and_a_close_delimited_body() -> None:
    closing = answer(200, b'{"a":1}', "connection: close")
    server = scripted(replies(closing))
    async with server as base, transport(base) as t:
        for _ in range(2):
            assert (await t.send(request()))[2] == b'{"a":1}'
    assert server.connections == 2, "a connection the server closes is not reused"

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await until_close_server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + b'{"whole":true}')
        await writer.drain()

    until_close_server = Scripted(until_close)
    async with until_close_server as base, transport(base) as t:
        assert (await t.send(request()))[2] == b'{"whole":true}'


async def test_bytes_on_an_idle_connection_are_not_taken_for_the_next_answer() -> None:
    async def then_408(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(answer(200, b'{"n":1}'))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(answer(408, b"idle too long"))  # unsolicited, and the connection stays open
        await writer.drain()
        await reader.read()

    async def fresh(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if server.connections == 1:
            await then_408(reader, writer)
            return
        await server.read_request(reader)
        writer.write(answer(200, b'{"n":2}'))
        await writer.drain()
        await reader.read()

    server = Scripted(fresh)
    async with server as base, transport(base) as t:
        assert (await t.send(request()))[2] == b'{"n":1}'
        await asyncio.sleep(0.2)
        assert await t.send(request()) == (200, {"content-length": "7"}, b'{"n":2}')
    assert server.connections == 2


async def test_what_follows_a_complete_answer_is_never_parsed_into_it() -> None:
    server = scripted(replies(answer(200, b"{}", "x-a: 1") + answer(408, b"idle", "x-b: 2")))
    async with server as base, transport(base) as t:
        assert await t.send(request()) == (200, {"content-length": "2", "x-a": "1"}, b"{}")
        assert t._idle == [], "a connection with bytes after its answer is not reused"

    trailer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
    trailer += b"3\r\nabc\r\n0\r\ncontent-type: evil\r\n\r\n"
    server = scripted(replies(trailer))
    async with server as base, transport(base) as t:
        status, headers, body = await t.send(request())
    assert (status, headers["content-type"], body) == (200, "text/plain", b"abc"), "a trailer overwrote a header"


async def test_a_reset_cuts_a_close_delimited_body_short_and_is_an_error() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + b'{"choices":[{"mess')
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST

    server = Scripted(reset)
    async with server as base, transport(base) as t:
        with pytest.raises(UpstreamError) as info:
            await t.send(request())
    assert info.value.category is UpstreamCategory.SERVER and info.value.status is None


async def test_a_server_that_dies_mid_body_is_a_server_error() -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()

    server = Scripted(dies)
    async with server as base, transport(base) as t:
        with pytest.raises(UpstreamError) as info:
            await t.send(request())
        assert info.value.category is UpstreamCategory.SERVER and "connection lost" in info.value.detail
        assert info.value.status is None, "a failure of the connection carries no status (as with aiohttp)"
        with pytest.raises(UpstreamError) as info:
            async with t.stream(request(stream=True)) as resp:
                [c async for c in resp.aiter_bytes()]
        assert info.value.category is UpstreamCategory.SERVER


async def test_the_pool_is_bounded_and_a_request_beyond_it_waits_for_a_connection() -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            await release.wait()
            writer.write(answer(200, b"{}"))
            await writer.drain()

    server = Scripted(slow)
    async with server as base, transport(base, max_connections=1, connect=0.3) as t:
        first = asyncio.create_task(t.send(request()))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(t.send(request()), 0.3)  # the caller's deadline bounds the wait
        second = asyncio.create_task(t.send(request()))
        await asyncio.sleep(0.05)
        release.set()
        assert (await first)[0] == 200 and (await second)[0] == 200
        assert t._open == 1 and len(t._idle) == 1
    assert server.connections == 1, "the waiting request took the pooled connection"


async def test_a_waiter_woken_then_cancelled_passes_its_turn_on() -> None:
    server = scripted(replies(answer(200, b"{}"), answer(200, b"{}")))
    async with server as base, transport(base, max_connections=1) as t:
        await t.send(request())
        conn = t._idle.pop()  # in use, as far as the pool knows
        second = asyncio.create_task(t.send(request()))
        third = asyncio.create_task(t.send(request()))
        await asyncio.sleep(0.05)
        t._idle.append(conn)  # it comes back ...
        t._wake_slot()  # ... and wakes one waiter,
        second.cancel()  # which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await second
        assert (await asyncio.wait_for(third, 2))[0] == 200
    assert server.connections == 1


async def test_a_slow_consumer_pauses_the_socket_and_the_idle_timeout_waits_for_it() -> None:
    chunk = b"data: " + b"x" * 16378 + b"\n\n"  # 16 KiB frames, 4 MiB in all

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(256):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = Scripted(firehose)
    async with server as base, transport(base, idle=0.2) as t:
        async with t.stream(request(stream=True)) as resp:
            conn = resp._conn
            total, most, reads = 0, 0, 0
            async for data in resp.aiter_bytes():
                total += len(data)
                most = max(most, len(data))
                reads += 1
                if reads <= 2:
                    await asyncio.sleep(0.5)  # longer than the idle timeout: the server is waiting on us
                    assert conn.paused, "the socket was not paused while the consumer was behind"
            assert total == 256 * len(chunk)
        # Reading stopped once the queue passed PAUSE_BYTES; one socket read more may land on top.
        assert most <= PAUSE_BYTES + 256 * 1024
        assert t._idle == [conn], "read to its end, the connection went back to the pool"


async def test_a_stream_left_at_its_last_event_waits_briefly_for_its_end_and_is_reused() -> None:
    """The gateway stops reading at ``[DONE]``; the chunked terminator may come a moment later."""

    async def done_then_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            frame = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server = Scripted(done_then_end)
    async with server as base, transport(base) as t:
        for _ in range(3):
            async with t.stream(request(stream=True)) as resp:
                async for data in resp.aiter_bytes():
                    if b"[DONE]" in data:
                        break
    assert server.connections == 1


async def test_a_stream_cancelled_while_it_waits_for_its_end_frees_its_slot() -> None:
    async def done_never_ends(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"e\r\ndata: [DONE]\n\n\r\n")
        await writer.drain()
        await reader.read()

    server = Scripted(done_never_ends)
    async with server as base, transport(base, max_connections=1) as t:
        draining = asyncio.Event()

        async def consume() -> None:
            async with t.stream(request(stream=True)) as resp:
                async for data in resp.aiter_bytes():
                    if b"[DONE]" in data:
                        break
                draining.set()  # leaving the context starts the 50 ms wait for the terminator

        task = asyncio.create_task(consume())
        await draining.wait()
        await asyncio.sleep(0.01)
        task.cancel()  # the gateway's deadline, say, in the middle of that wait
        with pytest.raises(asyncio.CancelledError):
            await task
        assert t._open == 0 and t._idle == [], "the slot leaked"
        await asyncio.wait_for(server.disconnected.wait(), 2)


async def test_a_stream_left_paused_is_not_pooled() -> None:
    """Its end arrived while the consumer was behind: reading is paused, and the connection with it."""

    async def big_then_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        big = b"x" * (PAUSE_BYTES + 4096)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big))
        await writer.drain()
        await reader.read()

    server = Scripted(big_then_end)
    async with server as base, transport(base) as t:
        async with t.stream(request(stream=True)) as resp:
            conn = resp._conn
            for _ in range(50):
                if conn.complete:
                    break
                await asyncio.sleep(0.02)
            assert conn.complete and conn.paused
        assert t._idle == [] and t._open == 0


async def test_a_cancelled_send_closes_its_connection_and_frees_its_slot() -> None:
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await reader.read()  # until the client goes away

    server = Scripted(never)
    async with server as base, transport(base, max_connections=1) as t:
        task = asyncio.create_task(t.send(request()))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.disconnected.wait(), 2)
        assert t._open == 0 and not t._idle


async def test_an_expired_keep_alive_connection_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    server = scripted(replies(answer(200, b"{}"), answer(200, b"{}")))
    async with server as base, transport(base) as t:
        await t.send(request())
        monkeypatch.setattr(h1_module, "KEEPALIVE_S", 0.0)
        await t.send(request())
    assert server.connections == 2


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_tls_verifies_the_server_and_then_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _certificate(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = scripted(replies(answer(200, b'{"tls":true}')), tls)
    async with server as base:
        async with transport(base) as t:
            with pytest.raises(UpstreamError) as info:
                await t.send(request())  # a certificate the system does not trust
            assert info.value.category is UpstreamCategory.CONNECT and "TLS" in info.value.detail
        trusting = ssl.create_default_context
        monkeypatch.setattr(ssl, "create_default_context", lambda: trusting(cafile=str(cert)))
        async with transport(base) as t:
            assert (await t.send(request()))[2] == b'{"tls":true}'


async def test_a_connection_in_use_at_aclose_is_closed_when_its_call_ends() -> None:
    release = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await release.wait()
        writer.write(answer(200, b"{}"))
        await writer.drain()
        await reader.read()

    server = Scripted(held)
    async with server as base, transport(base) as t:
        call = asyncio.create_task(t.send(request()))
        await asyncio.sleep(0.05)
        await t.aclose()  # a root replaced while one of its requests is still in flight
        release.set()
        assert (await call)[0] == 200
        assert t._idle == [] and t._open == 0, "the in-flight connection went back to a closed pool"
        await asyncio.wait_for(server.disconnected.wait(), 2)
