"""The streaming contract of ``POST /v1/messages`` and ``POST /v1/responses``, through the official SDKs.

The chat-completions contract has its e2e tests (``test_failover_sdk.py``, ``test_lifecycle.py``);
these hold the two other client formats to the same rules (docs/compatibility.md, *Streaming*):
a failure before the first token falls back and the client gets one clean stream; a failure after
it is that format's single in-stream error, with no fallback; a client that leaves after the first
token cancels the upstream call. Every fault runs behind an OpenAI-format and an Anthropic-format
route of the real mock, each fallback crossing formats.

``sameRouteRetries: 0`` makes every failed attempt move on at once, so a fallback is exactly two
attempts; circuit breakers and outlier ejection are off, so the order the tests run in cannot take
a failing route out of rotation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.e2e.conftest import mock_requests
from tests.support.processes import Gateway, Proc, new_key, start_gateway

pytestmark = pytest.mark.e2e

PROVIDER_KEY_ENV = "TOLLWAY_E2E_FORMATS_KEY"
UPSTREAMS = ("openai", "anthropic")
OTHER = {"openai": "anthropic", "anthropic": "openai"}
FAULTS = {
    "down": "status=500",
    "early": "abort_after=0",
    "errors": "midstream_error=2,chunks=6",
    "cut": "abort_after=2,chunks=6",
    "slow": "chunk_gap_ms=1000,chunks=10",
    "ok": "",
}
"""``early`` ends the stream halfway through its first delta; ``errors`` and ``cut`` fail after two
of six deltas; ``slow`` takes about nine seconds to send its ten."""

WORDS = "one two three four five six"
FULL = f"Mock reply #6: {WORDS}"
DELTAS = ["Mock ", "reply #6: ", "one two ", "three four ", "five six"]
"""The mock's reply to ``WORDS`` in its default five deltas."""
FIRST_TWO = "Mock reply #6: "
"""What the ``errors`` and ``cut`` faults send before they fail: two of six deltas."""

CUT_MESSAGE = "The model provider's stream ended before the answer was complete."
ERROR_MESSAGE = "The model provider returned an error."
OVERLOADED_MESSAGE = "The selected model is temporarily unavailable."
# (fault, upstream) → (Anthropic error type, Responses code, message, attempt category, access-log status)
AFTER_COMMIT = {
    ("errors", "openai"): ("api_error", "provider_error", ERROR_MESSAGE, "server", 502),
    ("errors", "anthropic"): ("overloaded_error", "model_unavailable", OVERLOADED_MESSAGE, "overloaded", 503),
    ("cut", "openai"): ("api_error", "upstream_stream_cut", CUT_MESSAGE, "truncated", 502),
    ("cut", "anthropic"): ("api_error", "upstream_stream_cut", CUT_MESSAGE, "truncated", 502),
}
BEFORE_COMMIT = {"down": "server", "early": "truncated"}
"""The category the failed first attempt is recorded with."""


def _provider(mock_url: str, name: str, spec: str, upstream: str) -> dict[str, Any]:
    base = f"{mock_url}/_fault/{spec}" if spec else mock_url
    return {
        "type": "anthropic" if upstream == "anthropic" else "openai-compatible",
        "baseUrl": base if upstream == "anthropic" else base + "/v1",
        "providerAccountId": f"acct-{name}",
        "quotaGroupId": f"acct-{name}",
        "credentials": [{"id": name, "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
        "connectTimeoutMs": 1000,
        "requestTimeoutMs": 10000,
    }


def _route(rid: str, provider: str, upstream: str, priority: int = 0) -> dict[str, Any]:
    fmt = "anthropic-messages" if upstream == "anthropic" else "openai-chat-completions"
    return {"id": rid, "provider": provider, "model": f"phys-{rid}", "providerFormat": fmt, "priority": priority}


def _config(mock_url: str, digest: str) -> dict[str, Any]:
    providers = {
        f"{fault}-{up}": _provider(mock_url, f"{fault}-{up}", spec, up)
        for fault, spec in FAULTS.items()
        for up in UPSTREAMS
    }
    models: list[dict[str, Any]] = []
    for up in UPSTREAMS:
        for fault in BEFORE_COMMIT:
            alias = f"fallback-{fault}-{up}"
            models.append(
                {
                    "name": alias,
                    "routes": [
                        _route(alias, f"{fault}-{up}", up),
                        _route(f"{alias}-backup", f"ok-{OTHER[up]}", OTHER[up], priority=1),
                    ],
                }
            )
        for fault in ("errors", "cut"):
            alias = f"after-{fault}-{up}"
            models.append(
                {
                    "name": alias,
                    "routes": [
                        _route(alias, f"{fault}-{up}", up),
                        _route(f"{alias}-never", f"ok-{OTHER[up]}", OTHER[up], priority=1),
                    ],
                }
            )
        models.append({"name": f"slow-{up}", "routes": [_route(f"slow-{up}", f"slow-{up}", up)]})
    return {
        "requestTimeoutMs": 20000,
        "providers": providers,
        "models": models,
        "routing": {
            "maxAttempts": 3,
            "baseBackoffMs": 10,
            "maxBackoffMs": 50,
            "sameRouteRetries": 0,
            "circuitBreaker": {"failureThreshold": 1000, "failureRateThreshold": 1.0},
            "outlierDetection": {"enabled": False},
        },
        "principals": [
            {
                "id": "client",
                "tenant": "acme",
                "allowedModels": [m["name"] for m in models],
                "keys": [{"id": "client-key", "sha256": digest}],
            }
        ],
    }


@pytest.fixture(scope="module")
def gateway(mock_provider: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    key, digest = new_key()
    path: Path = tmp_path_factory.mktemp("formats") / "llm-router.yml"
    path.write_text(yaml.safe_dump(_config(mock_provider.url, digest)))
    gw = start_gateway(path, {PROVIDER_KEY_ENV: "sk-e2e-formats-provider-key"})
    gw.keys = {"client": key}
    yield gw
    gw.proc.stop()


@pytest.fixture(scope="module")
def claude(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    base = gateway.base_url.removesuffix("/v1")  # the SDK appends /v1/messages itself
    with anthropic.Anthropic(base_url=base, api_key=gateway.keys["client"], max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture(scope="module")
def oai(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.keys["client"], max_retries=0, timeout=20) as c:
        yield c


def _wait_for(predicate: Callable[[], Any], timeout: float) -> Any:
    """The predicate's first truthy value within ``timeout`` seconds, else ``None``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def _access(gateway: Gateway, request_id: str, timeout: float = 10) -> dict[str, Any]:
    """The request's access-log record, written once its response has ended."""
    line = gateway.proc.wait_log_line(
        lambda ln: f'"request_id":"{request_id}"' in ln and '"logger":"tollway.access"' in ln, timeout
    )
    record: dict[str, Any] = json.loads(line)
    assert record["request_id"] == request_id
    return record


def _mock_log(mock: Proc) -> list[tuple[int, str]]:
    """``(seq, model)`` of every request the mock has logged, oldest first."""
    return [(int(str(r["seq"])), str(r.get("model", ""))) for r in mock_requests(mock)]


def _last_seq(mock: Proc) -> int:
    return max((seq for seq, _ in _mock_log(mock)), default=0)


def _reached(mock: Proc, since: int, alias: str) -> list[str]:
    """The physical models of ``alias``'s routes that the mock was asked for after ``since``, in order."""
    return [model for seq, model in _mock_log(mock) if seq > since and model.startswith(f"phys-{alias}")]


def _in_flight(gateway: Gateway) -> dict[str, int]:
    health = httpx.get(gateway.base_url.removesuffix("/v1") + "/healthz", timeout=5).json()
    return dict(health["in_flight"])


def _sse(lines: Iterator[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of every event of a raw SSE body."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
            name = ""
    return events


# --- 1. A failure before the first token falls back; the client gets one clean stream.


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fault", list(BEFORE_COMMIT))
def test_messages_stream_falls_back_before_the_first_token_into_one_clean_stream(
    claude: anthropic.Anthropic, gateway: Gateway, mock_provider: Proc, fault: str, upstream: str
) -> None:
    alias = f"fallback-{fault}-{upstream}"
    since = _last_seq(mock_provider)
    with claude.messages.create(
        model=alias, max_tokens=64, messages=[{"role": "user", "content": WORDS}], stream=True
    ) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(DELTAS),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, stop = events[0], events[-2]
    assert start.type == "message_start" and stop.type == "message_delta"
    assert start.message.id == "msg_" + request_id.removeprefix("req_") and start.message.model == alias
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert deltas == DELTAS, "the whole answer once: nothing of the failed attempt, nothing twice"
    assert stop.delta.stop_reason == "end_turn" and stop.usage.output_tokens == 9

    record = _access(gateway, request_id)
    assert record["status"] == 200
    assert record["attempts"] == [[alias, "error", BEFORE_COMMIT[fault]], [f"{alias}-backup", "ok", None]]
    assert _reached(mock_provider, since, alias) == [f"phys-{alias}", f"phys-{alias}-backup"]


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fault", list(BEFORE_COMMIT))
def test_responses_stream_falls_back_before_the_first_token_into_one_clean_stream(
    oai: openai.OpenAI, gateway: Gateway, mock_provider: Proc, fault: str, upstream: str
) -> None:
    alias = f"fallback-{fault}-{upstream}"
    since = _last_seq(mock_provider)
    with oai.responses.create(model=alias, input=WORDS, stream=True) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(DELTAS),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == DELTAS, "the whole answer once: nothing of the failed attempt, nothing twice"
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.id == "resp_" + request_id.removeprefix("req_") and completed.response.model == alias
    assert completed.response.status == "completed" and completed.response.error is None
    assert completed.response.output_text == FULL
    assert completed.response.usage is not None and completed.response.usage.output_tokens == 9

    record = _access(gateway, request_id)
    assert record["status"] == 200
    assert record["attempts"] == [[alias, "error", BEFORE_COMMIT[fault]], [f"{alias}-backup", "ok", None]]
    assert _reached(mock_provider, since, alias) == [f"phys-{alias}", f"phys-{alias}-backup"]


# --- 2. A failure after the first token is the format's one in-stream error; no fallback.


@pytest.mark.parametrize(("fault", "upstream"), list(AFTER_COMMIT))
def test_messages_stream_failing_after_the_first_token_ends_with_one_error_event(
    gateway: Gateway, mock_provider: Proc, fault: str, upstream: str
) -> None:
    """On the wire: the output so far, then ``event: error`` in Anthropic's envelope, then the end."""
    alias = f"after-{fault}-{upstream}"
    error_type, _, message, category, status = AFTER_COMMIT[fault, upstream]
    since = _last_seq(mock_provider)
    body = {"model": alias, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": WORDS}]}
    headers = {"x-api-key": gateway.keys["client"], "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", gateway.base_url + "/messages", json=body, headers=headers, timeout=20) as resp:
        assert resp.status_code == 200, "the stream had begun: the status was sent with the first token"
        request_id = resp.headers["x-request-id"]
        events = _sse(resp.iter_lines())
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "error",
    ], "nothing after the error: no content_block_stop, message_delta or message_stop"
    assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == FIRST_TWO
    assert events[-1][1] == {"type": "error", "error": {"type": error_type, "message": message}}

    record = _access(gateway, request_id)
    assert record["status"] == status
    assert record["attempts"] == [[alias, "midstream_error", category]], "one attempt: no fallback after commit"
    assert _reached(mock_provider, since, alias) == [f"phys-{alias}"]


@pytest.mark.parametrize(("fault", "upstream"), list(AFTER_COMMIT))
def test_the_anthropic_sdk_raises_the_in_stream_error_after_the_output_so_far(
    claude: anthropic.Anthropic, gateway: Gateway, mock_provider: Proc, fault: str, upstream: str
) -> None:
    alias = f"after-{fault}-{upstream}"
    error_type, _, message, category, status = AFTER_COMMIT[fault, upstream]
    since = _last_seq(mock_provider)
    received: list[Any] = []
    with claude.messages.create(
        model=alias, max_tokens=64, messages=[{"role": "user", "content": WORDS}], stream=True
    ) as stream:
        request_id = stream.response.headers["x-request-id"]
        with pytest.raises(anthropic.APIStatusError) as info:
            for event in stream:
                received.append(event)
    assert [e.type for e in received] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
    ]
    assert "".join(e.delta.text for e in received if e.type == "content_block_delta") == FIRST_TWO
    assert info.value.status_code == 200, "the error came inside a stream that had begun"
    assert info.value.body == {"type": "error", "error": {"type": error_type, "message": message}}

    record = _access(gateway, request_id)
    assert record["status"] == status
    assert record["attempts"] == [[alias, "midstream_error", category]], "one attempt: no fallback after commit"
    assert _reached(mock_provider, since, alias) == [f"phys-{alias}"]


@pytest.mark.parametrize(("fault", "upstream"), list(AFTER_COMMIT))
def test_responses_stream_failing_after_the_first_token_ends_with_one_error_event(
    oai: openai.OpenAI, gateway: Gateway, mock_provider: Proc, fault: str, upstream: str
) -> None:
    """The SDK yields the ``error`` event like any other, so it shows the whole stream: the output so
    far, one ``error`` and the end, with no ``response.completed`` or ``response.failed``."""
    alias = f"after-{fault}-{upstream}"
    _, code, message, category, status = AFTER_COMMIT[fault, upstream]
    since = _last_seq(mock_provider)
    with oai.responses.create(model=alias, input=WORDS, stream=True) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "error",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == FIRST_TWO
    error = events[-1]
    assert error.type == "error"
    assert (error.code, error.message, error.param) == (code, message, None)
    assert [e.sequence_number for e in events] == list(range(len(events)))

    record = _access(gateway, request_id)
    assert record["status"] == status
    assert record["attempts"] == [[alias, "midstream_error", category]], "one attempt: no fallback after commit"
    assert _reached(mock_provider, since, alias) == [f"phys-{alias}"]


# --- 3. A client that closes the stream after the first token cancels the upstream call.

UPSTREAM_RUNS_S = 9.0
"""The ``slow`` fault's ten deltas, one second apart, from the first one on."""
SLOW_FIRST = "Mock"
"""Nine words in ten deltas: the mock splits the reply on characters, four to a delta."""


def _assert_cancelled(gateway: Gateway, request_id: str, alias: str, closed_at: float) -> None:
    """As the chat test in test_lifecycle.py: a 499 naming the attempt ``cancelled``, logged well
    before the upstream would have finished, and every permit back."""
    record = _access(gateway, request_id, timeout=UPSTREAM_RUNS_S - 3)
    waited = time.monotonic() - closed_at
    assert waited < UPSTREAM_RUNS_S - 3, f"logged {waited:.1f} s after the close: the upstream ran to its end"
    assert record["status"] == 499
    assert record["attempts"] == [[alias, "cancelled", None]]
    assert _wait_for(lambda: _in_flight(gateway) == {"requests": 0, "streams": 0}, timeout=5), _in_flight(gateway)


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_closing_a_messages_stream_after_the_first_token_cancels_the_upstream_call(
    claude: anthropic.Anthropic, gateway: Gateway, upstream: str
) -> None:
    alias = f"slow-{upstream}"
    with claude.messages.create(
        model=alias, max_tokens=64, messages=[{"role": "user", "content": WORDS}], stream=True
    ) as stream:
        request_id = stream.response.headers["x-request-id"]
        first = next(e for e in stream if e.type == "content_block_delta")
    closed_at = time.monotonic()
    assert first.delta.type == "text_delta" and first.delta.text == SLOW_FIRST
    _assert_cancelled(gateway, request_id, alias, closed_at)


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_closing_a_responses_stream_after_the_first_token_cancels_the_upstream_call(
    oai: openai.OpenAI, gateway: Gateway, upstream: str
) -> None:
    alias = f"slow-{upstream}"
    with oai.responses.create(model=alias, input=WORDS, stream=True) as stream:
        request_id = stream.response.headers["x-request-id"]
        first = next(e for e in stream if e.type == "response.output_text.delta")
    closed_at = time.monotonic()
    assert first.type == "response.output_text.delta" and first.delta == SLOW_FIRST
    _assert_cancelled(gateway, request_id, alias, closed_at)
