"""Cross-origin access for browser apps (``cors:`` in ``llm-router.yml``), on Starlette's CORS middleware.

Only mounted when ``cors.allowedOrigins`` is set, so a gateway without it pays for no layer.
Credentials are never allowed: a Tollway key is a header, not a cookie, so no origin can make a
browser spend a user's ambient credentials here. A refused preflight answers in the OpenAI error
envelope, like every other refusal, in place of Starlette's plain-text one.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from tollway.api.errors import error_body
from tollway.config.schema import CorsConfig
from tollway.exceptions import InvalidRequest

__all__ = ["EnvelopeCORSMiddleware", "install_cors"]


class _CorsRefused(InvalidRequest):
    code = "cors_refused"


class EnvelopeCORSMiddleware(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        reason = bytes(response.body).decode(errors="replace")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return Response(
            error_body(_CorsRefused(f"{reason}.")), status_code=400, media_type="application/json", headers=headers
        )


def install_cors(app: Starlette, cfg: CorsConfig) -> None:
    """Mount the middleware on ``app`` for the ``cors:`` block (``allowedOrigins`` set)."""
    app.add_middleware(
        EnvelopeCORSMiddleware,
        allow_origins=cfg.allowedOrigins,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=cfg.allowedHeaders,
        allow_credentials=False,
        expose_headers=["x-request-id", "retry-after"],
        max_age=cfg.maxAgeSeconds,
    )
