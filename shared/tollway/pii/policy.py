"""PII profiles compiled at publication, and the tokenization of one request.

A :class:`PiiProfile` is what an alias's ``piiProfileId`` names, compiled once: its detector, its
scope, its unresolved-token policy. :class:`Tokenizer` walks a canonical request and replaces
every detected value in the places that carry content (message text, text parts, tool-call
arguments' string values, tool results, embeddings inputs) and nowhere else: roles, names, tool
names and schemas, model names, metadata and thinking blocks (signed by the provider, sent back
byte for byte) are never touched.

Placeholders are minted through a :class:`~tollway.pii.recovery.Mapping`, one per request. In
``request`` scope their ids are random. In ``session`` and ``host`` scope the id is a keyed hash of
(binding, kind, value) under a key derived for that purpose alone, so the same value gets the
same placeholder for the whole session (the model sees one name for one person across turns):
linkable inside the scope by design, and nowhere else, since the binding is under the hash.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from tollway.canonical import CanonicalRequest, ContentPart, EmbeddingRequest, Message, TextPart, ToolCall
from tollway.pii.detectors import Detector
from tollway.pii.placeholders import PLACEHOLDER_RE, PlaceholderMinter, encode_id, normalise_kind
from tollway.pii.recovery import Mapping

__all__ = ["ENRICHMENT", "PiiKeys", "PiiProfile", "Tokenized", "Tokenizer"]

Scope = Literal["request", "session", "host"]

ENRICHMENT = (
    "Some values in this conversation are replaced by placeholders such as "
    "[TWPII1_EMAIL_AAAAAAAAAAAAAAAA_AAAAAAAAAAAAA]. Copy every placeholder exactly, character for "
    "character, wherever the value it stands for belongs; never alter, explain or invent one."
)
"""The server-owned instruction added under ``promptEnrichment`` (only when a value was replaced)."""

_MAX_JSON_DEPTH = 64


@dataclass(frozen=True, slots=True, eq=False)
class PiiProfile:
    id: str
    detector: Detector
    scope: Scope
    unresolved: Literal["leave-masked", "reject-buffered"]
    streaming: bool
    enrichment: bool
    ttl_s: int
    offload: bool = False
    """Detection is slow (a model: ``engine: presidio``, about 30 ms per 2 KB): it runs in a worker
    thread, so one request's scan does not hold the event loop every other request runs on."""

    @property
    def version(self) -> str:
        """The detector's rule version: what the audit trail records."""
        return self.detector.version


class PiiKeys:
    """The placeholder MAC keys and the key that derives session and host ids from values."""

    __slots__ = ("_derive", "minter")

    def __init__(self, minter: PlaceholderMinter, derive_secret: bytes) -> None:
        self.minter = minter
        self._derive = hmac.new(derive_secret, b"tollway.pii.id-derivation", hashlib.sha256).digest()

    def derived_id(self, binding: bytes, kind: str, value: str) -> str:
        state = hmac.new(self._derive, binding, hashlib.sha256)
        state.update(b"\x00" + kind.encode("ascii") + b"\x00" + value.encode("utf-8"))
        return encode_id(state.digest()[:10])

    def __repr__(self) -> str:
        return f"PiiKeys({self.minter!r})"


@dataclass(slots=True)
class Tokenized:
    """What one request's tokenization did: counts per kind, and the placeholders new to it."""

    counts: dict[str, int] = field(default_factory=dict)
    minted: list[tuple[str, str, str]] = field(default_factory=list)
    """(placeholder, kind, value) for each distinct value, in order: what a durable scope stores."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Tokenizer:
    """Replaces the values ``detector`` finds with placeholders of ``mapping``; one per request."""

    __slots__ = ("_derive", "_detector", "_mapping", "_seen", "_texts", "out")

    def __init__(self, profile: PiiProfile, mapping: Mapping, keys: PiiKeys, binding: bytes) -> None:
        self._detector = profile.detector
        self._mapping = mapping
        self._derive = None if profile.scope == "request" else (keys, binding)
        self._seen: dict[tuple[str, str], str] = {}
        self._texts: list[str] = []
        self.out = Tokenized()

    def digest(self) -> str:
        """The audit manifest's digest: SHA-256 (its first 32 hex digits) of the JSON array of every
        text scanned, in order, as it was sent after tokenization.

        The texts alone, not the whole request serialized (1.8 µs for the 2 KB bench prompt, where
        ``orjson.dumps`` of the request's dataclasses took 2.9 more): what tokenization changed is
        text, and the rest of the request is in the audit trail's own fields."""
        return hashlib.sha256(orjson.dumps(self._texts)).hexdigest()[:32]

    def text(self, text: str) -> str:
        spans = self._detector.find(text)
        if not spans:
            self._texts.append(text)
            return text
        placeholder = self._placeholder
        pieces: list[str] = []
        at = 0
        for start, end, kind in spans:
            value = text[start:end]
            if value[0] == "[" and PLACEHOLDER_RE.fullmatch(value):
                continue  # a placeholder sent back is content already protected
            pieces.append(text[at:start])
            pieces.append(placeholder(kind, value))
            at = end
        if not pieces:
            self._texts.append(text)
            return text
        pieces.append(text[at:])
        out = "".join(pieces)
        self._texts.append(out)
        return out

    def _placeholder(self, kind: str, value: str) -> str:
        counts = self.out.counts
        counts[kind] = counts.get(kind, 0) + 1
        tag = normalise_kind(kind)
        key = (tag, value)
        known = self._seen.get(key)
        if known is not None:
            return known
        if self._derive is None:
            token = self._mapping.mint(tag, value)
        else:
            keys, binding = self._derive
            token = keys.minter.mint_with_id(tag, binding, keys.derived_id(binding, tag, value))
            self._mapping.insert(token, value)
        self._seen[key] = token
        self.out.minted.append((token, tag, value))
        return token

    def request(self, req: CanonicalRequest | EmbeddingRequest) -> None:
        """Tokenize ``req`` in place."""
        if isinstance(req, EmbeddingRequest):
            if req.inputs and isinstance(req.inputs[0], str):
                req.inputs = [self.text(i) for i in req.inputs if isinstance(i, str)]
            return
        req.messages = [self._message(m) for m in req.messages]

    def _message(self, m: Message) -> Message:
        content = m.content
        if isinstance(content, str):
            new: str | list[ContentPart] | None = self.text(content)
        elif content is not None:
            new = [self._part(p) for p in content]
        else:
            new = None
        calls = [self._call(c) for c in m.tool_calls] if m.tool_calls else m.tool_calls
        if new is content and calls is m.tool_calls:
            return m
        # A new message, field by field (0.14 µs, where ``dataclasses.replace`` took 0.83); a unit
        # test fails when ``Message`` gains a field this does not copy.
        return Message(m.role, new, m.name, calls, m.tool_call_id, m.cache_control)

    def _part(self, part: ContentPart) -> ContentPart:
        if type(part) is TextPart:
            text = self.text(part.text)
            return part if text is part.text else replace(part, text=text)
        return part  # images, and thinking blocks the provider signed

    def _call(self, call: ToolCall) -> ToolCall:
        """A tool call's arguments are JSON: only their string values are content (keys are the
        tool's schema). Arguments that are not JSON are scanned as text."""
        try:
            doc = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            text = self.text(call.arguments)
            return call if text is call.arguments else replace(call, arguments=text)
        before = self.out.total
        walked = self._json(doc, 0)
        if self.out.total == before:
            return call
        return replace(call, arguments=orjson.dumps(walked).decode("utf-8"))

    def _json(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if depth >= _MAX_JSON_DEPTH:
            return value
        if isinstance(value, list):
            return [self._json(v, depth + 1) for v in value]
        if isinstance(value, dict):
            return {k: self._json(v, depth + 1) for k, v in value.items()}
        return value
