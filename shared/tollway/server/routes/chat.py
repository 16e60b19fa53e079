"""``POST /v1/chat/completions``: the OpenAI Chat Completions front end on the pipeline."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from tollway.api.chat_completions import CHAT_COMPLETIONS
from tollway.server.http import inbound, pipeline_of, render

__all__ = ["chat_completions"]


async def chat_completions(request: Request) -> Response:
    return render(await pipeline_of(request).run(CHAT_COMPLETIONS, inbound(request)))
