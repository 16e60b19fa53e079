"""The conformance suite: a small, versioned set of cases, each the evidence for one capability.

A case is data: the canonical request it sends and the capability its check proves. The suite's
digest is the SHA-256 of its canonical JSON definition (every case's id, capability, requirements
and request, sorted keys), so a result names exactly what was asked, and a change to any request
without a new :data:`SUITE_VERSION` still shows as another digest.

Capabilities are the route capabilities of ``llm-router.yml`` (``streaming``, ``tools``,
``vision``, ``json_object``, ``json_schema``) plus three every chat deployment needs: ``chat``
(a buffered answer), ``usage`` (token counts, buffered and streamed) and ``errors`` (an invalid
request is classified as one).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from tollway.canonical import (
    CanonicalRequest,
    ImagePart,
    Message,
    ResponseFormat,
    Role,
    TextPart,
    ToolChoice,
    ToolDefinition,
)

__all__ = [
    "ALWAYS_REQUIRED",
    "CAPABILITIES",
    "CASES",
    "ROUTE_CAPABILITIES",
    "SUITE_VERSION",
    "Case",
    "suite_definition",
    "suite_digest",
]

SUITE_VERSION: Final = "1"
"""Raised whenever a case is added, removed or changes what it checks; results of another version
do not satisfy ``requireConformance``."""

ROUTE_CAPABILITIES: Final = ("streaming", "tools", "vision", "json_object", "json_schema")
"""The capabilities a route or alias declares (``capabilities``) that the suite tests."""
ALWAYS_REQUIRED: Final = ("chat", "usage", "errors")
"""What every route that requires conformance needs, whatever it declares."""
CAPABILITIES: Final = ("chat", "streaming", "usage", "tools", "vision", "json_object", "json_schema", "errors")

Mode = Literal["buffered", "stream"]

WEATHER_TOOL: Final = ToolDefinition(
    name="get_weather",
    description="The current weather of a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name"}},
        "required": ["city"],
    },
)
UNDECLARED_TOOL: Final = "conformance_undeclared_tool"
"""Forced while only :data:`WEATHER_TOOL` is declared: every provider refuses that as invalid."""
CITY_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def _png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour PNG, built here so the suite carries no binary file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )


IMAGE_URL: Final = "data:image/png;base64," + base64.b64encode(_png(32, 32, (200, 30, 30))).decode()


@dataclass(frozen=True, slots=True)
class Case:
    """One check. ``requires`` lists the route capabilities the provider format must be able to
    represent for the case to run at all (otherwise it is skipped)."""

    id: str
    capability: str
    mode: Mode
    messages: tuple[tuple[Role, str], ...]
    """``(role, text)`` pairs; the vision case adds its image to the last one."""
    max_output_tokens: int = 64
    requires: tuple[str, ...] = ()
    tools: bool = False
    forced_tool: str | None = None
    response_format: str | None = None
    image: bool = False

    def request(self) -> CanonicalRequest:
        """A fresh canonical request for this case (requests are mutable, so never shared)."""
        messages = [Message(role=role, content=text) for role, text in self.messages]
        if self.image:
            last = messages[-1]
            messages[-1] = Message(role=last.role, content=[TextPart(last.text()), ImagePart(IMAGE_URL)])
        fmt = None
        if self.response_format == "json_object":
            fmt = ResponseFormat(type="json_object")
        elif self.response_format == "json_schema":
            fmt = ResponseFormat(
                type="json_schema", json_schema={"name": "city_fact", "schema": CITY_SCHEMA, "strict": True}
            )
        return CanonicalRequest(
            messages=messages,
            max_output_tokens=self.max_output_tokens,
            temperature=0.0,
            stream=self.mode == "stream",
            include_usage=self.mode == "stream",
            tools=[WEATHER_TOOL] if self.tools else None,
            tool_choice=ToolChoice("function", self.forced_tool) if self.forced_tool else None,
            response_format=fmt,
        )

    def definition(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "capability": self.capability,
            "mode": self.mode,
            "requires": list(self.requires),
            "messages": [list(m) for m in self.messages],
            "maxOutputTokens": self.max_output_tokens,
            "tools": [_tool_json(WEATHER_TOOL)] if self.tools else [],
            "forcedTool": self.forced_tool,
            "responseFormat": self.response_format,
            "schema": CITY_SCHEMA if self.response_format == "json_schema" else None,
            "imageSha256": hashlib.sha256(IMAGE_URL.encode()).hexdigest() if self.image else None,
        }


def _tool_json(tool: ToolDefinition) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


_GREETING: Final[tuple[tuple[Role, str], ...]] = (("user", "Say hello in five words or fewer."),)

CASES: Final[tuple[Case, ...]] = (
    Case("chat.buffered", "chat", "buffered", _GREETING),
    Case("usage.buffered", "usage", "buffered", _GREETING),
    Case(
        "chat.stream", "streaming", "stream", (("user", "Count from one to five in words."),), requires=("streaming",)
    ),
    Case("usage.stream", "usage", "stream", _GREETING, requires=("streaming",)),
    Case(
        "tools.buffered",
        "tools",
        "buffered",
        (("user", "What is the weather in Paris? Use the tool."),),
        max_output_tokens=128,
        requires=("tools",),
        tools=True,
        forced_tool=WEATHER_TOOL.name,
    ),
    Case(
        "tools.stream",
        "tools",
        "stream",
        (("user", "What is the weather in Lisbon? Use the tool."),),
        max_output_tokens=128,
        requires=("tools", "streaming"),
        tools=True,
        forced_tool=WEATHER_TOOL.name,
    ),
    Case(
        "vision.buffered",
        "vision",
        "buffered",
        (("user", "What colour is this image? Answer in one word."),),
        requires=("vision",),
        image=True,
    ),
    Case(
        "json_object.buffered",
        "json_object",
        "buffered",
        (("user", 'Answer in JSON: an object whose "reply" key holds a short greeting.'),),
        max_output_tokens=128,
        requires=("json_object",),
        response_format="json_object",
    ),
    Case(
        "json_schema.buffered",
        "json_schema",
        "buffered",
        (("user", "Name a large city and its approximate population."),),
        max_output_tokens=128,
        requires=("json_schema",),
        response_format="json_schema",
    ),
    Case(
        "errors.invalid_request",
        "errors",
        "buffered",
        (("user", "What is the weather in Oslo?"),),
        tools=True,
        forced_tool=UNDECLARED_TOOL,
    ),
)


def suite_definition() -> dict[str, Any]:
    """The canonical definition the digest is taken over."""
    return {"version": SUITE_VERSION, "cases": [c.definition() for c in CASES]}


@functools.cache
def suite_digest() -> str:
    """SHA-256 (hex) of :func:`suite_definition` as sorted, compact JSON."""
    return hashlib.sha256(orjson.dumps(suite_definition(), option=orjson.OPT_SORT_KEYS)).hexdigest()
