"""``POST /v1/embeddings``: the OpenAI Embeddings front end on the pipeline."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from tollway.api.embeddings import EMBEDDINGS
from tollway.server.http import inbound, pipeline_of, render

__all__ = ["embeddings"]


async def embeddings(request: Request) -> Response:
    return render(await pipeline_of(request).embed(EMBEDDINGS, inbound(request)))
