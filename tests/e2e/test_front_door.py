"""The gateway's HTTP front door against bad input, over real sockets to a real gateway process.

Bad input gets a 4xx in the OpenAI envelope, never a 5xx, and never costs the client its
kept-alive connection unless the HTTP framing itself is broken: then the gateway answers (where
the protocol allows) and closes. Oversized headers are refused before they take memory.
"""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from tests.e2e.conftest import PROVIDER_KEY_ENV, build_config
from tests.support.processes import Gateway, Proc, new_key, start_gateway
from tests.unit.api.test_chat_request_properties import bodies

pytestmark = pytest.mark.e2e

ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def gw(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    key_a, digest_a = new_key()
    key_b, digest_b = new_key()
    cfg: dict[str, Any] = build_config(mock_provider.url, {"team-a": digest_a, "team-b": digest_b})
    cfg["cors"] = {"allowedOrigins": [ORIGIN]}
    cfg["admission"] = {"maxRequestHeaderBytes": 16384, "maxRequestHeaders": 40}
    models: list[dict[str, Any]] = cfg["models"]  # type: ignore[assignment]
    fast = next(m for m in models if m["name"] == "chat-fast-v1")
    inline_routes = [{**r, "id": "inline-" + r["id"]} for r in fast["routes"]]
    models.append({**fast, "name": "chat-inline-images-v1", "imageUrlPolicy": "data-only", "routes": inline_routes})
    cfg["principals"][0]["allowedModels"].append("chat-inline-images-v1")  # type: ignore[index]
    path: Path = tmp_path_factory.mktemp("front-door") / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = start_gateway(path, {PROVIDER_KEY_ENV: "sk-front-door-provider-credential"})
    gateway.keys = {"team-a": key_a, "team-b": key_b}
    yield gateway
    gateway.proc.stop()


def origin(gw: Gateway) -> str:
    return gw.base_url.removesuffix("/v1")


def host_port(gw: Gateway) -> tuple[str, int]:
    url = httpx.URL(gw.base_url)
    assert url.host and url.port
    return url.host, url.port


def client_port(resp: httpx.Response) -> int:
    """The local port of the connection that carried ``resp``: a new one means a new connection."""
    stream = resp.extensions["network_stream"]
    port: int = stream.get_extra_info("client_addr")[1]
    return port


def chat(c: httpx.Client, gw: Gateway, body: Any, **headers: str) -> httpx.Response:
    return c.post(
        "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"authorization": f"Bearer {gw.keys['team-a']}", "content-type": "application/json", **headers},
    )


def assert_envelope(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code
    return err


def raw_exchange(gw: Gateway, data: bytes, timeout: float = 10) -> bytes:
    """Send ``data`` on a fresh connection and read until the gateway closes it."""
    with socket.create_connection(host_port(gw), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


def test_an_unhashable_role_is_a_400_and_the_connection_stays_usable(gw: Gateway) -> None:
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        for role in ([], {}):
            bad = chat(c, gw, {"model": "chat-fast-v1", "messages": [{"role": role, "content": "hi"}]})
            err = assert_envelope(bad, 400, "invalid_request")
            assert err["param"] == "messages[0].role"
            good = chat(c, gw, {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}]})
            assert good.status_code == 200
            assert client_port(good) == client_port(bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_envelope_answers_below_500_on_the_same_connection(gw: Gateway, body: dict[str, Any]) -> None:
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        resp = chat(c, gw, body)
        assert resp.status_code < 500, resp.text
        if resp.status_code >= 400:
            assert_envelope(resp, resp.status_code)
        after = c.get("/healthz")
        assert after.status_code == 200
        assert client_port(after) == client_port(resp)


def test_oversized_headers_are_431_in_the_envelope(gw: Gateway) -> None:
    big = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n"
    status, headers, body = parse_response(raw_exchange(gw, big))
    assert status == 431 and headers["connection"] == "close"
    assert orjson.loads(body)["error"]["code"] == "request_headers_too_large"
    many = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(60)) + b"\r\n"
    status, _, body = parse_response(raw_exchange(gw, many))
    assert status == 431
    assert orjson.loads(body)["error"]["code"] == "request_headers_too_large"


def test_headers_under_the_limits_are_served(gw: Gateway) -> None:
    headers = {f"x-h{i}": "v" * 100 for i in range(30)}
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        resp = c.get("/v1/models", headers={"authorization": f"Bearer {gw.keys['team-a']}", **headers})
    assert resp.status_code == 200


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _flood_headers(gw: Gateway, total: int) -> None:
    """Send up to ``total`` bytes of one header; the gateway cuts it off long before."""
    chunk = b"a" * 65536
    try:
        with socket.create_connection(host_port(gw), timeout=10) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-flood: ")
            sent = 0
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the worker's RSS from /proc")
def test_header_floods_do_not_grow_the_worker(gw: Gateway) -> None:
    pid = httpx.get(origin(gw) + "/healthz", timeout=10).json()["pid"]
    before = _rss_kib(pid)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _flood_headers(gw, 32 * 1024 * 1024), range(8)))
    assert httpx.get(origin(gw) + "/healthz", timeout=10).status_code == 200
    assert _rss_kib(pid) - before < 16 * 1024, (before, _rss_kib(pid))


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n"
        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost x\r\n\r\n",
        b"\x00\x01\x02 nonsense\r\n\r\n",
    ],
    ids=["smuggling", "bad-header-line", "garbage"],
)
def test_malformed_http_is_a_400_in_the_envelope(gw: Gateway, request_bytes: bytes) -> None:
    status, headers, body = parse_response(raw_exchange(gw, request_bytes))
    assert status == 400 and headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/admin/v1/routes/", "/admin/v1/routes%2f", "/healthz/"])
def test_a_trailing_slash_is_a_404_never_a_redirect(gw: Gateway, path: str) -> None:
    raw = b"GET %s HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n" % path.encode()
    status, headers, body = parse_response(raw_exchange(gw, raw))
    assert status == 404 and "location" not in headers
    assert orjson.loads(body)["error"]["code"] in ("not_found", "model_not_found")


def test_two_authorization_headers_are_refused(gw: Gateway) -> None:
    headers = [("authorization", f"Bearer {gw.keys['team-a']}"), ("authorization", "Bearer tw-other")]
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        resp = c.get("/v1/models", headers=headers)
        assert_envelope(resp, 401, "authentication_error")
        one = c.get("/v1/models", headers=headers[:1])
        assert one.status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "https://169.254.169.254/",
        "https://[fd00:ec2::254]/",
        "https://127.0.0.1/x.png",
        "https://2130706433/x.png",
        "https://[::ffff:10.0.0.1]/x.png",
        "https://localhost/x.png",
        "https://metadata.google.internal/x.png",
        "file:///etc/passwd",
    ],
)
def test_image_urls_to_private_addresses_are_refused(gw: Gateway, url: str) -> None:
    body = {
        "model": "chat-fast-v1",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
    }
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        err = assert_envelope(chat(c, gw, body), 400, "invalid_request")
    assert err["param"] == "messages[0].content[0].image_url.url"


def test_public_https_and_inline_images_pass_and_data_only_refuses_urls(gw: Gateway) -> None:
    def image(model: str, url: str) -> dict[str, Any]:
        part = {"type": "image_url", "image_url": {"url": url}}
        return {"model": model, "messages": [{"role": "user", "content": [part]}]}

    inline = "data:image/png;base64,iVBORw0KGgo="
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        assert chat(c, gw, image("chat-fast-v1", "https://images.example.com/cat.png")).status_code == 200
        assert chat(c, gw, image("chat-inline-images-v1", inline)).status_code == 200
        refused = chat(c, gw, image("chat-inline-images-v1", "https://images.example.com/cat.png"))
        assert_envelope(refused, 400, "invalid_request")


def test_models_retrieve_answers_own_aliases_and_404s_alike(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["team-a"], max_retries=0, timeout=20)
    with client:
        model = client.models.retrieve("chat-fast-v1")
        assert model.id == "chat-fast-v1" and model.object == "model"
        errors = []
        for name in ("chat-hidden-v1", "chat-missing-v1"):
            with pytest.raises(openai.NotFoundError) as info:
                client.models.retrieve(name)
            body = info.value.response.json()
            errors.append({**body["error"], "message": body["error"]["message"].replace(name, "<id>")})
    assert errors[0] == errors[1] and errors[0]["code"] == "model_not_found"


def test_cors_preflight_and_simple_requests(gw: Gateway) -> None:
    preflight = {
        "origin": ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
    }
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        ok = c.options("/v1/chat/completions", headers=preflight)
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        assert "x-stainless-os" in ok.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in ok.headers
        refused = c.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
        assert_envelope(refused, 400, "cors_refused")
        simple = c.get("/v1/models", headers={"origin": ORIGIN, "authorization": f"Bearer {gw.keys['team-a']}"})
        assert simple.status_code == 200
        assert simple.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()
        other = c.get("/v1/models", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_the_gateway_still_serves_after_the_abuse(gw: Gateway) -> None:
    with httpx.Client(base_url=origin(gw), timeout=20) as c:
        resp = chat(c, gw, {"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200
        health = c.get("/healthz").json()
    assert health["in_flight"] == {"requests": 0, "streams": 0}
    assert health["unauthenticated"] >= 1


def test_a_body_in_the_same_read_as_the_headers_does_not_count_as_headers(gw: Gateway) -> None:
    body = orjson.dumps({"model": "chat-fast-v1", "messages": [{"role": "user", "content": "x" * 50_000}]})
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (gw.keys["team-a"].encode(), len(body))
    )
    status, _, answer = parse_response(raw_exchange(gw, head + body))
    assert status == 200, answer


def test_chunked_trailers_do_not_count_against_the_header_limits(gw: Gateway) -> None:
    body = orjson.dumps({"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}]})
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        % gw.keys["team-a"].encode()
    )
    trailers = b"".join(b"x-t%d: v\r\n" % i for i in range(45))  # more lines than maxRequestHeaders (40)
    chunked = b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailers)
    status, _, answer = parse_response(raw_exchange(gw, head + chunked))
    assert status == 200, answer
