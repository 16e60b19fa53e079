"""``GET /v1/models`` and ``GET /v1/models/{id}``: the aliases the caller may use."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tollway.exceptions import GatewayError
from tollway.pipeline.core import model_not_found
from tollway.routing.plan import AliasPlan
from tollway.server.http import error_response, json_response, pipeline_of

__all__ = ["list_models", "retrieve_model"]


def _model_object(name: str, plan: AliasPlan) -> dict[str, Any]:
    """OpenAI's model object, plus what the alias serves: its operations and client APIs (the SDKs
    keep fields they do not know)."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "tollway",
        "operations": [plan.operation],
        "client_formats": sorted(plan.client_formats),
    }


async def list_models(request: Request) -> Response:
    pipeline = pipeline_of(request)
    root = pipeline.holder.root
    try:
        principal = pipeline.authenticate(request.headers.getlist("authorization"), root)
    except GatewayError as err:
        return error_response(err)
    data = [_model_object(name, plan) for name, plan in root.aliases.items() if principal.may_use(name)]
    return json_response(orjson.dumps({"object": "list", "data": data}))


async def retrieve_model(request: Request) -> Response:
    """One of the caller's aliases (the SDKs' ``models.retrieve``)."""
    pipeline = pipeline_of(request)
    root = pipeline.holder.root
    model: str = request.path_params["model"]
    try:
        principal = pipeline.authenticate(request.headers.getlist("authorization"), root)
        if model not in root.aliases or not principal.may_use(model):
            raise model_not_found(model)
    except GatewayError as err:
        return error_response(err)
    return json_response(orjson.dumps(_model_object(model, root.aliases[model])))
