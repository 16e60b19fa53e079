"""Golden translation tests for every client format against every provider format.

``test_golden.py`` pins the provider codecs; this module pins the client-format front ends
(``openai-chat-completions``, ``anthropic-messages``, ``openai-responses``) and the chain from a
client body to a provider body and from a provider stream back to the client. ``<client>`` below is
a front end's name, ``<provider>`` a ``ProviderFormat`` value. Under ``clients/``:

- ``requests/<case>.<client>.json``: a client request body. The front end decodes it with a
  ``resolve`` that serves alias ``chat-fast-v1`` from one route of ``<provider>`` (capabilities: what
  that format can carry) and raises the pipeline's own 404 for any other model; the provider codec
  then encodes it. Each (case, client, provider) has exactly one expectation:

  - ``<case>.<client>.<provider>.json``: the upstream body;
  - ``<case>.<client>.<provider>.error.json``: the client's error reply, when only an alias served
    by that provider refuses the body (``top_k`` on an OpenAI-format route, say);
  - ``<case>.<client>.error.json``: the client's error reply, when the body is refused whatever
    serves it.

  An error reply is ``{"status", "headers", "body"}``, the front end's ``encode_error`` of the
  ``GatewayError`` raised.
- ``responses/<case>.json``: a canonical response and the request case it answers (decoded per
  client, since a format may echo the request's settings; against the OpenAI-format alias, as
  whichever route answered, the front end encodes alike). ``<case>.<client>.json`` is the
  client's buffered body.
- ``errors/<case>.json``: a ``GatewayError`` (class name and arguments). ``<case>.<client>.json`` is
  its error reply.
- ``streams/<case>.json``: a canonical event sequence, the request case it answers, and how it
  ends: ``end`` with the final usage, or ``error`` with the ``GatewayError`` of an in-stream
  failure. ``<case>.<client>.sse`` is the whole transcript the client's stream encoder writes.
- ``chains/<stream>.<provider>.<client>.sse``: what a client receives when the provider transcript
  ``../streams/<stream>.<provider>.sse`` (``test_golden.py``'s) is decoded by the provider codec and
  encoded by the client's front end for the ``streaming`` request case, driven as the pipeline
  drives it: every event to ``event``, then ``end`` with the last reported usage (else the
  pipeline's local estimate), or ``error`` with ``UpstreamError.to_stream_error()``. A skipped
  upstream event reaches the encoder too, which shows nothing for it; the pipeline's rule for how
  many it tolerates (one) is not repeated here, and no transcript has more.

Every client transcript (``streams/*.sse`` and ``chains/*.sse``) is re-parsed by ``SseParser``
and must give the same events under every chunking tried, each well framed for its format (named
events whose name is their ``type``; Responses' ``sequence_number`` from 0, one apart; Chat
Completions' data-only frames, ``[DONE]`` last unless an error frame ends the stream). Chunkings:
one byte at a time, random ones, and a split in two at every byte boundary. The last is done frame
by frame: the parser carries nothing across the blank line that ends an event (LF line ends, the
BOM check only at the start), so a split inside one frame can change only that frame's event, and
testing each frame at each of its bytes is every split of the transcript, in linear rather than
quadratic time (the Responses transcripts repeat the whole response in their lifecycle events).

A provider transcript is decoded by its codec at every two-chunk split, literally, and must give
the same canonical events and ending as the whole transcript: the front ends are pure, so the same
events make the same client bytes, and the chain to every client holds at every split.

Every expected client body, stream event and error body is also validated against the official
SDKs' types (``openai``, ``anthropic``).

Nothing is masked: ids and timestamps come from a fixed ``ResponseMeta`` (request id
``req_0123456789abcdef01234567``, created ``1700000000``), and no front end makes an id of its
own at random (Responses' ``call_<hex>_<k>`` for a call without one derives from the request id).

``TOLLWAY_GOLDEN_UPDATE=1`` rewrites every expected file whose content differs from what the code
produces (and writes missing ones); the tests then pass. Review the diff by eye against the
official API formats before keeping it: a fixture is the format as the API defines it, not
whatever the code emits, so one that differs from the code on purpose must not be regenerated.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import anthropic.types
import openai.types.chat
import openai.types.responses
import orjson
import pydantic
import pytest

import tollway.exceptions
from tollway.api.anthropic_messages import ANTHROPIC_MESSAGES
from tollway.api.chat_completions import CHAT_COMPLETIONS
from tollway.api.responses import RESPONSES
from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    SkippedEvent,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    estimate_request_tokens,
)
from tollway.exceptions import GatewayError, UpstreamError
from tollway.gateway import local_usage
from tollway.pipeline.core import model_not_found
from tollway.pipeline.frontend import ErrorReply, FrontEnd, ResponseMeta, StreamEncoder
from tollway.providers import FORMAT_CAPABILITIES, ProviderFormat, Target, codec_for
from tollway.routing.circuit import CircuitPolicy
from tollway.routing.health import DeploymentHealth
from tollway.routing.plan import AliasPlan, Deployment, RetryPolicy, RouteTarget
from tollway.sse import SseParser
from tollway.wire import SseEvent

GOLDEN = Path(__file__).parent
CLIENTS = GOLDEN / "clients"
UPDATE = os.environ.get("TOLLWAY_GOLDEN_UPDATE") == "1"

ALIAS = "chat-fast-v1"
META = ResponseMeta("req_0123456789abcdef01234567", 1_700_000_000, ALIAS)
FRONTS: dict[str, FrontEnd] = {f.name: f for f in (CHAT_COMPLETIONS, ANTHROPIC_MESSAGES, RESPONSES)}
PROVIDERS = {f.value: f for f in ProviderFormat}
TARGETS = {
    ProviderFormat.OPENAI_CHAT: Target("gpt-4o-2024-08-06", default_max_output_tokens=1024),
    ProviderFormat.ANTHROPIC_MESSAGES: Target("claude-sonnet-4-5-20250929", default_max_output_tokens=1024),
    ProviderFormat.GEMINI: Target("gemini-2.5-flash", default_max_output_tokens=1024),
    ProviderFormat.BEDROCK_CONVERSE: Target("anthropic.claude-3-5-sonnet-20240620-v1:0"),
}
CHAIN_REQUEST = "streaming"


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def _ids(value: object) -> str:
    return str(getattr(value, "value", value))


# Expectations, and the update switch.


def expect_json(path: Path, actual: Any) -> None:
    if UPDATE and (not path.exists() or load(path) != actual):
        path.write_bytes(orjson.dumps(actual, option=orjson.OPT_INDENT_2) + b"\n")
    assert path.exists(), f"missing expectation {path.relative_to(GOLDEN)}"
    assert actual == load(path), f"{path.relative_to(GOLDEN)} differs"


def expect_bytes(path: Path, actual: bytes) -> None:
    if UPDATE and (not path.exists() or path.read_bytes() != actual):
        path.write_bytes(actual)
    assert path.exists(), f"missing expectation {path.relative_to(GOLDEN)}"
    expected = path.read_bytes()
    if actual != expected:
        got, want = actual.decode().split("\n\n"), expected.decode().split("\n\n")
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        shown = [(frames[first] if first < len(frames) else "<end>").replace("\n", " | ") for frames in (got, want)]
        pytest.fail(f"{path.relative_to(GOLDEN)} differs at frame {first}:\n  got:  {shown[0]}\n  want: {shown[1]}")


def reply_json(reply: ErrorReply) -> dict[str, Any]:
    return {"status": reply.status, "headers": reply.headers, "body": orjson.loads(reply.body)}


# The alias each provider format serves, and the pipeline's resolve.


def alias_plan(fmt: ProviderFormat) -> AliasPlan:
    deployment = Deployment(f"{fmt.value}-1", fmt, codec_for(fmt), cast(Any, None), "acct", "quota")
    route = RouteTarget(f"route-{fmt.value}", deployment, TARGETS[fmt], 1, 0, DeploymentHealth(CircuitPolicy()))
    return AliasPlan(
        name=ALIAS,
        capabilities=FORMAT_CAPABILITIES[fmt],
        max_input_tokens=100_000,
        max_output_tokens=4096,
        default_max_output_tokens=1024,
        allowed_parameters=frozenset(),
        reject_unknown_parameters=True,
        groups=((route,),),
        retry=RetryPolicy(3, 0.1, 1.0, frozenset({429, 503})),
    )


PLANS = {fmt: alias_plan(fmt) for fmt in ProviderFormat}


def resolver(fmt: ProviderFormat) -> Callable[[str, bool], AliasPlan]:
    def resolve(model: str, stream: bool) -> AliasPlan:
        if model != ALIAS:
            raise model_not_found(model)
        return PLANS[fmt]

    return resolve


def decode_request(case: str, client: str, fmt: ProviderFormat = ProviderFormat.OPENAI_CHAT) -> CanonicalRequest:
    raw = (CLIENTS / "requests" / f"{case}.{client}.json").read_bytes()
    return FRONTS[client].decode(raw, resolver(fmt))


# Canonical values from their JSON form.


def usage_of(doc: dict[str, Any]) -> Usage:
    return Usage(**doc)


def response_of(doc: dict[str, Any]) -> CanonicalResponse:
    calls = doc.get("tool_calls")
    return CanonicalResponse(
        content=doc["content"],
        tool_calls=[ToolCall(**c) for c in calls] if calls is not None else None,
        finish_reason=doc["finish_reason"],
        usage=usage_of(doc["usage"]) if doc.get("usage") is not None else None,
        provider_response_id=doc.get("provider_response_id"),
        refusal=doc.get("refusal"),
    )


def event_of(doc: dict[str, Any]) -> StreamEvent:
    kind = doc["type"]
    if kind == "start":
        return StreamStart(doc.get("provider_response_id"))
    if kind == "text":
        return TextDelta(doc["text"])
    if kind == "tool_call":
        return ToolCallDelta(doc["index"], doc.get("id"), doc.get("name"), doc.get("arguments", ""))
    if kind == "finish":
        return StreamFinish(doc["reason"])
    if kind == "skipped":
        return SkippedEvent()
    assert kind == "usage", kind
    return StreamUsage(usage_of(doc["usage"]))


def gateway_error(doc: dict[str, Any]) -> GatewayError:
    cls = getattr(tollway.exceptions, doc["error"])
    assert isinstance(cls, type) and issubclass(cls, GatewayError)
    return cls(doc.get("message"), param=doc.get("param"), retry_after=doc.get("retry_after"))


# Requests: client body -> front end -> provider codec.


def _request_cases() -> list[tuple[str, str, ProviderFormat]]:
    out: list[tuple[str, str, ProviderFormat]] = []
    for path in sorted((CLIENTS / "requests").glob("*.json")):
        parts = path.name.split(".")
        if len(parts) == 3:
            out.extend((parts[0], parts[1], fmt) for fmt in ProviderFormat)
    return out


def _outcome(case: str, client: str, fmt: ProviderFormat) -> tuple[str, Any]:
    """``("body", upstream body)``, or ``("error", error reply)`` when the body is refused."""
    try:
        req = decode_request(case, client, fmt)
        upstream = codec_for(fmt).encode_request(req, TARGETS[fmt])
    except GatewayError as err:
        return "error", reply_json(FRONTS[client].encode_error(err))
    sent = bool(load(CLIENTS / "requests" / f"{case}.{client}.json").get("stream"))
    assert upstream.stream is req.stream is sent, "the upstream request streams as the client asked"
    return "body", orjson.loads(upstream.body)


@pytest.mark.parametrize(("case", "client", "fmt"), _request_cases(), ids=_ids)
def test_client_request_reaches_provider_as_recorded(case: str, client: str, fmt: ProviderFormat) -> None:
    folder = CLIENTS / "requests"
    body = folder / f"{case}.{client}.{fmt.value}.json"
    scoped = folder / f"{case}.{client}.{fmt.value}.error.json"
    shared = folder / f"{case}.{client}.error.json"
    kind, actual = _outcome(case, client, fmt)
    present = [p for p in (body, scoped, shared) if p.exists()]
    if UPDATE and not present:
        if kind == "body":
            present = [body]
        else:
            everywhere = all(_outcome(case, client, f) == (kind, actual) for f in ProviderFormat)
            present = [shared if everywhere else scoped]
    assert len(present) == 1, f"{case}.{client} needs exactly one expectation for {fmt.value}: {present}"
    path = present[0]
    if path is body:
        assert kind == "body", f"{path.name} expects an upstream body, but the request was refused: {actual}"
    else:
        assert kind == "error", f"{path.name} expects a refusal, but the request was sent: {actual}"
    expect_json(path, actual)


# Buffered responses and errors.


def _per_client(folder: str) -> list[tuple[str, str]]:
    cases = sorted(p.stem for p in (CLIENTS / folder).glob("*.json") if p.name.count(".") == 1)
    return [(case, client) for case in cases for client in FRONTS]


@pytest.mark.parametrize(("case", "client"), _per_client("responses"))
def test_response_encodes_as_recorded(case: str, client: str) -> None:
    doc = load(CLIENTS / "responses" / f"{case}.json")
    req = decode_request(doc["request"], client)
    body = FRONTS[client].encode_response(META, response_of(doc["response"]), req)
    expect_json(CLIENTS / "responses" / f"{case}.{client}.json", orjson.loads(body))


@pytest.mark.parametrize(("case", "client"), _per_client("errors"))
def test_error_encodes_as_recorded(case: str, client: str) -> None:
    err = gateway_error(load(CLIENTS / "errors" / f"{case}.json"))
    expect_json(CLIENTS / "errors" / f"{case}.{client}.json", reply_json(FRONTS[client].encode_error(err)))


# Streams.


def run_stream(
    encoder: StreamEncoder, events: list[StreamEvent], usage: Usage | None, err: GatewayError | None
) -> bytes:
    """The pipeline's drive of an encoder: each event, then ``end`` or ``error``."""
    out = [encoder.event(ev) for ev in events]
    if err is not None:
        out.append(encoder.error(err))
    else:
        assert usage is not None
        out.append(encoder.end(usage))
    return b"".join(out)


@pytest.mark.parametrize(("case", "client"), _per_client("streams"))
def test_stream_encodes_as_recorded(case: str, client: str) -> None:
    doc = load(CLIENTS / "streams" / f"{case}.json")
    req = decode_request(doc["request"], client)
    events = [event_of(e) for e in doc["events"]]
    usage = usage_of(doc["end"]["usage"]) if "end" in doc else None
    err = gateway_error(doc["error"]) if "error" in doc else None
    data = run_stream(FRONTS[client].encode_stream(META, req), events, usage, err)
    expect_bytes(CLIENTS / "streams" / f"{case}.{client}.sse", data)


async def _decode_provider(fmt: ProviderFormat, chunks: list[bytes]) -> tuple[list[StreamEvent], UpstreamError | None]:
    parser = SseParser()

    async def framed() -> AsyncIterator[SseEvent]:
        for chunk in chunks:
            for event in parser.feed(chunk):
                yield event

    events: list[StreamEvent] = []
    try:
        async for event in codec_for(fmt).decode_stream(framed()):
            events.append(event)
    except UpstreamError as exc:
        return events, exc
    return events, None


def _chain_cases() -> list[tuple[str, ProviderFormat]]:
    out: list[tuple[str, ProviderFormat]] = []
    for path in sorted((GOLDEN / "streams").glob("*.sse")):
        case, fmt, _ = path.name.split(".")
        out.append((case, PROVIDERS[fmt]))
    return out


def _error_key(exc: UpstreamError | None) -> tuple[Any, ...] | None:
    return None if exc is None else (exc.category, exc.reported, exc.reason)


@pytest.mark.parametrize(("case", "fmt"), _chain_cases(), ids=_ids)
async def test_provider_stream_reaches_every_client_as_recorded_at_every_split(case: str, fmt: ProviderFormat) -> None:
    data = (GOLDEN / "streams" / f"{case}.{fmt.value}.sse").read_bytes()
    events, exc = await _decode_provider(fmt, [data])
    for client, front in FRONTS.items():
        req = decode_request(CHAIN_REQUEST, client)
        reported = [ev.usage for ev in events if type(ev) is StreamUsage]
        chars = sum(len(ev.text) for ev in events if type(ev) is TextDelta)
        chars += sum(len(ev.arguments) for ev in events if type(ev) is ToolCallDelta)
        usage = reported[-1] if reported else local_usage(estimate_request_tokens(req), chars)
        err = exc.to_stream_error() if exc is not None else None
        out = run_stream(front.encode_stream(META, req), events, usage, err)
        expect_bytes(CLIENTS / "chains" / f"{case}.{fmt.value}.{client}.sse", out)
    for i in range(1, len(data)):
        split_events, split_exc = await _decode_provider(fmt, [data[:i], data[i:]])
        assert split_events == events, f"split at byte {i} decodes differently"
        assert _error_key(split_exc) == _error_key(exc), f"split at byte {i} ends differently"


# Framing: every client transcript, split anywhere.


def _transcripts() -> list[str]:
    paths = [*(CLIENTS / "streams").glob("*.sse"), *(CLIENTS / "chains").glob("*.sse")]
    return sorted(str(p.relative_to(CLIENTS)) for p in paths)


def _parse(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    return [ev for chunk in chunks for ev in parser.feed(chunk)]


def _random_chunkings(data: bytes) -> list[list[bytes]]:
    chunkings = []
    for seed in range(8):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(data):
            step = rng.randint(1, 1 + rng.choice((2, 13, 61, 400)))
            chunks.append(data[i : i + step])
            i += step
        chunkings.append(chunks)
    return chunkings


def _check_framing(client: str, events: list[SseEvent]) -> None:
    """Each event well formed for its format: the ways a client's SSE reader tells events apart."""
    assert events, "a transcript has events"
    if client == CHAT_COMPLETIONS.name:
        assert all(ev.event is None for ev in events), "Chat Completions frames are data-only"
        datas = [ev.data for ev in events]
        if datas[-1] == "[DONE]":
            datas.pop()
        else:
            assert "error" in orjson.loads(datas[-1]), "a stream without [DONE] ends in an error frame"
        assert "[DONE]" not in datas
        for d in datas:
            assert isinstance(orjson.loads(d), dict)
        return
    payloads = [orjson.loads(ev.data) for ev in events]
    for ev, payload in zip(events, payloads, strict=True):
        assert ev.event == payload["type"], f"event {ev.event!r} carries type {payload['type']!r}"
    names = [ev.event for ev in events]
    if client == ANTHROPIC_MESSAGES.name:
        assert names[0] == "message_start" and names[-1] in ("message_stop", "error")
    else:
        assert names[:2] == ["response.created", "response.in_progress"]
        assert names[-1] in ("response.completed", "response.incomplete", "error")
        assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert names.count("error") <= 1 and ("error" not in names or names[-1] == "error")


@pytest.mark.parametrize("name", _transcripts())
def test_client_transcript_frames_the_same_at_every_byte_boundary(name: str) -> None:
    data = (CLIENTS / name).read_bytes()
    client = name.split(".")[-2]
    whole = _parse([data])
    _check_framing(client, whole)
    frames = [frame + b"\n\n" for frame in data.split(b"\n\n")[:-1]]
    assert b"".join(frames) == data and len(frames) == len(whole), "one event per frame, each ended by a blank line"
    for k, (frame, event) in enumerate(zip(frames, whole, strict=True)):
        for i in range(1, len(frame)):
            assert _parse([frame[:i], frame[i:]]) == [event], f"frame {k} split at its byte {i} frames differently"
    for n, chunks in enumerate(_random_chunkings(data)):
        assert _parse(chunks) == whole, f"random chunking #{n} frames differently"
    assert _parse([data[i : i + 1] for i in range(len(data))]) == whole


# The expected client shapes, validated against the official SDKs' types.

_ANTHROPIC_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
_RESPONSES_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)


def _validate_body(client: str, body: dict[str, Any]) -> None:
    if client == CHAT_COMPLETIONS.name:
        openai.types.chat.ChatCompletion.model_validate(body)
    elif client == ANTHROPIC_MESSAGES.name:
        anthropic.types.Message.model_validate(body)
    else:
        openai.types.responses.Response.model_validate(body)


def _validate_error(client: str, body: dict[str, Any]) -> None:
    if client == ANTHROPIC_MESSAGES.name:
        anthropic.types.ErrorResponse.model_validate(body)
        return
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and isinstance(error["type"], str)


def _validate_event(client: str, ev: SseEvent) -> None:
    if client == CHAT_COMPLETIONS.name:
        if ev.data == "[DONE]":
            return
        payload = orjson.loads(ev.data)
        if "error" in payload:
            _validate_error(client, payload)
        else:
            openai.types.chat.ChatCompletionChunk.model_validate(payload)
        return
    payload = orjson.loads(ev.data)
    if client == ANTHROPIC_MESSAGES.name:
        if payload["type"] == "error":
            anthropic.types.ErrorResponse.model_validate(payload)
        elif payload["type"] != "ping":
            _ANTHROPIC_EVENT.validate_python(payload)
    else:
        _RESPONSES_EVENT.validate_python(payload)


def test_expected_client_shapes_are_the_official_sdk_types() -> None:
    checked = 0
    for path in sorted((CLIENTS / "responses").glob("*.*.json")):
        _validate_body(path.name.split(".")[1], load(path))
        checked += 1
    errors = [*(CLIENTS / "errors").glob("*.*.json"), *(CLIENTS / "requests").glob("*.error.json")]
    for path in sorted(errors):
        _validate_error(path.name.split(".")[1], load(path)["body"])
        checked += 1
    for name in _transcripts():
        client = name.split(".")[-2]
        for ev in _parse([(CLIENTS / name).read_bytes()]):
            _validate_event(client, ev)
        checked += 1
    assert checked > 50


REQUEST_CASES = (
    "simple_text",
    "system_multi_turn",
    "tools_tool_choice",
    "tool_results",
    "images",
    "stop_sequences",
    "sampling",
    "streaming",
    "streaming_tools",
    "refused_parameter",
    "unknown_model",
)
"""The request cases every client format has; ``top_k`` (Anthropic) and ``json_schema`` (Chat
Completions, Responses) exist only where the client format has the field."""


def test_every_case_is_covered_for_every_client() -> None:
    """The matrix is complete: each client has every common request case, and every response,
    error and stream case, and every provider transcript is chained to each client."""
    for case in REQUEST_CASES:
        for client in FRONTS:
            assert (CLIENTS / "requests" / f"{case}.{client}.json").exists(), f"requests/{case}.{client}.json"
    for folder, suffix in (("responses", "json"), ("errors", "json"), ("streams", "sse")):
        cases = [p.stem for p in (CLIENTS / folder).glob("*.json") if p.name.count(".") == 1]
        assert cases, folder
        for case in cases:
            for client in FRONTS:
                assert (CLIENTS / folder / f"{case}.{client}.{suffix}").exists(), f"{folder}/{case}.{client}.{suffix}"
    for case, fmt in _chain_cases():
        for client in FRONTS:
            assert (CLIENTS / "chains" / f"{case}.{fmt.value}.{client}.sse").exists()
