"""Deterministic reply content: derived from the request alone, never from a clock or RNG.

A text reply is ``"Mock reply #<n>: "`` followed by the ``n`` words echoed from the last
user-side message (OpenAI ``user``/``tool``, Anthropic ``user``, tool-result text included),
truncated to :data:`ECHO_WORDS` words, or padded/truncated to exactly ``words`` words when
the fault spec asks for a length. Echoing lets end-to-end tests check that placeholders
survive a round trip through a gateway.

A JSON reply (``response_format`` ``json_object`` or ``json_schema``) and a tool call's
arguments are instances of the request's schema, built by :mod:`tollway.mock.json_instance`.

Usage is deterministic too: prompt tokens are ``ceil(characters of message text / 4)``,
completion tokens are the reply's word count (for a tool call, ``ceil(len(name + arguments) / 4)``;
for a JSON reply, ``ceil(len(json) / 4)``).

Under the ``placeholders`` fault, :func:`placeholder_reply` plays a model that handles the
gateway's PII placeholders well or badly: it copies, alters, drops or invents them
(docs/mock-provider.md). The grammar is written out here (:data:`PLACEHOLDER_RE`) because the
mock imports nothing of the gateway.

Extended thinking (Anthropic's ``thinking``) is ``"Mock thinking about: "`` and the echo's first
:data:`THINKING_WORDS` words, signed with :func:`thinking_signature`, a digest of the text, so the
mock can tell a thinking block sent back unchanged from one that was not.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tollway.mock.json_instance import instance

__all__ = [
    "DEFAULT_CHUNKS",
    "ECHO_WORDS",
    "FORGED_PLACEHOLDER",
    "PLACEHOLDER_MODES",
    "PLACEHOLDER_RE",
    "THINKING_WORDS",
    "JsonFormat",
    "MockRequest",
    "TextReply",
    "Thinking",
    "ToolReply",
    "ToolSpec",
    "build_text_reply",
    "content_text",
    "json_reply",
    "pick_tool",
    "placeholder_reply",
    "placeholder_text",
    "split_text",
    "text_reply",
    "thinking",
    "thinking_signature",
    "tool_arguments",
    "tool_reply",
]

DEFAULT_CHUNKS = 5
ECHO_WORDS = 64
THINKING_WORDS = 8
MIN_TOOL_FRAGMENTS = 3

_FILLER = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima "
    "mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
_TOKEN = re.compile(r"\S+\s*")

PLACEHOLDER_RE = re.compile(r"\[TWPII1_([A-Z0-9]{1,12})_([A-Z2-7]{16})_([A-Z2-7]{13})\]")
"""A PII placeholder as the gateway mints it, ``[TWPII1_<KIND>_<16 base32>_<13 base32>]``; groups:
kind, id, mac. It mirrors ``tollway.pii.placeholders.PLACEHOLDER_RE`` (a test keeps them equal)."""

FORGED_PLACEHOLDER = "[TWPII1_EMAIL_MOCKMOCKMOCKMOCK_MOCKMOCKMOCKM]"
"""What ``placeholders=invent`` adds: well-formed, so only its MAC can tell that no gateway minted it."""

PLACEHOLDER_MODES = ("echo", "alter", "drop", "invent")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The tool the mock decided to call."""

    name: str
    schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class JsonFormat:
    """The request asks for a JSON reply: an instance of ``schema``, or any object when it is ``None``."""

    schema: Mapping[str, Any] | None = None


@dataclass(slots=True)
class MockRequest:
    """What the mock needs from a request, whatever its wire format."""

    model: str
    stream: bool
    message_count: int
    echo: str
    prompt_chars: int
    include_usage: bool = False
    max_tokens: int | None = None
    tool: ToolSpec | None = None
    json_format: JsonFormat | None = None
    thinking: bool = False
    """Anthropic ``thinking`` is enabled: the answer opens with a thinking block."""
    cache_read_tokens: int = 0
    """Prompt tokens the request's cache breakpoints say were read from the prompt cache."""
    cache_creation_tokens: int = 0
    """Prompt tokens the request's cache breakpoints say were written to the prompt cache."""

    @property
    def prompt_tokens(self) -> int:
        return math.ceil(self.prompt_chars / 4)


@dataclass(frozen=True, slots=True)
class TextReply:
    text: str
    deltas: tuple[str, ...]
    completion_tokens: int
    truncated: bool
    """True when ``max_tokens`` cut the reply short."""


@dataclass(frozen=True, slots=True)
class ToolReply:
    name: str
    arguments: str
    """Compact JSON object."""
    fragments: tuple[str, ...]
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Thinking:
    text: str
    signature: str
    deltas: tuple[str, ...]
    tokens: int
    """Words, counted into the completion tokens."""


def thinking_signature(text: str) -> str:
    """The mock's signature of a thinking block's text: the first 32 hex digits of its SHA-256."""
    return "mock-signature-" + hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1024)
def thinking(echo: str) -> Thinking:
    """The thinking block of a request whose last user-side text is ``echo``, in two deltas."""
    words = ["Mock", "thinking", "about:", *echo.split()[:THINKING_WORDS]]
    text = " ".join(words)
    return Thinking(text, thinking_signature(text), split_text(text, 2), len(words))


def content_text(content: Any) -> str:
    """The text of a message ``content``: a string, or the text (and tool-result) parts of a list."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "tool_result":
            parts.append(content_text(part.get("content")))
    return " ".join(p for p in parts if p)


def build_text_reply(echo: str, words: int | None, max_tokens: int | None, chunks: int) -> TextReply:
    """The reply to a request whose last user-side text is ``echo``, built afresh (``text_reply``
    is the same, memoized; fault ``no_reply_cache=1`` asks for this one)."""
    echoed = echo.split()
    if words is None:
        body = echoed[:ECHO_WORDS]
    else:
        pool = echoed + _FILLER * (words // len(_FILLER) + 1)
        body = pool[:words]
    all_words = ["Mock", "reply", f"#{len(body)}:", *body]
    truncated = max_tokens is not None and 0 < max_tokens < len(all_words)
    if truncated:
        all_words = all_words[:max_tokens]
    text = " ".join(all_words)
    return TextReply(text, split_text(text, chunks), len(all_words), truncated)


text_reply = functools.lru_cache(maxsize=1024)(build_text_reply)
"""``build_text_reply``, memoized: a benchmark repeating one prompt costs the mock one build."""


def split_text(text: str, chunks: int) -> tuple[str, ...]:
    """Split into ``chunks`` non-empty deltas on word boundaries (on characters when words run out)."""
    count = max(1, min(chunks, len(text)))
    tokens = _TOKEN.findall(text)
    if count > len(tokens):
        tokens = list(text)
    total = len(tokens)
    return tuple("".join(tokens[i * total // count : (i + 1) * total // count]) for i in range(count))


def tool_arguments(schema: Mapping[str, Any]) -> str:
    """Compact JSON arguments: the schema's instance, or ``{}`` when that is not an object."""
    args = instance(schema)
    return orjson.dumps(args if isinstance(args, dict) else {}).decode()


def json_reply(fmt: JsonFormat, echo: str, words: int | None, chunks: int) -> TextReply:
    """The JSON text a ``json_object`` or ``json_schema`` request gets; ``max_tokens`` never cuts it.

    ``json_object``: ``{"reply": <the text reply>}``, so the echo still shows. ``json_schema``:
    the schema's instance.
    """
    value = {"reply": text_reply(echo, words, None, chunks).text} if fmt.schema is None else instance(fmt.schema)
    text = orjson.dumps(value).decode()
    return TextReply(text, split_text(text, chunks), math.ceil(len(text) / 4), False)


def tool_reply(tool: ToolSpec, chunks: int) -> ToolReply:
    arguments = tool_arguments(tool.schema)
    tokens = math.ceil((len(tool.name) + len(arguments)) / 4)
    return ToolReply(tool.name, arguments, _fragments(arguments, chunks), tokens)


def _fragments(arguments: str, chunks: int) -> tuple[str, ...]:
    count = max(1, min(max(chunks, MIN_TOOL_FRAGMENTS), len(arguments)))
    size = len(arguments)
    return tuple(arguments[i * size // count : (i + 1) * size // count] for i in range(count))


def _alter(match: re.Match[str]) -> str:
    kind = match.group(1)
    lowered = kind.lower()
    if lowered == kind:  # a kind of digits only: the closing bracket goes instead
        return match.group()[:-1]
    return f"[TWPII1_{lowered}_{match.group(2)}_{match.group(3)}]"


def placeholder_text(text: str, mode: str, *, append: bool = True) -> str:
    """``text`` with its placeholders handled as ``mode`` says.

    ``echo`` leaves them; ``alter`` lower-cases each one's kind (``[TWPII1_email_…]``, a near miss;
    a kind without letters loses its closing bracket instead); ``drop`` removes them; ``invent``
    adds :data:`FORGED_PLACEHOLDER` after the last one, or at the end of a text that has none when
    ``append`` (never in JSON, which must stay JSON). Placeholders hold no quote or backslash, so
    JSON text stays valid whatever the mode.
    """
    if mode == "alter":
        return PLACEHOLDER_RE.sub(_alter, text)
    if mode == "drop":
        return PLACEHOLDER_RE.sub("", text)
    if mode == "invent":
        end = -1
        for match in PLACEHOLDER_RE.finditer(text):
            end = match.end()
        if end >= 0:
            return f"{text[:end]} {FORGED_PLACEHOLDER}{text[end:]}"
        return f"{text} {FORGED_PLACEHOLDER}" if append else text
    return text


def _carry(arguments: str, echo: str) -> str:
    """Tool arguments whose first string value is the echo's placeholders, as a model that copies
    them into the call would write it; unchanged when the echo has none."""
    found = list(dict.fromkeys(m.group() for m in PLACEHOLDER_RE.finditer(echo)))
    if not found:
        return arguments
    args = orjson.loads(arguments)
    for key, value in args.items():
        if isinstance(value, str):
            args[key] = " ".join(found)
            return orjson.dumps(args).decode()
    return arguments


def placeholder_reply(
    reply: TextReply | ToolReply, mode: str, echo: str, chunks: int, *, structured: bool = False
) -> TextReply | ToolReply:
    """``reply`` as a model in placeholder ``mode`` writes it: its text (JSON when ``structured``),
    or a tool call whose first string argument carries the placeholders of ``echo``. Deltas are cut
    again; token counts stay those of the reply."""
    if isinstance(reply, ToolReply):
        arguments = placeholder_text(_carry(reply.arguments, echo), mode, append=False)
        if arguments == reply.arguments:
            return reply
        return ToolReply(reply.name, arguments, _fragments(arguments, chunks), reply.completion_tokens)
    text = placeholder_text(reply.text, mode, append=not structured)
    if text == reply.text:
        return reply
    return TextReply(text, split_text(text, chunks), reply.completion_tokens, reply.truncated)


def pick_tool(tools: Sequence[Any], forced: str | None, schema_key: str) -> ToolSpec | None:
    """The forced tool (by name) or the first tool; ``tools`` entries are already unwrapped."""
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if forced is None or tool["name"] == forced:
            schema = tool.get(schema_key)
            return ToolSpec(tool["name"], schema if isinstance(schema, dict) else {})
    return None
