"""What every client format's request parser shares: the body parsed once with its routing fields
pulled out, and the small checks each format's fields go through.

Chat Completions, Anthropic Messages and Responses bodies all name ``model`` and ``stream`` at
the top level, and the pipeline must resolve the alias between parsing and checking the rest
against it, so the first step is the same for all three. Errors name fields and never echo
request values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import orjson

from tollway.canonical import ContentPart, TextPart
from tollway.exceptions import InvalidRequest, UnsupportedParameter
from tollway.routing.plan import AliasPlan

__all__ = [
    "MAX_NAME",
    "ParsedEnvelope",
    "bad",
    "collapse",
    "extensions",
    "metadata",
    "number",
    "object_type",
    "parse_body",
    "require",
    "shown",
    "user",
]

_MAX_METADATA_KEYS = 16

MAX_NAME = 64
"""How much of a client-chosen name (a tool, a field, a block type) an error message may show."""


class ParsedEnvelope:
    """The raw body parsed once, with the routing fields pulled out before policy runs."""

    __slots__ = ("body", "model", "stream")

    def __init__(self, body: dict[str, Any], model: str, stream: bool) -> None:
        self.body = body
        self.model = model
        self.stream = stream


def bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def shown(value: object) -> str:
    """A client-chosen name as an error may show it: bounded, and only if it is a string."""
    return repr(value[:MAX_NAME]) if isinstance(value, str) else "of a non-string type"


def parse_body(raw: bytes) -> ParsedEnvelope:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string.", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("'stream' must be a boolean.", "stream")
    return ParsedEnvelope(body, model, bool(stream))


def number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad(f"'{key}' must be a number between {lo:g} and {hi:g}.", key)
    return float(value)


def require(plan: AliasPlan, capability: str, param: str) -> None:
    if capability not in plan.capabilities:
        raise UnsupportedParameter(f"'{param}' is not supported by model '{plan.name}'.", param=param)


def object_type(obj: Any, where: str) -> str:
    """The ``type`` of a block, part or item that must be an object with a string ``type``."""
    if not isinstance(obj, dict):
        raise bad(f"{where} must be an object.", where)
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise bad(f"{where}.type must be a string.", f"{where}.type")
    return kind


def collapse(parts: list[ContentPart]) -> str | list[ContentPart]:
    """A single text part as a plain string; several parts stay a list."""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return parts


def metadata(raw: Any) -> dict[str, str]:
    if (
        not isinstance(raw, dict)
        or len(raw) > _MAX_METADATA_KEYS
        or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in raw.items())
    ):
        raise bad("'metadata' must map up to 16 keys (≤64 chars) to strings (≤512 chars).", "metadata")
    return cast(dict[str, str], raw)


def user(body: dict[str, Any]) -> str | None:
    value = body.get("user")
    if value is not None and (not isinstance(value, str) or len(value) > 256):
        raise bad("'user' must be a string of at most 256 characters.", "user")
    return value


def extensions(
    body: dict[str, Any],
    profile: frozenset[str],
    plan: AliasPlan,
    sdk_defaults: Mapping[str, tuple[Any, ...]] | None = None,
) -> dict[str, Any]:
    """The fields outside the format's ``profile`` that the alias allowlists, to pass on. Any other
    field is refused under ``unsupportedParameterPolicy: reject`` (ignored under ``ignore``), unless
    it holds a value the SDKs send by default (``sdk_defaults``: key to the values that ask for
    nothing). A ``null`` field counts as absent."""
    out: dict[str, Any] = {}
    defaults = sdk_defaults or {}
    for key, value in body.items():
        if key in profile or value is None:
            continue
        if key in plan.allowed_parameters:
            out[key] = value
        elif any(value == d and type(value) is type(d) for d in defaults.get(key, ())):
            continue
        elif plan.reject_unknown_parameters:
            raise UnsupportedParameter(f"Unsupported parameter: '{key}'.", param=key)
    return out
