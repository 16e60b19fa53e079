"""Amazon Bedrock Converse end to end: a published config, the real gateway app, the mock provider.

A ``bedrock`` provider has no API key: each request is signed with SigV4 from AWS credentials the
gateway reads from its environment (here moto-style ``testing`` keys). The mock refuses unsigned
requests; this test also re-derives each signature from the bytes the mock received, so the path,
headers and body signed are exactly the ones sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.support.asgi_gateway import asgi_gateway, isolate_aws, one_principal
from tollway.exceptions import ConfigError
from tollway.mock.app import MockApp, Receive, Scope, Send
from tollway.mock.server import MockServerThread
from tollway.server.app import create_app

KEY = "tw-bedrock-functional-key-0001"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
REGION = "eu-west-1"
ACCESS_KEY, SECRET_KEY = "testing", "testing"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class RecordingMock(MockApp):
    """The mock, keeping each Converse request's method, raw path, headers and body."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bytes, list[tuple[bytes, bytes]], bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "/model/" not in scope["path"]:
            await super().__call__(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.seen.append((scope["method"], scope["raw_path"], list(scope["headers"]), b"".join(chunks)))
            return message

        await super().__call__(scope, recording, send)


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread(RecordingMock()) as server:
        yield server


def _config(mock_url: str) -> dict[str, Any]:
    bedrock = {"type": "bedrock", "awsRegion": REGION, "providerAccountId": "aws-acct", "quotaGroupId": "aws-acct"}
    route = {"provider": "bedrock", "model": MODEL, "providerFormat": "bedrock-converse"}
    return {
        "providers": {
            "bedrock": {**bedrock, "baseUrl": mock_url},
            "throttled": {**bedrock, "baseUrl": mock_url + "/_fault/status=429,retry_after=2"},
        },
        "models": [
            {"name": "claude-bedrock", "capabilities": ["streaming", "tools"], "routes": [{"id": "b", **route}]},
            {"name": "claude-throttled", "routes": [{"id": "t", **route, "provider": "throttled"}]},
        ],
        "routing": {"maxAttempts": 1, "baseBackoffMs": 1, "maxBackoffMs": 5},
        "principals": one_principal(KEY, ["claude-bedrock", "claude-throttled"]),
    }


@pytest.fixture
def isolated_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials but the test's own: no shared files, no profile, no instance role."""
    isolate_aws(monkeypatch, tmp_path, access_key=None)


@pytest.fixture
async def client(
    tmp_path: Path, mock: MockServerThread, monkeypatch: pytest.MonkeyPatch, isolated_aws: None
) -> AsyncIterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    async with asgi_gateway(tmp_path, _config(mock.base_url)) as http:
        mock.app.clear_requests()
        recording = mock.app
        assert isinstance(recording, RecordingMock)
        recording.seen.clear()
        yield http


def assert_signed_as_sent(mock: MockServerThread, count: int) -> None:
    """Each request the mock received carries a SigV4 signature that verifies over its own bytes."""
    recording = mock.app
    assert isinstance(recording, RecordingMock)
    assert len(recording.seen) == count
    host = mock.base_url.removeprefix("http://")
    for method, raw_path, raw_headers, body in recording.seen:
        headers = {k.decode(): v.decode() for k, v in raw_headers}
        authorization = headers["authorization"]
        assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
        assert f"/{REGION}/bedrock/aws4_request" in authorization
        signed_names = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
        assert "host" in signed_names and "x-amz-date" in signed_names
        assert b"%3A" in raw_path, "the model id's colon is sent percent-encoded"
        request = AWSRequest(
            method=method,
            url=f"http://{host}{raw_path.decode()}",
            data=body,
            headers={name: headers[name] for name in signed_names if name != "host"},
        )
        request.context["timestamp"] = headers["x-amz-date"]
        auth = SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "bedrock", REGION)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        assert authorization.endswith(f"Signature={expected}")


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_chat_completions_buffered_and_streamed_through_bedrock(client: Any, mock: MockServerThread) -> None:
    body = {"model": "claude-bedrock", "messages": [{"role": "user", "content": "Hello from Köln"}], "max_tokens": 64}
    buffered = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert buffered.status_code == 200, buffered.text
    answer = buffered.json()
    assert "Hello from Köln" in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"
    usage = answer["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    streamed = await client.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        headers=AUTH,
    )
    assert streamed.status_code == 200, streamed.text
    chunks = sse_chunks(streamed.text)
    text = "".join((c["choices"] or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)
    assert "Hello from Köln" in text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [
        "stop"
    ]
    final_usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert final_usage["prompt_tokens"] == usage["prompt_tokens"]
    assert streamed.text.rstrip().endswith("data: [DONE]")

    log = mock.app.requests
    assert [(r["format"], r["model"], r["stream"], r["status"]) for r in log] == [
        ("bedrock", MODEL, False, 200),
        ("bedrock", MODEL, True, 200),
    ]
    assert [r["path"].rsplit("/", 1)[1] for r in log] == ["converse", "converse-stream"]
    assert_signed_as_sent(mock, 2)


async def test_a_tool_call_round_trips_buffered_and_streamed(client: Any, mock: MockServerThread) -> None:
    body = {
        "model": "claude-bedrock",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    buffered = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert buffered.status_code == 200, buffered.text
    choice = buffered.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(orjson.loads(call["function"]["arguments"]), dict)

    streamed = await client.post("/v1/chat/completions", json={**body, "stream": True}, headers=AUTH)
    assert streamed.status_code == 200, streamed.text
    deltas = [
        tc for c in sse_chunks(streamed.text) if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert deltas[0]["function"]["name"] == "get_weather"
    arguments = "".join(d["function"].get("arguments", "") for d in deltas)
    assert isinstance(orjson.loads(arguments), dict)

    follow_up = {
        **body,
        "tool_choice": "auto",
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 degrees"},
        ],
    }
    answer = await client.post("/v1/chat/completions", json=follow_up, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert "sunny, 21 degrees" in answer.json()["choices"][0]["message"]["content"]
    assert_signed_as_sent(mock, 3)


async def test_a_messages_client_reaches_bedrock(client: Any, mock: MockServerThread) -> None:
    body = {"model": "claude-bedrock", "max_tokens": 100, "messages": [{"role": "user", "content": "Grüße"}]}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    buffered = await client.post("/v1/messages", json=body, headers=headers)
    assert buffered.status_code == 200, buffered.text
    message = buffered.json()
    assert "Grüße" in message["content"][0]["text"]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["input_tokens"] > 0 and message["usage"]["output_tokens"] > 0

    streamed = await client.post("/v1/messages", json={**body, "stream": True}, headers=headers)
    assert streamed.status_code == 200, streamed.text
    events = [orjson.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert "Grüße" in text
    assert events[-1]["type"] == "message_stop"
    assert_signed_as_sent(mock, 2)


async def test_bedrock_throttling_answers_rate_limited_with_retry_after(client: Any, mock: MockServerThread) -> None:
    body = {"model": "claude-throttled", "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={**body, "stream": stream}, headers=AUTH)
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "rate_limited"
        assert resp.headers["retry-after"] == "2"
        assert "bedrock" not in resp.text.lower() and "throttlingexception" not in resp.text.lower()
    assert [r["status"] for r in mock.app.requests] == [429, 429]
    assert_signed_as_sent(mock, 2)


@pytest.mark.parametrize(
    ("profile", "where"), [(None, "providers.bedrock"), ("missing", "providers.bedrock.awsProfile")]
)
def test_no_aws_credentials_fails_publication_naming_the_provider(
    tmp_path: Path, isolated_aws: None, profile: str | None, where: str
) -> None:
    cfg = _config("http://127.0.0.1:9")
    if profile is not None:
        cfg["providers"]["bedrock"]["awsProfile"] = profile
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        create_app(path, watch_interval_s=None)
    assert [i.path for i in info.value.issues] == [where]
    assert "AWS credentials" in info.value.issues[0].message
