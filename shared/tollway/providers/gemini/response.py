"""Decoding Gemini's ``GenerateContentResponse`` and error bodies: what buffered answers and
stream chunks share.

Only candidate 0 is canonical. Thought summaries (parts with ``thought: true``) are left out of the
text: they are not the answer, and no client format here can show Gemini's. Function calls carry no
id unless the API gives one; the decoder then makes one from the response id and the call's ordinal,
deterministic and unique within a conversation whose responses have ids. A call's
``thoughtSignature`` rides in its id, so that it comes back with the conversation (:mod:`.signatures`).

A prompt Gemini blocks (``promptFeedback.blockReason``, no candidate) is a ``SAFETY`` failure of
the attempt, as a provider's content-policy refusal is in the other formats; a candidate stopped by
a safety, recitation, blocklist or SPII filter is an answer with finish reason ``content_filter``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from tollway.canonical import FinishReason, ToolCall, Usage
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.providers.gemini.signatures import signed_id
from tollway.providers.openai_chat import (
    ErrorInfo,
    as_int,
    client_reason,
    context_reason,
    malformed,
    refine_category,
    str_or_none,
)

__all__ = [
    "blocked",
    "call_id",
    "candidate",
    "classify",
    "decode_call",
    "error_fields",
    "finish_reason",
    "retry_delay",
    "usage",
]

_FINISH: Mapping[str, FinishReason] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
"""Anything else (``OTHER``, ``LANGUAGE``, ``MALFORMED_FUNCTION_CALL``...) is a plain stop."""

_STATUS: Mapping[str, UpstreamCategory] = {
    "INVALID_ARGUMENT": UpstreamCategory.INVALID_REQUEST,
    "OUT_OF_RANGE": UpstreamCategory.INVALID_REQUEST,
    "FAILED_PRECONDITION": UpstreamCategory.PERMISSION,
    "UNAUTHENTICATED": UpstreamCategory.AUTHENTICATION,
    "PERMISSION_DENIED": UpstreamCategory.PERMISSION,
    "NOT_FOUND": UpstreamCategory.NOT_FOUND,
    "RESOURCE_EXHAUSTED": UpstreamCategory.RATE_LIMIT,
    "DEADLINE_EXCEEDED": UpstreamCategory.TIMEOUT,
    "INTERNAL": UpstreamCategory.SERVER,
    "UNKNOWN": UpstreamCategory.SERVER,
    "UNAVAILABLE": UpstreamCategory.OVERLOADED,
}
"""``google.rpc.Code`` names. ``FAILED_PRECONDITION`` is Gemini's "enable billing" or "not in your
region": an account's limit, as Anthropic's ``billing_error``, so another deployment may serve."""

_KEY_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED"})
"""An invalid key is a 400 ``INVALID_ARGUMENT``; its ``ErrorInfo.reason`` says what it really is."""

_GEMINI_CONTEXT = re.compile(
    r"input token count \(?(\d{1,12})\)? exceeds the maximum number of tokens allowed \(?(\d{1,12})\)?", re.I
)
_DURATION = re.compile(r"(\d{1,9}(?:\.\d{1,9})?)s")


def candidate(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """Candidate 0 (a candidate without ``index`` is 0), or ``None`` when there is none."""
    candidates = doc.get("candidates")
    if not isinstance(candidates, list):
        return None
    return next((c for c in candidates if isinstance(c, dict) and c.get("index", 0) == 0), None)


def blocked(doc: Mapping[str, Any], status: int | None) -> UpstreamError | None:
    """The failure of a prompt Gemini refused to answer, if it did."""
    feedback = doc.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if not isinstance(reason, str) or candidate(doc) is not None:
        return None
    return UpstreamError(UpstreamCategory.SAFETY, status=status, detail=f"prompt blocked: {reason[:40]}", reported=True)


def finish_reason(raw: object, has_calls: bool) -> FinishReason | None:
    """The canonical reason of a ``finishReason``; ``None`` while the candidate is unfinished.
    Gemini says ``STOP`` after function calls too."""
    if not isinstance(raw, str) or not raw or raw == "FINISH_REASON_UNSPECIFIED":
        return None
    reason = _FINISH.get(raw, "stop")
    return "tool_calls" if reason == "stop" and has_calls else reason


def call_id(response_id: str | None, ordinal: int) -> str:
    return f"call_{response_id}_{ordinal}" if response_id else f"call_{ordinal}"


def decode_call(
    raw: object, ordinal: int, response_id: str | None, status: int | None, signature: object = None
) -> ToolCall:
    """A ``functionCall`` part's call, with its arguments as compact JSON, and the part's
    ``thoughtSignature`` in its id (:mod:`.signatures`)."""
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(name, str) or not name:
        raise malformed("functionCall part lacks a string name", status=status)
    args = raw.get("args")
    if args is not None and not isinstance(args, dict):
        raise malformed("functionCall args is not an object", status=status)
    given = str_or_none(raw.get("id"))
    identity = signed_id(given or call_id(response_id, ordinal), signature if isinstance(signature, str) else None)
    return ToolCall(identity, name, orjson.dumps(args or {}).decode())


def usage(raw: Mapping[str, Any]) -> Usage:
    """``promptTokenCount`` already includes the cached content; tool-use prompt tokens (grounding)
    are prompt tokens too. Thoughts are billed as output but counted apart from the candidates."""
    thoughts = as_int(raw.get("thoughtsTokenCount"))
    return Usage(
        prompt_tokens=as_int(raw.get("promptTokenCount")) + as_int(raw.get("toolUsePromptTokenCount")),
        completion_tokens=as_int(raw.get("candidatesTokenCount")) + thoughts,
        cached_prompt_tokens=as_int(raw.get("cachedContentTokenCount")),
        reasoning_tokens=thoughts,
    )


def error_fields(doc: Mapping[str, Any]) -> tuple[ErrorInfo, list[Any]] | None:
    """``{"error": {"code", "message", "status", "details"}}`` as an ``ErrorInfo`` whose type is
    the ``status`` name and whose code is the ``ErrorInfo.reason`` of the details, if any."""
    err = doc.get("error")
    if not isinstance(err, dict):
        return None
    details = err.get("details")
    details = details if isinstance(details, list) else []
    reason = next((d.get("reason") for d in details if isinstance(d, dict) and isinstance(d.get("reason"), str)), None)
    message = err.get("message")
    return ErrorInfo(str_or_none(err.get("status")), reason, message if isinstance(message, str) else ""), details


def classify(category: UpstreamCategory, info: ErrorInfo | None, body: bytes) -> tuple[UpstreamCategory, str | None]:
    """The category refined by the body, and the client-safe reason for it."""
    if info is None:
        return category, None
    category = _STATUS.get(info.type or "", category)
    if info.code in _KEY_REASONS:
        category = UpstreamCategory.AUTHENTICATION
    if category is UpstreamCategory.INVALID_REQUEST:
        match = _GEMINI_CONTEXT.search(info.message)
        if match is not None:
            return UpstreamCategory.CONTEXT_LENGTH, context_reason(f"{match[1]} tokens > {match[2]} maximum")
    category = refine_category(category, info)
    return category, client_reason(category, info, body)


def retry_delay(details: list[Any]) -> float | None:
    """Seconds from a ``google.rpc.RetryInfo`` detail's ``retryDelay`` (``"37s"``, ``"0.5s"``)."""
    for detail in details:
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        match = _DURATION.fullmatch(delay) if isinstance(delay, str) else None
        if match is not None:
            seconds = float(match[1])
            return seconds if math.isfinite(seconds) else None
    return None
