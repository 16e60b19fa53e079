"""The usage contract: which request_finished bodies the ledger accepts, and how it reads them."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from tests.unit.metering.usage_events import DAY_MS, finished
from tollway.audit import events as ev
from tollway.metering import MalformedUsageEvent, usage_record


def test_a_complete_event_is_read_field_by_field() -> None:
    event = finished("req-1", usage={"prompt": 100, "completion": 40, "total": 140, "cached": 30, "reasoning": 12})

    record = usage_record(event)

    assert record is not None
    assert (record.event_id, record.request_id, record.ts_ms, record.day) == (
        event.event_id,
        "req-1",
        DAY_MS,
        date(2026, 11, 29),
    )
    assert (record.tenant_id, record.team_id, record.principal_id, record.key_id, record.alias) == (
        "acme",
        "search",
        "svc-a",
        "key-1",
        "chat",
    )
    assert (record.status, record.status_class, record.outcome, record.usage_evidence) == (
        200,
        "2xx",
        "ok",
        "provider-reported",
    )
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (100, 40, 140)
    assert (record.cached_tokens, record.reasoning_tokens, record.has_usage) == (30, 12, True)
    assert (record.cost_micro_usd, record.pricing_version, record.cost_evidence) == (1500, "2026-11-01.1", "priced")


def test_optional_fields_may_be_missing_or_null() -> None:
    event = finished(
        "req-1", team=None, cost=None, usage=None, evidence="unknown", omit=("keyId", "pricingVersion", "costEvidence")
    )

    record = usage_record(event)

    assert record is not None
    assert (record.team_id, record.key_id, record.cost_micro_usd, record.pricing_version) == (None, None, None, None)
    assert (record.has_usage, record.prompt_tokens, record.total_tokens) == (False, 0, 0)


@pytest.mark.parametrize(
    "usage",
    [
        {"promptTokens": 7, "completionTokens": 3, "totalTokens": 10, "cachedPromptTokens": 2, "reasoningTokens": 1},
        {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "total_tokens": 10,
            "cached_prompt_tokens": 2,
            "reasoning_tokens": 1,
        },
    ],
    ids=["recorder-camel-case", "openai-snake-case"],
)
def test_usage_also_reads_the_recorders_and_openais_token_names(usage: dict[str, int]) -> None:
    record = usage_record(finished("req-1", usage=usage))

    assert record is not None
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (7, 3, 10)
    assert (record.cached_tokens, record.reasoning_tokens) == (2, 1)


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, "2xx"), (201, "2xx"), (400, "4xx"), (429, "4xx"), (499, "499"), (500, "5xx"), (503, "5xx"), (304, "other")],
)
def test_status_classes_keep_client_disconnects_apart_from_4xx(status: int, expected: str) -> None:
    record = usage_record(finished("req-1", status=status))

    assert record is not None and record.status_class == expected


def test_other_event_kinds_are_not_usage() -> None:
    admitted = ev.request_admitted(
        request_id="req-1",
        root_digest="d",
        principal_id="svc-a",
        tenant="acme",
        team=None,
        key_id="k",
        alias="chat",
        stream=False,
        content_mode="metadata-only",
        max_attempts=1,
    )

    assert usage_record(admitted) is None


CANARY = "CANARY-VALUE"


def _malformed() -> dict[str, dict[str, Any]]:
    """Case → keyword arguments for :func:`finished` that break the contract."""
    return {
        "no-principal": {"omit": ("principalId",)},
        "null-tenant": {"tenant": None},
        "empty-alias": {"alias": ""},
        "principal-not-string": {"principal": [CANARY]},
        "alias-too-long": {"alias": CANARY * 100},
        "no-status": {"omit": ("status",)},
        "status-string": {"status": CANARY},
        "status-bool": {"status": True},
        "status-out-of-range": {"status": 99},
        "no-outcome": {"omit": ("outcome",)},
        "no-usage": {"omit": ("usage",)},
        "usage-list": {"usage": [CANARY]},
        "usage-without-total": {"usage": {"prompt": 1, "completion": 2}},
        "usage-negative": {"usage": {"prompt": -1, "completion": 2, "total": 1}},
        "usage-float": {"usage": {"prompt": 1.5, "completion": 2, "total": 3}},
        "usage-cached-string": {"usage": {"prompt": 1, "completion": 2, "total": 3, "cached": CANARY}},
        "no-evidence": {"omit": ("usageEvidence",)},
        "unknown-evidence": {"evidence": CANARY},
        "cost-float": {"cost": 1.25},
        "cost-negative": {"cost": -5},
        "cost-string": {"cost": CANARY},
        "team-not-string": {"team": 7},
        "pricing-version-not-string": {"pricingVersion": 3},
    }


@pytest.mark.parametrize("case", sorted(_malformed()))
def test_an_event_that_breaks_the_contract_is_malformed_and_its_values_stay_out_of_the_error(case: str) -> None:
    event = finished("req-1", **_malformed()[case])

    with pytest.raises(MalformedUsageEvent) as raised:
        usage_record(event)

    assert CANARY not in str(raised.value)
    assert event.event_id in str(raised.value)
