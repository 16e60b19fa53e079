"""The OpenAI error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import orjson

from tollway.exceptions import GatewayError

__all__ = ["error_body", "error_headers"]


def error_body(err: GatewayError) -> bytes:
    return orjson.dumps({"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}})


def error_headers(err: GatewayError) -> dict[str, str]:
    if err.retry_after is None:
        return {}
    return {"retry-after": str(max(1, int(err.retry_after + 0.999)))}
