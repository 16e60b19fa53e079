"""Exact recovery of placeholders in model output, buffered or streamed.

Recovery never guesses. A complete placeholder (``PLACEHOLDER_RE``) is handed to a
``Resolve`` function as it stands; if that returns a value, the value replaces it (``exact``),
otherwise the placeholder stays in the text (``left_masked``). Anything else that carries the
marker ``TWPII`` in any letter case (a placeholder a model re-cased, truncated, padded or
stripped of a bracket) is a ``near_miss``: counted for telemetry, left unchanged, never looked
up. Recovered values are not scanned again, so a value that itself looks like a placeholder
is never expanded.

``recover`` works on a whole text; ``StreamRecoverer`` gives the same result, character for
character and count for count, however the text is cut into chunks. It holds back only a
suffix that is still the beginning of a placeholder (at most ``MAX_PLACEHOLDER_LEN - 1``
characters, one placeholder's worth) and releases everything else at once, so no partial
placeholder syntax reaches a client and nothing released is ever retracted.

``Outcomes`` counts what happened and holds no token or value; the ``leave-masked`` policy
only reports it, ``reject-buffered`` rejects a buffered response when ``unresolved`` is true.

Values live in a request-scoped ``Mapping``. Python cannot wipe a ``str`` in place, so
``Mapping.clear`` drops every reference the mapping holds, making the values collectable, and
the mapping refuses any further use.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import orjson

from tollway.pii.placeholders import (
    PLACEHOLDER_RE,
    PlaceholderMinter,
    is_placeholder_prefix,
    normalise_kind,
    random_ids,
)

__all__ = [
    "ID_BATCH",
    "Escape",
    "Mapping",
    "Outcomes",
    "Resolve",
    "StreamRecoverer",
    "json_string_escape",
    "recover",
    "unresolved",
]

Resolve = Callable[[str], str | None]
"""A complete placeholder in, its value out; ``None`` when it is unknown or does not verify."""

Escape = Callable[[str], str]
"""How a recovered value is written into its channel, e.g. ``json_string_escape`` for tool arguments."""

ID_BATCH = 8
"""Random placeholder ids a mapping draws at once (one system call for up to eight values)."""

_MARKER = re.compile("twpii", re.IGNORECASE | re.ASCII)
_MARKER_TAIL = len("twpii") - 1


def _markers(text: str) -> int:
    """How many times ``TWPII`` appears in ``text``, in any mix of ASCII letter cases.

    ASCII text is lower-cased and counted with ``str.count`` (0.36 µs on 400 characters, where
    the case-insensitive ``_MARKER`` took 1.64: ``re`` folds case one character at a time). Other
    text keeps the pattern: ``str.lower`` folds non-ASCII letters too, some into ASCII ones."""
    if text.isascii():
        return text.lower().count("twpii")
    return len(_MARKER.findall(text))


def json_string_escape(value: str) -> str:
    """``value`` as the inside of a JSON string, for tool-call argument text."""
    return orjson.dumps(value)[1:-1].decode("utf-8")


@dataclass(slots=True)
class Outcomes:
    """How many placeholders were recovered, left masked, or nearly matched. No ids, no values."""

    exact: int = 0
    left_masked: int = 0
    near_miss: int = 0

    @property
    def unresolved(self) -> bool:
        """Whether anything that was meant to be recovered was not (``reject-buffered`` fails on it)."""
        return bool(self.left_masked or self.near_miss)

    def add(self, other: Outcomes) -> None:
        self.exact += other.exact
        self.left_masked += other.left_masked
        self.near_miss += other.near_miss


class Mapping:
    """A request's placeholders and the values they stand for.

    Every placeholder is minted under this mapping's ``binding``, and ``resolve`` verifies the
    MAC and binding before it looks anything up, so an unknown, altered or foreign placeholder
    never resolves. Within one mapping the same (kind, value) gets the same placeholder, so a
    repeated value reads as the same thing to the model; across mappings nothing is shared.
    """

    __slots__ = ("_binding", "_by_token", "_by_value", "_cleared", "_ids", "_minter")

    def __init__(self, minter: PlaceholderMinter, binding: bytes) -> None:
        self._minter = minter
        self._binding = bytes(binding)
        self._by_token: dict[str, str] = {}
        self._by_value: dict[tuple[str, str], str] = {}
        self._cleared = False
        self._ids = ""
        """Random ids drawn (``ID_BATCH`` at a time) and not used yet; each is used once."""

    def mint(self, kind: str, value: str) -> str:
        """The placeholder for ``value``: the one already given to it here, or a new one."""
        if self._cleared:
            self._check_open()
        key = (normalise_kind(kind), value)
        token = self._by_value.get(key)
        if token is None:
            ids = self._ids or random_ids(ID_BATCH)
            self._ids = ids[16:]
            token = self._minter.mint_tag(key[0], self._binding, ids[:16])
            self._by_token[token] = value
            self._by_value[key] = token
        return token

    def insert(self, token: str, value: str) -> None:
        """Record a placeholder minted elsewhere; it must verify under this mapping's binding."""
        self._check_open()
        verified = self._minter.verify(token, self._binding)
        if verified is None:
            raise ValueError("the placeholder does not verify under this mapping's binding")
        known = self._by_token.get(token)
        if known is not None and known != value:
            raise ValueError("the placeholder is already mapped to another value")
        self._by_token[token] = value
        self._by_value.setdefault((verified[1], value), token)

    def resolve(self, token: str) -> str | None:
        """The value of an exact placeholder of this mapping; ``None`` for anything else.

        A dictionary hit needs no MAC check: every key was minted here or verified by ``insert``
        under this binding, and a lookup is exact, so an altered or foreign token misses. (It saves
        an HMAC per restored placeholder; a miss is ``None`` either way.)"""
        return self._by_token.get(token)

    def clear(self) -> None:
        """Drop every value and placeholder; afterwards nothing resolves and nothing can be added."""
        self._by_token.clear()
        self._by_value.clear()
        self._ids = ""
        self._cleared = True

    def _check_open(self) -> None:
        if self._cleared:
            raise RuntimeError("the PII mapping has been cleared")

    def __len__(self) -> int:
        return len(self._by_token)

    def __repr__(self) -> str:
        return f"Mapping(entries={len(self._by_token)}, cleared={self._cleared})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("PII mappings are not serializable")


def _substitute(token: str, resolve: Resolve, escape: Escape | None, outcomes: Outcomes) -> str:
    value = resolve(token)
    if value is None:
        outcomes.left_masked += 1
        return token
    outcomes.exact += 1
    return value if escape is None else escape(value)


def recover(text: str, resolve: Resolve, escape: Escape | None = None) -> tuple[str, Outcomes]:
    """``text`` with every resolvable placeholder replaced, and what happened to each candidate."""
    outcomes = Outcomes()
    if "[" not in text:
        outcomes.near_miss = _markers(text)
        return text, outcomes
    parts: list[str] = []
    pos = 0
    for match in PLACEHOLDER_RE.finditer(text):
        plain = text[pos : match.start()]
        outcomes.near_miss += _markers(plain)
        parts.append(plain)
        parts.append(_substitute(match.group(), resolve, escape, outcomes))
        pos = match.end()
    rest = text[pos:]
    outcomes.near_miss += _markers(rest)
    parts.append(rest)
    return "".join(parts), outcomes


def unresolved(text: str, resolve: Resolve) -> bool:
    """Whether recovering ``text`` would leave a placeholder masked or meet a near miss."""
    return recover(text, resolve)[1].unresolved


class StreamRecoverer:
    """Recovery for one streamed channel: the text, or one tool call's argument text.

    ``feed`` returns what can be released now; ``flush`` returns the rest at the end of the
    stream and readies the recoverer for a new one. Concatenating every return value equals
    ``recover`` of the concatenated input, and ``outcomes`` then equals its counts; several
    channels may share one ``Outcomes``. A stream that stops without ``flush`` has released a
    prefix of that result and nothing else.
    """

    __slots__ = ("_escape", "_held", "_resolve", "_tail", "outcomes")

    def __init__(self, resolve: Resolve, escape: Escape | None = None, outcomes: Outcomes | None = None) -> None:
        self._resolve = resolve
        self._escape = escape
        self.outcomes = Outcomes() if outcomes is None else outcomes
        self._held = ""
        self._tail = ""  # the end of the plain text since the last placeholder, for a marker cut in two

    @property
    def held_chars(self) -> int:
        """How many characters are held back, waiting to see whether they end a placeholder."""
        return len(self._held)

    def feed(self, chunk: str) -> str:
        if not self._held and "[" not in chunk:
            self._count_plain(chunk)
            return chunk
        return self._scan(self._held + chunk)

    def flush(self) -> str:
        held = self._held
        self._held = ""
        self._count_plain(held)
        self._tail = ""
        return held

    def _scan(self, text: str) -> str:
        parts: list[str] = []
        pos = 0
        for match in PLACEHOLDER_RE.finditer(text):
            plain = text[pos : match.start()]
            self._count_plain(plain)
            parts.append(plain)
            parts.append(_substitute(match.group(), self._resolve, self._escape, self.outcomes))
            self._tail = ""
            pos = match.end()
        # A placeholder holds no "[" after its first character, so only the last "[" can start one.
        start = text.rfind("[", pos)
        if start != -1 and is_placeholder_prefix(text[start:]):
            self._held = text[start:]
        else:
            self._held = ""
            start = len(text)
        plain = text[pos:start]
        self._count_plain(plain)
        parts.append(plain)
        return "".join(parts)

    def _count_plain(self, text: str) -> None:
        if not text:
            return
        probe = self._tail + text
        found = _markers(probe)
        if found:
            self.outcomes.near_miss += found
        self._tail = probe[-_MARKER_TAIL:]

    def __repr__(self) -> str:
        return f"StreamRecoverer(held_chars={len(self._held)}, outcomes={self.outcomes!r})"
