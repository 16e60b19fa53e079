"""Fault specifications: what a mock request should do wrong, and how the sources combine.

A fault spec is a set of ``key=value`` settings. It reaches the mock three ways, and the
later source wins key by key:

1. defaults posted to ``/_mock/faults`` (global, then the request model's scoped defaults);
2. the ``/_fault/<k=v,k=v>/`` path prefix;
3. ``x-mock-<key>`` request headers (``-`` and ``_`` are interchangeable in the key).

Settings are merged as raw strings and only then validated into one immutable
:class:`FaultSpec`, cached by its canonical string, so a benchmark that sends the same
spec on every request pays for parsing once. An unknown key or a bad value is a 400.

"k chunks" counts content deltas (text pieces or tool-argument fragments); a ``k`` past
the last delta means "after the last delta, before the terminal frames".

==================  ==========================================================================
key                 effect
==================  ==========================================================================
status=<400-599>    answer that status with the format's error body
retry_after=<s>     add ``Retry-After`` to a status answer (``retry_after_ms`` → ``retry-after-ms``)
error_type=<t>      override the error type (OpenAI ``type`` and ``code``; Anthropic ``error.type``)
fail_first=<n>      only the first n requests with this exact merged spec get its failures
                    (status, stall, abort, malformed, midstream error); alone it means status 503
down_for_ms=<n>     a flapping deployment: the spec's failures only for n ms after the first request
                    with this exact merged spec, then it recovers; alone it means status 503
delay_ms=<n>        wait before the response headers (synonym: ``latency_ms``)
latency_jitter_ms   add 0..n ms, a hash of the request sequence number (synonym: ``jitter_ms``)
ttft_ms, chunk_gap  SSE: wait before the first content delta / between deltas
chunks=<n>          number of content deltas (default 5; tool arguments get at least 3)
words=<n>           reply length in words (echo, then filler words)
stall_ms, stall_at  sleep stall_ms (default 600000) at stall_at: -1 before headers (default),
                    0 after headers before any body, k after k chunks; ends early on disconnect
abort_after=<k>     after k chunks end the body mid-frame (buffered: half the JSON);
                    ``abort_mode=reset`` drops the connection instead of ending the body
malformed=<k>       SSE: the k-th content frame becomes ``data: {not json``; buffered: non-JSON 200
midstream_error=<k> SSE: after k chunks send the format's error frame and end, without terminal frames
corrupt_frame=<k>   Bedrock's event stream: break the framing of the k-th content frame (0: the frame
                    before the first one, ``messageStart``), so the stream no longer parses;
                    ``corrupt_mode=crc`` (default) spoils the message CRC, ``prelude`` the prelude's.
                    Other formats ignore it
no_done=1           SSE: end after the finish (and usage) without ``[DONE]`` / ``message_stop``
context_window=<n>  400 context-length refusal, in the format's words, for prompts over n tokens
no_prefill=1        400 for a request whose last message is an assistant prefill (else the mock
                    continues a prefill that begins its reply, with the rest of that reply)
require_auth=1      401 unless ``Authorization: Bearer`` (OpenAI) / ``x-api-key`` (Anthropic);
                    Bedrock answers 401 to any request without a SigV4 ``Authorization``, always
placeholders=<m>    PII placeholders in the reply: ``echo`` (as without it), ``alter`` (each kind
                    lower-cased: a near miss), ``drop`` (removed), ``invent`` (a forged one added);
                    any mode also copies the request's placeholders into a tool call
no_reply_cache=1    build every text reply afresh instead of memoizing it by the request's text:
                    for an A/B benchmark whose two sides differ in how often the text repeats (PII
                    placeholders are new on every request), so the mock costs both sides the same
tag=<s>             no effect; separates ``fail_first`` counters
==================  ==========================================================================
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tollway.mock.content import PLACEHOLDER_MODES

__all__ = [
    "FAULT_KEYS",
    "NO_FAULTS",
    "FaultSpec",
    "FaultSpecError",
    "context_refusal",
    "fault_spec",
    "parse_fault_items",
    "prefill_text",
]

DEFAULT_STALL_MS = 600_000
DEFAULT_FAIL_STATUS = 503
_MASK64 = (1 << 64) - 1

_ALIASES = {"latency_ms": "delay_ms", "jitter_ms": "latency_jitter_ms"}
_INT_KEYS = frozenset(
    {
        "status",
        "retry_after_ms",
        "fail_first",
        "delay_ms",
        "latency_jitter_ms",
        "ttft_ms",
        "chunk_gap_ms",
        "chunks",
        "words",
        "stall_ms",
        "stall_at",
        "abort_after",
        "malformed",
        "midstream_error",
        "require_auth",
        "down_for_ms",
        "no_done",
        "context_window",
        "no_prefill",
        "no_reply_cache",
        "corrupt_frame",
    }
)
_TEXT_KEYS = frozenset({"retry_after", "error_type", "abort_mode", "tag", "placeholders", "corrupt_mode"})
FAULT_KEYS: frozenset[str] = _INT_KEYS | _TEXT_KEYS | frozenset(_ALIASES)
"""Every key a fault spec accepts, aliases included."""

_MINIMUM = {"status": 400, "chunks": 1, "stall_at": -1, "malformed": 1, "context_window": 1}
_MAXIMUM = {"status": 599, "chunks": 100_000, "words": 1_000_000}


class FaultSpecError(ValueError):
    """A fault spec names an unknown key or carries a value the key does not accept."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """The validated, merged faults for one request; ``None`` means "not requested"."""

    canonical: str = ""
    """Sorted ``k=v,k=v`` form; requests with equal strings share one ``fail_first`` counter."""
    status: int | None = None
    retry_after: str | None = None
    retry_after_ms: int | None = None
    error_type: str | None = None
    fail_first: int | None = None
    delay_ms: int = 0
    latency_jitter_ms: int = 0
    ttft_ms: int = 0
    chunk_gap_ms: int = 0
    chunks: int | None = None
    words: int | None = None
    stall_ms: int | None = None
    stall_at: int | None = None
    abort_after: int | None = None
    abort_mode: str = "close"
    malformed: int | None = None
    midstream_error: int | None = None
    require_auth: bool = False
    tag: str | None = None
    down_for_ms: int | None = None
    no_done: bool = False
    context_window: int | None = None
    no_prefill: bool = False
    no_reply_cache: bool = False
    placeholders: str | None = None
    """How the reply treats PII placeholders (``content.PLACEHOLDER_MODES``); ``None``: untouched, no work."""
    corrupt_frame: int | None = None
    corrupt_mode: str = "crc"

    def delay_s(self, seq: int) -> float:
        """Seconds to wait before answering request ``seq``: ``delay_ms`` plus its jitter.

        The jitter is a splitmix64 hash of the sequence number, so a run's latency
        distribution is reproducible without a random generator.
        """
        delay = self.delay_ms
        if self.latency_jitter_ms:
            z = (seq * 0x9E3779B97F4A7C15) & _MASK64
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
            delay += (z ^ (z >> 31)) % (self.latency_jitter_ms + 1)
        return delay / 1000

    @property
    def failing(self) -> bool:
        """True when the spec asks for any failure that ``fail_first`` gates."""
        return (
            self.status is not None
            or self.stall_ms is not None
            or self.stall_at is not None
            or self.abort_after is not None
            or self.malformed is not None
            or self.midstream_error is not None
            or self.corrupt_frame is not None
        )

    @property
    def fail_status(self) -> int | None:
        """The error status to answer; ``fail_first`` or ``down_for_ms`` alone implies 503."""
        gated = self.fail_first is not None or self.down_for_ms is not None
        if self.status is None and gated and not self.failing:
            return DEFAULT_FAIL_STATUS
        return self.status

    @property
    def stall(self) -> tuple[int, float] | None:
        """``(stall_at, seconds)`` when a stall is requested."""
        if self.stall_ms is None and self.stall_at is None:
            return None
        at = -1 if self.stall_at is None else self.stall_at
        ms = DEFAULT_STALL_MS if self.stall_ms is None else self.stall_ms
        return at, ms / 1000.0

    @property
    def paced(self) -> bool:
        """True when a stream must be sent frame by frame instead of in one write."""
        return bool(
            self.ttft_ms
            or self.chunk_gap_ms
            or self.stall_at is not None
            or self.stall_ms is not None
            or self.abort_after is not None
            or self.malformed is not None
            or self.midstream_error is not None
            or self.corrupt_frame is not None
        )


NO_FAULTS = FaultSpec()


def parse_fault_items(spec: str) -> dict[str, str]:
    """Split ``"k=v,k=v"`` into raw settings, resolving aliases; values are validated later."""
    items: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise FaultSpecError(f"mock fault {part!r} is not of the form key=value")
        items[normalize_key(key)] = value.strip()
    return items


def normalize_key(key: str) -> str:
    key = key.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)


def fault_spec(items: Mapping[str, str]) -> FaultSpec:
    """Validate merged raw settings into a :class:`FaultSpec` (cached by canonical form)."""
    if not items:
        return NO_FAULTS
    return _build(tuple(sorted({normalize_key(k): v for k, v in items.items()}.items())))


@functools.lru_cache(maxsize=4096)
def _build(items: tuple[tuple[str, str], ...]) -> FaultSpec:
    values: dict[str, object] = {}
    for key, raw in items:
        if key in _INT_KEYS:
            values[key] = _int(key, raw)
        elif key in _TEXT_KEYS:
            values[key] = raw
        else:
            known = ", ".join(sorted(FAULT_KEYS))
            raise FaultSpecError(f"unknown mock fault key {key!r}; known keys: {known}")
    if "retry_after" in values:
        _check_retry_after(str(values["retry_after"]))
    if values.get("abort_mode", "close") not in ("close", "reset"):
        raise FaultSpecError("mock fault abort_mode must be 'close' or 'reset'")
    if values.get("corrupt_mode", "crc") not in ("crc", "prelude"):
        raise FaultSpecError("mock fault corrupt_mode must be 'crc' or 'prelude'")
    if values.get("placeholders", "echo") not in PLACEHOLDER_MODES:
        modes = ", ".join(PLACEHOLDER_MODES)
        raise FaultSpecError(f"mock fault placeholders must be one of {modes}, got {values['placeholders']!r}")
    for flag in ("require_auth", "no_done", "no_prefill", "no_reply_cache"):
        if flag in values:
            values[flag] = bool(values[flag])
    canonical = ",".join(f"{key}={raw}" for key, raw in items)
    return FaultSpec(canonical=canonical, **values)  # type: ignore[arg-type]


def _int(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise FaultSpecError(f"mock fault {key} must be an integer, got {raw!r}") from None
    low = _MINIMUM.get(key, 0)
    high = _MAXIMUM.get(key)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise FaultSpecError(f"mock fault {key} must be {bound}, got {value}")
    return value


def _check_retry_after(raw: str) -> None:
    try:
        ok = float(raw) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise FaultSpecError(f"mock fault retry_after must be a non-negative number of seconds, got {raw!r}")


def prefill_text(messages: Any) -> str | None:
    """The text of a trailing assistant message (an assistant prefill), or ``None``."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    if last.get("role") != "assistant":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return None


def context_refusal(wire: str, used: int, limit: int) -> tuple[str, str | None]:
    """``(message, error type)`` of a context-length refusal, worded as each provider words it."""
    if wire == "anthropic":
        return f"prompt is too long: {used} tokens > {limit} maximum", None
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in {used} tokens."
    )
    return message, "context_length_exceeded"
