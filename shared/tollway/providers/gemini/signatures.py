"""Gemini's thought signatures, carried across turns in the tool call's id.

Gemini 3 (and 2.5 with thinking) puts a ``thoughtSignature`` beside a part of its answer, an
opaque base64 token of its reasoning, and requires it back, unchanged and on the same part, when the
conversation is sent again: a ``functionCall`` part without the signature it came with is a 400
``INVALID_ARGUMENT`` on Gemini 3. Parallel calls carry it on the first call only.

Why the id: the gateway keeps no conversation state, so a signature can only come back through
something the client sends back, and the one thing every client format echoes of a tool call is its
id (OpenAI's ``tool_calls[].id``, Anthropic's ``tool_use.id``, the Responses API's ``call_id``).
Gemini's calls carry no id of their own, so the decoder makes one; a signed call's id is that id,
``__ts__``, and the signature in the URL-safe base64 alphabet without padding, so the id stays within
``[A-Za-z0-9_-]`` as Anthropic's and Bedrock's tool ids must. The encoder splits it again and puts
the signature back on the ``functionCall`` part. The translation is exact for the padded standard
base64 Gemini sends.

Not carried: a signature on a text part (Gemini asks for it back but does not require it, and a
canonical message's text has nowhere to keep it).
"""

from __future__ import annotations

from typing import Final

from tollway.canonical import ToolCall, ToolCallDelta

__all__ = ["SIGNATURE_MARK", "call_signature", "delta_signature", "sign_call", "signed_id", "split_id"]

SIGNATURE_MARK: Final = "__ts__"
_TO_ID: Final = str.maketrans("+/", "-_")
_FROM_ID: Final = str.maketrans("-_", "+/")


def signed_id(call_id: str, signature: str | None) -> str:
    """``call_id``, with ``signature`` in it when there is one."""
    if not signature:
        return call_id
    return f"{call_id}{SIGNATURE_MARK}{signature.rstrip('=').translate(_TO_ID)}"


def split_id(call_id: str) -> tuple[str, str | None]:
    """The id as the model's call had it, and the thought signature, if the id carries one."""
    base, mark, encoded = call_id.partition(SIGNATURE_MARK)
    if not mark or not encoded:
        return call_id, None
    signature = encoded.translate(_FROM_ID)
    return base, signature + "=" * (-len(signature) % 4)


def sign_call(call: ToolCall, signature: str) -> ToolCall:
    return ToolCall(signed_id(call.id, signature), call.name, call.arguments, call.cache_control)


def call_signature(call: ToolCall) -> str | None:
    return split_id(call.id)[1]


def delta_signature(delta: ToolCallDelta) -> str | None:
    return split_id(delta.id)[1] if delta.id is not None else None
