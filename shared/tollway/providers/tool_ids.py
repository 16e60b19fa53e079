"""Tool-call ids in the shape each provider accepts.

A conversation's tool-call ids come from the client, which got them from whichever model answered
that turn: OpenAI's ``call_…`` (29 characters), Anthropic's ``toolu_…``, Bedrock's ``tooluse_…``, or
the gateway's Gemini ids, which carry the call's thought signature and run to hundreds of characters
(:mod:`tollway.providers.gemini.signatures`). When an alias falls back to another provider, or a
client moves a conversation to another alias, one provider's ids go to another, and providers check
them:

- Bedrock's ``toolUseId``: 1 to 64 characters of ``[a-zA-Z0-9_-]``;
- Anthropic's ``tool_use.id`` and ``tool_use_id``: ``[a-zA-Z0-9_-]`` only;
- OpenAI's ``tool_calls[].id`` and ``tool_call_id``: at most 40 characters.

An id that fits is sent as it is. One that does not is replaced by ``tw_`` and the first 128 bits of
its SHA-256 in URL-safe base64 without padding (25 characters, within every rule above). The same id
always gives the same replacement, so an assistant turn's call and the tool result that answers it
still match, in this request and in every later turn that sends them again; the client's ids are
never changed, and the provider's own calls keep the ids it gives them.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Final

__all__ = ["anthropic_tool_id", "bedrock_tool_id", "fit_tool_id", "openai_tool_id"]

_ALPHABET: Final = re.compile(r"[A-Za-z0-9_-]+")
_PREFIX: Final = "tw_"


def fit_tool_id(call_id: str, max_len: int | None, *, id_alphabet: bool) -> str:
    """``call_id`` if it is at most ``max_len`` characters (any length for ``None``) and, with
    ``id_alphabet``, a non-empty run of ``[A-Za-z0-9_-]``; else its stable 25-character stand-in."""
    if (max_len is None or len(call_id) <= max_len) and (not id_alphabet or _ALPHABET.fullmatch(call_id)):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).digest()[:16]
    return _PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def openai_tool_id(call_id: str) -> str:
    return fit_tool_id(call_id, 40, id_alphabet=False)


def anthropic_tool_id(call_id: str) -> str:
    return fit_tool_id(call_id, None, id_alphabet=True)


def bedrock_tool_id(call_id: str) -> str:
    return fit_tool_id(call_id, 64, id_alphabet=True)
