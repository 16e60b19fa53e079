"""The ``anthropic-beta`` features the Messages front end accepts, and what each needs of a route.

A beta changes what the API does, so the gateway honours only the ones it knows: their requests
and answers have shapes the canonical types carry. Each is either *provider* (it works only if the
provider gets it: the Anthropic codec sends it on as the ``anthropic-beta`` header, and an alias
with a route of another format refuses it, since a fallback may land there) or *neutral* (it asks
nothing the answer depends on, so every alias takes it; Anthropic-format routes still get it).
Any other beta is refused, naming it: forwarding one blindly could change a response into a shape
the gateway would garble, or silently not happen on another route.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from tollway.api.envelope import shown
from tollway.exceptions import UnsupportedParameter

__all__ = ["BETAS", "INTERLEAVED_THINKING", "parse_betas", "provider_betas"]

INTERLEAVED_THINKING = "interleaved-thinking-2025-05-14"
"""Thinking between tool calls; it also lets ``thinking.budget_tokens`` exceed ``max_tokens``."""

BETAS: Mapping[str, bool] = MappingProxyType(
    {
        # neutral: prompt caching is generally available, and the gateway carries cache_control itself
        "prompt-caching-2024-07-31": False,
        # neutral: how the provider counts and streams tool input; the answer has the same shape
        "token-efficient-tools-2025-02-19": False,
        "fine-grained-tool-streaming-2025-05-14": False,
        # provider: only an Anthropic model does these
        INTERLEAVED_THINKING: True,
        "context-1m-2025-08-07": True,
        "output-128k-2025-02-19": True,
        "extended-cache-ttl-2025-04-11": True,
    }
)
"""Every accepted beta → whether it needs the provider (``True``) or is neutral (``False``)."""

_MAX_VALUES = 32


def parse_betas(values: Iterable[str]) -> tuple[str, ...]:
    """The betas named by every ``anthropic-beta`` header (comma-separated, in order, once each);
    the first unknown one is refused with a 400 naming it."""
    out: list[str] = []
    for value in values:
        for raw in value.split(",", _MAX_VALUES):
            name = raw.strip()
            if not name or name in out:
                continue
            if name not in BETAS:
                raise UnsupportedParameter(
                    f"The anthropic-beta {shown(name)} is not supported by this gateway; "
                    f"supported: {', '.join(BETAS)}.",
                    param="anthropic-beta",
                )
            out.append(name)
    return tuple(out)


def provider_betas(betas: tuple[str, ...]) -> str | None:
    """The first beta of ``betas`` that needs the provider, if any."""
    return next((b for b in betas if BETAS[b]), None)
