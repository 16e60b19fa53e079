"""``GET /v1/usage?from=&to=&group_by=``: the caller's own usage, its tenant's with the admin role."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tollway.exceptions import GatewayError, InvalidRequest, UsageUnavailable
from tollway.server.http import error_response, json_response, runtime_of

__all__ = ["usage"]


async def usage(request: Request) -> Response:
    from tollway.metering import (
        InvalidUsageQuery,
        UsageLedgerUnavailable,
        caller_scope,
        parse_usage_query,
        usage_response,
    )

    runtime = runtime_of(request)
    pipeline = runtime.pipeline
    assert pipeline is not None
    try:
        principal = pipeline.authenticate(request.headers.getlist("authorization"), runtime.holder.root)
        try:
            today = datetime.now(UTC).date()
            query = parse_usage_query(dict(request.query_params), scope=caller_scope(principal), today=today)
        except InvalidUsageQuery as exc:
            raise InvalidRequest(str(exc)) from None
        ledger = runtime.usage_ledger()
        if ledger is None:
            raise UsageUnavailable("Usage reporting is not configured on this gateway.")
        try:
            rows = await asyncio.to_thread(ledger.query, query)
        except UsageLedgerUnavailable:
            raise UsageUnavailable("The usage ledger cannot be read right now. Retry shortly.", retry_after=1) from None
    except GatewayError as err:
        return error_response(err)
    return json_response(orjson.dumps(usage_response(query, rows)))
