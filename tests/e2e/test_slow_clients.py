"""Misbehaving clients against a real gateway process (uvicorn on 127.0.0.1) and the real mock.

A slowloris body, a reader that stops reading, a provider that stalls after the first token and
one that sends malformed SSE: each ends promptly, with the right answer or a cut-off, and the
gateway's permits all come back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import Gateway, Proc, new_key, start_gateway

pytestmark = pytest.mark.e2e

PROVIDER_KEY_ENV = "TOLLWAY_SLOW_PROVIDER_KEY"


def config(mock_url: str, digest: str) -> dict[str, Any]:
    def provider(fault: str) -> dict[str, Any]:
        return {
            "type": "openai-compatible",
            "baseUrl": f"{mock_url}/_fault/{fault}/v1",
            "providerAccountId": f"acct-{fault[:12]}",
            "quotaGroupId": f"q-{fault[:12]}",
            "credentials": [{"id": "c", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
            "connectTimeoutMs": 1000,
            "requestTimeoutMs": 10000,
        }

    faults = {
        "huge": "chunks=2000,words=1000000",
        "stall-after": "chunks=5,stall_at=2,stall_ms=60000",
        "malformed": "chunks=5,malformed=3",
        "truncated": "chunks=5,abort_after=2",
    }
    return {
        "streamIdleTimeoutMs": 800,
        "admission": {
            "bodyReadTimeoutMs": 500,
            "headerReadTimeoutMs": 500,
            "downstreamWriteProgressTimeoutMs": 1000,
            "streamSetupTimeoutMs": 2000,
        },
        "providers": {name: provider(fault) for name, fault in faults.items()},
        "models": [
            {
                "name": name,
                "routes": [{"id": name, "provider": name, "model": "m", "providerFormat": "openai-chat-completions"}],
            }
            for name in faults
        ],
        "principals": [
            {"id": "p", "tenant": "t", "allowedModels": list(faults), "keys": [{"id": "k", "sha256": digest}]}
        ],
    }


@pytest.fixture(scope="module")
def gateway(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    key, digest = new_key()
    path: Path = tmp_path_factory.mktemp("slow") / "llm-router.yml"
    path.write_text(yaml.safe_dump(config(mock_provider.url, digest)))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-slow-provider"})
    gw.keys = {"p": key}
    yield gw
    gw.proc.stop()


def in_flight(gw: Gateway) -> dict[str, int]:
    health = httpx.get(gw.base_url.removesuffix("/v1") + "/healthz", timeout=5).json()
    return dict(health["in_flight"])


def wait_idle(gw: Gateway, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while in_flight(gw) != {"requests": 0, "streams": 0}:
        assert time.monotonic() < deadline, in_flight(gw)
        time.sleep(0.05)


def connect(gw: Gateway, rcvbuf: int | None = None) -> socket.socket:
    host, port = gw.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: a small window
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def test_a_slowloris_body_gets_408_and_frees_its_permit(gateway: Gateway) -> None:
    sock = connect(gateway)
    try:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {gateway.keys['p']}\r\nContent-Length: 400\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": ')
        started = time.monotonic()
        sock.sendall(b" ")  # a trickle, never the whole body
        reply = read_response(sock).decode(errors="replace")  # the headers and body may arrive apart
        elapsed = time.monotonic() - started
    finally:
        sock.close()
    assert reply.startswith("HTTP/1.1 408"), reply[:200]
    assert '"request_timeout"' in reply
    assert elapsed < 5
    wait_idle(gateway)


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body (the headers and body may arrive apart)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = (line.partition(b":") for line in head.split(b"\r\n")[1:])
    length = next(int(value) for name, _, value in fields if name.strip().lower() == b"content-length")
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    "sent", [b"", b"POST /v1/chat/com", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-A: 1"]
)
def test_slowloris_headers_get_408_and_the_connection_closed(gateway: Gateway, sent: bytes) -> None:
    sock = connect(gateway)
    try:
        started = time.monotonic()
        if sent:
            sock.sendall(sent)
        reply = b""
        while chunk := sock.recv(4096):  # until the gateway closes the connection
            reply += chunk
        elapsed = time.monotonic() - started
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"request_timeout"' in reply
    assert 0.4 <= elapsed < 5


def test_a_kept_alive_connection_gets_the_header_deadline_again(gateway: Gateway) -> None:
    sock = connect(gateway)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        first = read_response(sock)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /heal")  # the next request never finishes its headers
        started = time.monotonic()
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert time.monotonic() - started < 5
    finally:
        sock.close()


def test_a_reader_that_stops_reading_is_cut_off_and_frees_its_permits(gateway: Gateway) -> None:
    sock = connect(gateway, rcvbuf=4096)
    try:
        body = b'{"model": "huge", "stream": true, "messages": [{"role": "user", "content": "go"}]}'
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {gateway.keys['p']}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        first = sock.recv(1024)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        assert in_flight(gateway)["streams"] == 1
        # Read nothing more: the gateway's writes stall, and after the write-progress deadline
        # (1 s) it gives up on this client, cancels the upstream call and releases everything.
        wait_idle(gateway, timeout_s=20)
    finally:
        sock.close()
    # Cut off (499, the upstream attempt cancelled), not a stream that fit in the socket buffers.
    access = [line for line in gateway.proc.log_lines() if '"alias":"huge"' in line]
    assert access and '"status":499' in access[-1], access[-1:]
    assert '"cancelled"' in access[-1]


def stream_data_lines(gateway: Gateway, model: str) -> list[str]:
    """The ``data:`` lines of one streamed request to ``model``, read to the end (answered 200)."""
    headers = {"authorization": f"Bearer {gateway.keys['p']}"}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30) as resp:
        assert resp.status_code == 200
        return [line for line in resp.iter_lines() if line.startswith("data: ")]


def test_a_provider_stalling_after_the_first_token_ends_the_stream_at_the_idle_deadline(gateway: Gateway) -> None:
    started = time.monotonic()
    lines = stream_data_lines(gateway, "stall-after")
    assert time.monotonic() - started < 10  # the idle deadline (0.8 s), not the 60 s stall
    assert lines[-1] != "data: [DONE]"  # a midstream failure: one error event, no [DONE]
    assert '"error"' in lines[-1]
    assert sum('"content"' in line for line in lines) >= 1
    wait_idle(gateway)


def test_one_malformed_sse_event_after_the_first_token_is_skipped(gateway: Gateway) -> None:
    lines = stream_data_lines(gateway, "malformed")
    assert lines[-1] == "data: [DONE]"  # one undecodable event between good ones is skipped, not fatal
    assert not any('"error"' in line for line in lines)
    assert "{not json" not in "".join(lines)  # the provider's bytes never reach the client
    wait_idle(gateway)


def test_a_stream_truncated_mid_frame_ends_with_one_error_event(gateway: Gateway) -> None:
    lines = stream_data_lines(gateway, "truncated")
    assert sum('"content"' in line for line in lines) >= 1  # the output before the cut reached the client
    assert lines[-1] != "data: [DONE]"
    assert sum('"error"' in line for line in lines) == 1
    wait_idle(gateway)
