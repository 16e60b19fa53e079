"""Golden tests for what providers' reasoning carries across turns: Bedrock Converse's
``reasoningContent`` (thinking blocks and their signatures) and Gemini's ``thoughtSignature``.

The cases live in ``reasoning/``, beside the main goldens and in their spirit, with the inputs
these need and the main harness does not read (thinking parts, a thinking budget, a tool call's
provider signature):

- ``<case>.request.json``: a canonical request in the OpenAI-shaped form, plus ``thinking_budget``,
  ``thinking``/``redacted_thinking`` content parts and ``signature`` on a tool call; its upstream
  body per format is ``<case>.<format>.json``, for the formats that have one.
- ``<case>.<format>.response.json``: a provider's answer; ``<case>.<format>.canonical.json`` the
  canonical response, thinking blocks and tool-call signatures included.
- ``<case>.bedrock-converse.stream.json``: Converse stream events as ``{"event", "payload"}``, framed
  here as a real AWS event stream and fed in many chunkings; ``<case>.<format>.events.json`` the
  canonical events. ``<case>.gemini.sse``: a raw SSE transcript, likewise.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    ContentPart,
    Message,
    RedactedThinking,
    RedactedThinkingPart,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from tollway.eventstream import EventStreamMessage, EventStreamParser, encode_event
from tollway.providers import ProviderFormat, Target, codec_for
from tollway.sse import SseParser
from tollway.wire import SseEvent

FOLDER = Path(__file__).parent / "reasoning"
TARGETS = {
    ProviderFormat.GEMINI: Target("gemini-3-pro-preview", default_max_output_tokens=1024),
    ProviderFormat.BEDROCK_CONVERSE: Target("anthropic.claude-sonnet-4-5-20250929-v1:0"),
}
FORMATS = {f.value: f for f in ProviderFormat}


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def canonical_request(doc: dict[str, Any]) -> CanonicalRequest:
    return CanonicalRequest(
        messages=[_message(m) for m in doc["messages"]],
        max_output_tokens=doc.get("max_tokens"),
        stream=doc.get("stream", False),
        tools=[ToolDefinition(t["function"]["name"], None, t["function"].get("parameters")) for t in doc["tools"]]
        if "tools" in doc
        else None,
        thinking_budget=doc.get("thinking_budget"),
    )


def _message(doc: dict[str, Any]) -> Message:
    content = doc.get("content")
    calls = doc.get("tool_calls")
    return Message(
        role=doc["role"],
        content=[_part(p) for p in content] if isinstance(content, list) else content,
        tool_calls=[_call(c) for c in calls] if calls else None,
        tool_call_id=doc.get("tool_call_id"),
    )


def _call(doc: dict[str, Any]) -> ToolCall:
    call = ToolCall(doc["id"], doc["function"]["name"], doc["function"]["arguments"])
    if "signature" in doc:
        return _signed(call, doc["signature"])
    return call


def _signed(call: ToolCall, signature: str) -> ToolCall:
    from tollway.providers.gemini.signatures import sign_call

    return sign_call(call, signature)


def _part(doc: dict[str, Any]) -> ContentPart:
    if doc["type"] == "thinking":
        return ThinkingPart(doc["thinking"], doc["signature"])
    if doc["type"] == "redacted_thinking":
        return RedactedThinkingPart(doc["data"])
    return TextPart(doc["text"])


def response_json(resp: CanonicalResponse) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": resp.content,
        "tool_calls": [_call_json(c) for c in resp.tool_calls] if resp.tool_calls is not None else None,
        "finish_reason": resp.finish_reason,
    }
    if resp.thinking is not None:
        out["thinking"] = [
            {"type": "thinking", "thinking": b.thinking, "signature": b.signature}
            if isinstance(b, ThinkingPart)
            else {"type": "redacted_thinking", "data": b.data}
            for b in resp.thinking
        ]
    return out


def _call_json(call: ToolCall) -> dict[str, Any]:
    from tollway.providers.gemini.signatures import call_signature

    out = {"id": call.id, "name": call.name, "arguments": call.arguments}
    signature = call_signature(call)
    if signature is not None:
        out["signature"] = signature
    return out


def event_json(event: StreamEvent) -> dict[str, Any]:
    if isinstance(event, StreamStart):
        return {"type": "start", "provider_response_id": event.provider_response_id}
    if isinstance(event, TextDelta):
        return {"type": "text", "text": event.text}
    if isinstance(event, ToolCallDelta):
        from tollway.providers.gemini.signatures import delta_signature

        out: dict[str, Any] = {
            "type": "tool_call",
            "index": event.index,
            "id": event.id,
            "name": event.name,
            "arguments": event.arguments,
        }
        signature = delta_signature(event)
        if signature is not None:
            out["signature"] = signature
        return out
    if isinstance(event, ThinkingDelta):
        return {"type": "thinking", "index": event.index, "thinking": event.thinking, "signature": event.signature}
    if isinstance(event, RedactedThinking):
        return {"type": "redacted_thinking", "index": event.index, "data": event.data}
    if isinstance(event, StreamFinish):
        return {"type": "finish", "reason": event.reason}
    assert isinstance(event, StreamUsage)
    return {
        "type": "usage",
        "prompt_tokens": event.usage.prompt_tokens,
        "completion_tokens": event.usage.completion_tokens,
    }


def _cases(suffix: str) -> list[tuple[str, ProviderFormat]]:
    out = []
    for path in sorted(FOLDER.glob(f"*{suffix}")):
        case, fmt, *_ = path.name.split(".")
        out.append((case, FORMATS[fmt]))
    return out


def _request_cases() -> list[tuple[str, ProviderFormat]]:
    out: list[tuple[str, ProviderFormat]] = []
    for path in sorted(FOLDER.glob("*.request.json")):
        case = path.name.split(".")[0]
        out.extend((case, fmt) for fmt in TARGETS if (FOLDER / f"{case}.{fmt.value}.json").exists())
    return out


@pytest.mark.parametrize(("case", "fmt"), _request_cases(), ids=lambda v: getattr(v, "value", v))
def test_request_encodes_as_recorded(case: str, fmt: ProviderFormat) -> None:
    req = canonical_request(load(FOLDER / f"{case}.request.json"))
    upstream = codec_for(fmt).encode_request(req, TARGETS[fmt])
    assert orjson.loads(upstream.body) == load(FOLDER / f"{case}.{fmt.value}.json")


@pytest.mark.parametrize(("case", "fmt"), _cases(".response.json"), ids=lambda v: getattr(v, "value", v))
def test_response_decodes_as_recorded(case: str, fmt: ProviderFormat) -> None:
    body = (FOLDER / f"{case}.{fmt.value}.response.json").read_bytes()
    resp = codec_for(fmt).decode_response(200, body)
    assert response_json(resp) == load(FOLDER / f"{case}.{fmt.value}.canonical.json")


def _chunkings(data: bytes) -> list[list[bytes]]:
    out = [[data], [data[i : i + 1] for i in range(len(data))]]
    for seed in range(10):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(data):
            step = rng.randint(1, 1 + rng.choice((3, 17, 97, 600)))
            chunks.append(data[i : i + step])
            i += step
        out.append(chunks)
    return out


async def _decode_eventstream(chunks: list[bytes]) -> list[dict[str, Any]]:
    parser = EventStreamParser()

    async def framed() -> AsyncIterator[EventStreamMessage]:
        for chunk in chunks:
            for message in parser.feed(chunk):
                yield message

    codec = codec_for(ProviderFormat.BEDROCK_CONVERSE)
    return [event_json(e) async for e in codec.decode_stream(framed())]  # type: ignore[arg-type]


async def _decode_sse(fmt: ProviderFormat, chunks: list[bytes]) -> list[dict[str, Any]]:
    parser = SseParser()

    async def framed() -> AsyncIterator[SseEvent]:
        for chunk in chunks:
            for event in parser.feed(chunk):
                yield event

    return [event_json(e) async for e in codec_for(fmt).decode_stream(framed())]  # type: ignore[arg-type]


@pytest.mark.parametrize(("case", "fmt"), _cases(".events.json"), ids=lambda v: getattr(v, "value", v))
async def test_stream_decodes_as_recorded_under_any_chunking(case: str, fmt: ProviderFormat) -> None:
    expected = load(FOLDER / f"{case}.{fmt.value}.events.json")
    if fmt is ProviderFormat.BEDROCK_CONVERSE:
        events = load(FOLDER / f"{case}.{fmt.value}.stream.json")
        data = b"".join(encode_event(e["event"], orjson.dumps(e["payload"])) for e in events)
    else:
        data = (FOLDER / f"{case}.{fmt.value}.sse").read_bytes()
    for n, chunks in enumerate(_chunkings(data)):
        if fmt is ProviderFormat.BEDROCK_CONVERSE:
            got = await _decode_eventstream(chunks)
        else:
            got = await _decode_sse(fmt, chunks)
        assert got == expected, f"chunking #{n} differs"


def test_every_case_has_its_expectation() -> None:
    for path in FOLDER.glob("*.response.json"):
        assert path.with_name(path.name.replace(".response.json", ".canonical.json")).exists(), path.name
    for path in [*FOLDER.glob("*.stream.json"), *FOLDER.glob("*.sse")]:
        stem = path.name.removesuffix(".stream.json").removesuffix(".sse")
        assert (FOLDER / f"{stem}.events.json").exists(), path.name
