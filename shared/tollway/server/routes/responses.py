"""``POST /v1/responses``: the OpenAI Responses front end on the pipeline (stateless)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from tollway.api.responses import RESPONSES
from tollway.server.http import inbound, pipeline_of, render

__all__ = ["responses"]


async def responses(request: Request) -> Response:
    return render(await pipeline_of(request).run(RESPONSES, inbound(request)))
