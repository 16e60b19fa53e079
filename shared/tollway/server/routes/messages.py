"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages front end
on the pipeline (the key in ``x-api-key`` or ``Authorization: Bearer``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from tollway.api.anthropic_messages import ANTHROPIC_MESSAGES, count_tokens
from tollway.server.http import inbound, pipeline_of, render

__all__ = ["messages", "messages_count_tokens"]


async def messages(request: Request) -> Response:
    return render(await pipeline_of(request).run(ANTHROPIC_MESSAGES, inbound(request)))


async def messages_count_tokens(request: Request) -> Response:
    return render(
        await pipeline_of(request).answer_locally(
            ANTHROPIC_MESSAGES, inbound(request), count_tokens, "messages.count_tokens"
        )
    )
