"""Deterministic JSON instances of a JSON schema: the mock's structured output and tool arguments.

SDKs validate what the mock answers: ``client.chat.completions.parse(response_format=Model)``
parses the reply with pydantic, and a forced tool's arguments are parsed the same way. So a
reply must be an instance of the schema the request carries and, like every mock reply, the
same for the same request. The fake-data generators on PyPI pick values at random (``jsf``,
through Faker) or search for them (``hypothesis-jsonschema``); this one takes the first value
that fits:

- ``$ref`` (a JSON pointer into the root schema: ``#/$defs/…``, ``#/definitions/…``) and
  ``allOf`` are merged into one schema; ``anyOf``/``oneOf`` take their first branch that is not
  ``null`` (pydantic's ``Optional`` and unions; a discriminated union's tag is a ``const``);
- ``const``, else the first ``enum`` value;
- by ``type`` (of a list, the first non-null; without one, inferred from the keywords):

  - ``string``: ``"mock-<name>"``, ``<name>`` being the property's (the array's, for its items);
    a fixed valid value for a known ``format`` (``date-time``, ``date``, ``time``, ``email``,
    ``uri``, ``uuid``, ``ipv4``…); the shortest match of ``pattern`` when ``"mock-<name>"`` does
    not match it; padded with ``x`` or cut to ``minLength``/``maxLength``;
  - ``integer`` 1 and ``number`` 1.5, moved inside ``minimum``/``maximum`` (exclusive too) and
    onto ``multipleOf``; ``boolean`` true; ``null``;
  - ``array``: one item per ``prefixItems`` entry, else ``max(minItems, 1)`` items (``[]``
    without ``items``), made distinct under ``uniqueItems``;
  - ``object``: every property, and every ``required`` one;
- a schema that says nothing (``{}``) gives ``null``.

Recursive schemas end: where a ``$ref`` leads back into a definition being generated, or past
:data:`MAX_DEPTH` levels, an object keeps only its required properties, an array gets
``minItems`` items and a union prefers a branch that is ``null`` or does not recurse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_DEPTH", "instance"]

MAX_DEPTH: Final = 12
_HARD_DEPTH: Final = 64
"""A schema with no finite instance (a required property of its own type) is cut off here."""

_FORMATS: Final[Mapping[str, str]] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "duration": "P1D",
    "email": "mock@example.com",
    "idn-email": "mock@example.com",
    "uri": "https://example.com/mock",
    "iri": "https://example.com/mock",
    "uri-reference": "https://example.com/mock",
    "iri-reference": "https://example.com/mock",
    "url": "https://example.com/mock",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "byte": "bW9jaw==",
    "json-pointer": "/mock",
    "regex": "mock",
}
_COMBINATORS: Final = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
_OBJECT_KEYS: Final = frozenset(
    {"properties", "required", "additionalProperties", "minProperties", "patternProperties"}
)
_ARRAY_KEYS: Final = frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"})
_STRING_KEYS: Final = frozenset({"minLength", "maxLength", "pattern", "format"})
_NUMBER_KEYS: Final = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


def instance(schema: Mapping[str, Any]) -> Any:
    """A deterministic value that validates against ``schema`` (the rules are in the module docstring)."""
    return _Generator(schema).value(schema, "mock", 0, frozenset(), 0, small=False)


class _Flat:
    """A schema with its references and combinators merged in, and the definitions it went through."""

    __slots__ = ("refs", "schema")

    def __init__(self, schema: dict[str, Any], refs: frozenset[str]) -> None:
        self.schema = schema
        self.refs = refs


class _Generator:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root

    def value(self, schema: Any, name: str, depth: int, open_refs: frozenset[str], ordinal: int, *, small: bool) -> Any:
        """``small``: generate the least that is valid (inside a recursion, everything below is small)."""
        small = small or depth > MAX_DEPTH
        flat = self._flatten(schema if isinstance(schema, Mapping) else {}, open_refs, small, 0)
        s = flat.schema
        if "const" in s:
            return s["const"]
        enum = s.get("enum")
        if isinstance(enum, list) and enum:
            return enum[ordinal % len(enum)]
        kind = _type(s)
        # A definition met again inside itself is generated at its smallest, so recursion ends.
        small = small or bool(flat.refs & open_refs)
        inner = open_refs | flat.refs
        if kind == "object":
            return self._object(s, depth, inner, small)
        if kind == "array":
            return self._array(s, name, depth, inner, small)
        if kind == "string":
            return _string(s, name, ordinal)
        if kind in ("integer", "number"):
            return _number(s, kind == "integer", ordinal)
        if kind == "boolean":
            return ordinal % 2 == 0
        return None

    def _flatten(self, schema: Mapping[str, Any], open_refs: frozenset[str], small: bool, hops: int) -> _Flat:
        if hops > _HARD_DEPTH:
            return _Flat({}, frozenset())
        parts = [_Flat({k: v for k, v in schema.items() if k not in _COMBINATORS}, frozenset())]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self._flatten(self._resolve(ref), open_refs, small, hops + 1)
            parts.append(_Flat(target.schema, target.refs | {ref}))
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            parts += [self._flatten(p, open_refs, small, hops + 1) for p in all_of if isinstance(p, Mapping)]
        branches = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(branches, list):
            flat = [self._flatten(b, open_refs, small, hops + 1) for b in branches if isinstance(b, Mapping)]
            if flat:
                parts.append(_branch(flat, open_refs, small))
        merged: dict[str, Any] = {}
        for part in parts:
            _merge(merged, part.schema)
        return _Flat(merged, frozenset().union(*(p.refs for p in parts)))

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            return {}
        node: Any = self._root
        for token in ref[1:].split("/")[1:]:
            key = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return {}
        return node if isinstance(node, Mapping) else {}

    def _object(self, s: Mapping[str, Any], depth: int, open_refs: frozenset[str], small: bool) -> dict[str, Any]:
        if depth >= _HARD_DEPTH:
            return {}
        properties = s.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [r for r in s.get("required") or () if isinstance(r, str)]
        out: dict[str, Any] = {}
        for key, sub in properties.items():
            if not small or key in required:
                out[str(key)] = self.value(sub, str(key), depth + 1, open_refs, 0, small=small)
        extra = s.get("additionalProperties")
        for key in required:
            if key not in out:
                out[key] = self.value(
                    extra if isinstance(extra, Mapping) else {}, key, depth + 1, open_refs, 0, small=small
                )
        return out

    def _array(self, s: Mapping[str, Any], name: str, depth: int, open_refs: frozenset[str], small: bool) -> list[Any]:
        if depth >= _HARD_DEPTH:
            return []
        prefix = s.get("prefixItems")
        if isinstance(prefix, list):
            return [self.value(p, name, depth + 1, open_refs, 0, small=small) for p in prefix]
        items = s.get("items")
        fewest = _count(s.get("minItems"), 0)
        if not isinstance(items, Mapping):
            return [None] * fewest
        count = fewest if small else max(fewest, 1)
        most = s.get("maxItems")
        if isinstance(most, int) and not isinstance(most, bool):
            count = min(count, max(most, fewest))
        unique = s.get("uniqueItems") is True
        return [self.value(items, name, depth + 1, open_refs, i if unique else 0, small=small) for i in range(count)]


def _branch(flat: list[_Flat], open_refs: frozenset[str], small: bool) -> _Flat:
    """The first branch that is not ``null``; when generating small or when a branch recurses, the
    first ``null`` branch, else the first that does not recurse."""

    def recurses(f: _Flat) -> bool:
        return bool(f.refs & open_refs)

    if small or any(recurses(f) for f in flat):
        choice = next((f for f in flat if _type(f.schema) == "null"), None)
        choice = choice or next((f for f in flat if not recurses(f)), None)
    else:
        choice = next((f for f in flat if _type(f.schema) != "null"), None)
    return choice or flat[0]


def _merge(base: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Add ``more``'s constraints to ``base``: properties and required are united, other keys: first wins."""
    for key, value in more.items():
        if key == "properties" and isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            base[key] = {**base[key], **{k: v for k, v in value.items() if k not in base[key]}}
        elif key == "required" and isinstance(value, list) and isinstance(base.get(key), list):
            base[key] = list(dict.fromkeys([*base[key], *value]))
        else:
            base.setdefault(key, value)


def _type(s: Mapping[str, Any]) -> str | None:
    kind = s.get("type")
    if isinstance(kind, list):
        named = [k for k in kind if isinstance(k, str)]
        return next((k for k in named if k != "null"), "null" if named else None)
    if isinstance(kind, str):
        return kind
    keys = s.keys()
    for implied, names in (
        ("object", _OBJECT_KEYS),
        ("array", _ARRAY_KEYS),
        ("string", _STRING_KEYS),
        ("number", _NUMBER_KEYS),
    ):
        if keys & names:
            return implied
    return None


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _fit(text: str, s: Mapping[str, Any]) -> str:
    shortest, longest = _count(s.get("minLength"), 0), s.get("maxLength")
    if len(text) < shortest:
        text += "x" * (shortest - len(text))
    if isinstance(longest, int) and not isinstance(longest, bool) and len(text) > longest:
        text = text[: max(longest, shortest)]
    return text


def _matches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return True  # not a pattern Python can read: nothing better to try


def _string(s: Mapping[str, Any], name: str, ordinal: int) -> str:
    fmt = s.get("format")
    known = _FORMATS.get(fmt) if isinstance(fmt, str) and not ordinal else None
    text = known if known is not None else _fit(f"mock-{name}" + (f"-{ordinal + 1}" if ordinal else ""), s)
    pattern = s.get("pattern")
    if isinstance(pattern, str) and not _matches(pattern, text):
        shortest = _shortest_match(pattern)
        if shortest is not None:
            fitted = _fit(shortest, s)
            return fitted if _matches(pattern, fitted) else shortest
    return text


def _shortest_match(pattern: str) -> str | None:
    """A short string ``pattern`` matches, built from its parse tree; ``None`` if that fails."""
    try:
        from re import _parser  # type: ignore[attr-defined]  # the stdlib's own regex parser

        text = _Pattern().build(_parser.parse(pattern))
    except Exception:  # an unusual construct: the caller keeps its own value
        return None
    return text if _matches(pattern, text) else None


class _Pattern:
    """The shortest string of a parsed regular expression: minimum repeats, first alternatives."""

    _CATEGORY: Final = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " "}

    def build(self, items: Any) -> str:
        return "".join(self._item(op, arg) for op, arg in items)

    def _item(self, op: Any, arg: Any) -> str:
        name = str(op)
        if name == "LITERAL":
            return chr(arg)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, body = arg
            return self.build(body) * int(low)
        if name == "SUBPATTERN":
            return self.build(arg[-1])
        if name == "ATOMIC_GROUP":
            return self.build(arg)
        if name == "BRANCH":
            return self.build(arg[1][0])
        if name == "IN":
            return self._in(arg)
        if name == "ANY":
            return "a"
        if name == "NOT_LITERAL":
            return "a" if arg != ord("a") else "b"
        if name in ("AT", "ASSERT", "ASSERT_NOT"):
            return ""
        if name == "CATEGORY":
            return self._CATEGORY.get(str(arg), "a")
        raise ValueError(name)

    def _in(self, items: Any) -> str:
        if items and str(items[0][0]) == "NEGATE":
            excluded = {chr(a) for op, a in items[1:] if str(op) == "LITERAL"}
            return next(c for c in "abcxyz0123456789" if c not in excluded)
        op, arg = items[0]
        name = str(op)
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return self._CATEGORY.get(str(arg), "a")
        raise ValueError(name)


def _number(s: Mapping[str, Any], integer: bool, ordinal: int) -> int | float:
    def bound(key: str) -> float | None:
        v = s.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    low, low_open = bound("minimum"), False
    if (x := bound("exclusiveMinimum")) is not None and (low is None or x >= low):
        low, low_open = x, True
    high, high_open = bound("maximum"), False
    if (x := bound("exclusiveMaximum")) is not None and (high is None or x <= high):
        high, high_open = x, True
    step = bound("multipleOf")
    if step is None or step <= 0:
        step = 1.0 if integer else None
    gap = step or ((high - low) / 2 if low is not None and high is not None else 1.0)
    value = (1.0 if integer else 1.5) + ordinal
    if low is not None and (value < low or (low_open and value <= low)):
        value = low + gap if low_open else low
    if high is not None and (value > high or (high_open and value >= high)):
        value = high - gap if high_open else high
    if step is not None:
        snapped = math.ceil(value / step) * step
        if high is not None and (snapped > high or (high_open and snapped >= high)):
            snapped = math.floor(value / step) * step
        value = snapped
    return int(value) if integer else value
