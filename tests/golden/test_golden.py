"""Golden translation tests for every provider format.

- ``requests/<case>.json``: a canonical request, written as a small OpenAI-shaped JSON form
  (``canonical_request`` below reads it). Its expected upstream body per format is
  ``<case>.<format>.json``, or ``<case>.<format>.error.json`` when the format cannot carry it.
- ``responses/<case>.<format>.json``: a recorded-looking provider response; the expected
  canonical response is ``<case>.<format>.canonical.json``.
- ``streams/<case>.<format>.sse``: a raw provider SSE transcript; the expected canonical
  events (and the error ending the stream, if any) are ``<case>.<format>.events.json``.
  Each transcript is framed by ``SseParser`` under many chunkings, which must all agree.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    ContentPart,
    ImagePart,
    Message,
    RedactedThinking,
    ResponseFormat,
    SkippedEvent,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUsage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from tollway.exceptions import GatewayError, UpstreamError
from tollway.providers import ProviderFormat, Target, codec_for
from tollway.sse import SseParser
from tollway.wire import SseEvent

GOLDEN = Path(__file__).parent
TARGETS = {
    ProviderFormat.OPENAI_CHAT: Target("gpt-4o-2024-08-06"),
    ProviderFormat.ANTHROPIC_MESSAGES: Target("claude-sonnet-4-5-20250929", default_max_output_tokens=1024),
    ProviderFormat.GEMINI: Target("gemini-2.5-flash", default_max_output_tokens=1024),
    ProviderFormat.BEDROCK_CONVERSE: Target("anthropic.claude-3-5-sonnet-20240620-v1:0"),
}
FORMATS = {f.value: f for f in ProviderFormat}


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


# Canonical request from the golden input form.


def canonical_request(doc: dict[str, Any]) -> CanonicalRequest:
    stop = doc.get("stop")
    fmt = doc.get("response_format")
    return CanonicalRequest(
        messages=[_message(m) for m in doc["messages"]],
        max_output_tokens=doc.get("max_tokens"),
        temperature=doc.get("temperature"),
        top_p=doc.get("top_p"),
        stop=[stop] if isinstance(stop, str) else stop,
        stream=doc.get("stream", False),
        tools=[_tool(t["function"]) for t in doc["tools"]] if "tools" in doc else None,
        tool_choice=_tool_choice(doc.get("tool_choice")),
        parallel_tool_calls=doc.get("parallel_tool_calls"),
        response_format=ResponseFormat(fmt["type"], fmt.get("json_schema")) if fmt else None,
        user=doc.get("user"),
        metadata=doc.get("metadata"),
        extensions=doc.get("extensions", {}),
    )


def _message(doc: dict[str, Any]) -> Message:
    content = doc.get("content")
    calls = doc.get("tool_calls")
    return Message(
        role=doc["role"],
        content=[_part(p) for p in content] if isinstance(content, list) else content,
        name=doc.get("name"),
        tool_calls=[ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
        if calls
        else None,
        tool_call_id=doc.get("tool_call_id"),
    )


def _part(doc: dict[str, Any]) -> ContentPart:
    if doc["type"] == "text":
        return TextPart(doc["text"])
    return ImagePart(doc["image_url"]["url"], doc["image_url"].get("detail"))


def _tool(doc: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(doc["name"], doc.get("description"), doc.get("parameters"), doc.get("strict"))


def _tool_choice(doc: Any) -> ToolChoice | None:
    if doc is None:
        return None
    if isinstance(doc, dict):
        return ToolChoice("function", doc["function"]["name"])
    return ToolChoice(doc)


# Canonical values as JSON.


def usage_json(usage: Usage) -> dict[str, Any]:
    out = dataclasses.asdict(usage)
    out["evidence"] = usage.evidence.value
    return out


def response_json(resp: CanonicalResponse) -> dict[str, Any]:
    return {
        "content": resp.content,
        "tool_calls": [dataclasses.asdict(c) for c in resp.tool_calls] if resp.tool_calls is not None else None,
        "finish_reason": resp.finish_reason,
        "usage": usage_json(resp.usage) if resp.usage is not None else None,
        "provider_response_id": resp.provider_response_id,
        "refusal": resp.refusal,
    }


def event_json(event: StreamEvent) -> dict[str, Any]:
    if isinstance(event, StreamStart):
        return {"type": "start", "provider_response_id": event.provider_response_id}
    if isinstance(event, TextDelta):
        return {"type": "text", "text": event.text}
    if isinstance(event, ToolCallDelta):
        return {"type": "tool_call", **dataclasses.asdict(event)}
    if isinstance(event, StreamFinish):
        return {"type": "finish", "reason": event.reason}
    if isinstance(event, SkippedEvent):
        return {"type": "skipped"}
    if isinstance(event, ThinkingDelta):
        return {"type": "thinking", **dataclasses.asdict(event)}
    if isinstance(event, RedactedThinking):
        return {"type": "redacted_thinking", **dataclasses.asdict(event)}
    assert isinstance(event, StreamUsage)
    return {"type": "usage", "usage": usage_json(event.usage)}


# Requests.


def _request_cases() -> list[tuple[str, ProviderFormat]]:
    cases = sorted(p.stem for p in (GOLDEN / "requests").glob("*.json") if p.name.count(".") == 1)
    return [(case, fmt) for case in cases for fmt in ProviderFormat]


@pytest.mark.parametrize(("case", "fmt"), _request_cases(), ids=lambda v: getattr(v, "value", v))
def test_request_encodes_as_recorded(case: str, fmt: ProviderFormat) -> None:
    folder = GOLDEN / "requests"
    req = canonical_request(load(folder / f"{case}.json"))
    expected, expected_error = folder / f"{case}.{fmt.value}.json", folder / f"{case}.{fmt.value}.error.json"
    assert expected.exists() != expected_error.exists(), f"{case} needs exactly one expectation for {fmt.value}"
    codec = codec_for(fmt)
    if expected_error.exists():
        want = load(expected_error)
        with pytest.raises(GatewayError) as info:
            codec.encode_request(req, TARGETS[fmt])
        assert (type(info.value).__name__, info.value.param) == (want["error"], want["param"])
        return
    upstream = codec.encode_request(req, TARGETS[fmt])
    assert orjson.loads(upstream.body) == load(expected)
    assert upstream.stream is req.stream


# Responses.


def _response_cases() -> list[tuple[str, ProviderFormat]]:
    out = []
    for path in sorted((GOLDEN / "responses").glob("*.json")):
        case, fmt, *rest = path.name.split(".")
        if rest == ["json"]:
            out.append((case, FORMATS[fmt]))
    return out


@pytest.mark.parametrize(("case", "fmt"), _response_cases(), ids=lambda v: getattr(v, "value", v))
def test_response_decodes_as_recorded(case: str, fmt: ProviderFormat) -> None:
    folder = GOLDEN / "responses"
    body = (folder / f"{case}.{fmt.value}.json").read_bytes()
    resp = codec_for(fmt).decode_response(200, body)
    assert response_json(resp) == load(folder / f"{case}.{fmt.value}.canonical.json")


# Streams.


def _whole(data: bytes) -> list[list[bytes]]:
    return [[data]]


def _single_bytes(data: bytes) -> list[list[bytes]]:
    return [[data[i : i + 1] for i in range(len(data))]]


def _inside_utf8(data: bytes) -> list[list[bytes]]:
    """Two chunks, split at every byte that continues a multibyte UTF-8 character."""
    cuts = [i for i, b in enumerate(data) if 0x80 <= b <= 0xBF]
    assert cuts, "a stream golden should carry non-ASCII text"
    return [[data[:i], data[i:]] for i in cuts]


def _random(data: bytes) -> list[list[bytes]]:
    chunkings = []
    for seed in range(20):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(data):
            step = rng.randint(1, 1 + rng.choice((3, 17, 97, 600)))
            chunks.append(data[i : i + step])
            i += step
        chunkings.append(chunks)
    return chunkings


def _crlf(data: bytes) -> list[list[bytes]]:
    converted = data.replace(b"\n", b"\r\n")
    return _random(converted) + _single_bytes(converted)


def _cr(data: bytes) -> list[list[bytes]]:
    converted = data.replace(b"\n", b"\r")
    return _random(converted) + _single_bytes(converted)


CHUNKINGS: dict[str, Callable[[bytes], list[list[bytes]]]] = {
    "whole": _whole,
    "bytes": _single_bytes,
    "inside-utf8": _inside_utf8,
    "random": _random,
    "crlf": _crlf,
    "cr": _cr,
}


def _stream_cases() -> list[tuple[str, ProviderFormat, str]]:
    out: list[tuple[str, ProviderFormat, str]] = []
    for path in sorted((GOLDEN / "streams").glob("*.sse")):
        case, fmt, _ = path.name.split(".")
        out.extend((case, FORMATS[fmt], chunking) for chunking in CHUNKINGS)
    return out


async def _decode(fmt: ProviderFormat, chunks: list[bytes]) -> dict[str, Any]:
    parser = SseParser()

    async def framed() -> AsyncIterator[SseEvent]:
        for chunk in chunks:
            for event in parser.feed(chunk):
                yield event

    events: list[dict[str, Any]] = []
    try:
        async for event in codec_for(fmt).decode_stream(framed()):
            events.append(event_json(event))
    except UpstreamError as exc:
        return {"events": events, "error": {"category": exc.category.value}}
    return {"events": events, "error": None}


@pytest.mark.parametrize(("case", "fmt", "chunking"), _stream_cases(), ids=lambda v: getattr(v, "value", v))
async def test_stream_decodes_as_recorded_under_any_chunking(case: str, fmt: ProviderFormat, chunking: str) -> None:
    folder = GOLDEN / "streams"
    data = (folder / f"{case}.{fmt.value}.sse").read_bytes()
    expected = load(folder / f"{case}.{fmt.value}.events.json")
    for n, chunks in enumerate(CHUNKINGS[chunking](data)):
        assert await _decode(fmt, chunks) == expected, f"chunking {chunking} #{n} differs"


def test_every_stream_golden_has_expectations() -> None:
    transcripts = sorted((GOLDEN / "streams").glob("*.sse"))
    assert len(transcripts) >= 6
    for path in transcripts:
        assert path.with_suffix(".events.json").exists(), path.name
