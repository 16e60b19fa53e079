"""The wire types that codecs, transports and SSE framing hand each other: plain data, no behaviour.

A codec encodes an ``UpstreamRequest`` that a transport sends; SSE framing turns the bytes a
transport reads into ``SseEvent`` values that a codec decodes. Keeping both here, in a module that
imports nothing of ``tollway``, lets ``tollway.providers`` and ``tollway.transport`` stay independent
of each other (an import-linter contract checks it): each depends only on this shared vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SseEvent", "UpstreamRequest"]


@dataclass(slots=True, frozen=True)
class UpstreamRequest:
    """A request body and the relative path to POST it to; the transport adds base URL and auth."""

    path: str
    body: bytes
    headers: Mapping[str, str]
    stream: bool


@dataclass(slots=True, frozen=True)
class SseEvent:
    """One Server-Sent Event after framing: ``event`` name (or None) and its joined ``data``."""

    event: str | None
    data: str
