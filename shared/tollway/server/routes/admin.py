"""``GET /admin/v1/routes``: read-only runtime state per alias plan, for the admin role.

Route and deployment ids, strategy, circuit state, in-flight counts and EWMA figures; never a
URL, a credential or a physical model name beyond the configured id.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tollway.exceptions import GatewayError, PermissionDenied
from tollway.metering.query import ADMIN_ROLE
from tollway.routing.plan import AliasPlan
from tollway.server.http import error_response, json_response, pipeline_of

__all__ = ["admin_routes"]


def _plan_state(name: str, plan: AliasPlan) -> dict[str, Any]:
    groups = [
        [
            {
                "route": t.route_id,
                "deployment": t.deployment.id,
                "priority": t.priority,
                "weight": t.weight,
                "health": t.health.snapshot(),
            }
            for t in group
        ]
        for group in plan.groups
    ]
    return {"alias": name, "strategy": plan.strategy.name, "groups": groups}


async def admin_routes(request: Request) -> Response:
    pipeline = pipeline_of(request)
    root = pipeline.holder.root
    try:
        principal = pipeline.authenticate(request.headers.getlist("authorization"), root)
        if ADMIN_ROLE not in principal.roles:
            raise PermissionDenied("This endpoint needs the admin role.")
    except GatewayError as err:
        return error_response(err)
    aliases = [_plan_state(name, plan) for name, plan in root.aliases.items()]
    return json_response(orjson.dumps({"object": "list", "generation": root.generation, "data": aliases}))
