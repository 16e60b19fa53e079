"""The counters every aggregate item holds, and the increments one request adds to them.

Each counter is one flat number attribute of the item (``ADD`` cannot reach into a map that does
not exist yet), named as in :data:`COUNTER_ATTRIBUTES`. An attribute that is absent counts 0, so an
increment carries only its non-zero counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tollway.metering.record import Evidence, StatusClass, UsageRecord

__all__ = ["COUNTER_ATTRIBUTES", "UsageTotals", "increments"]


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Sums over some requests. ``cost_micro_usd`` sums the known costs only; see ``unknown_cost_requests``."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_micro_usd: int = 0
    unknown_cost_requests: int = 0
    """Requests whose event carried no cost (null or absent): the true spend is at least ``cost_micro_usd``."""
    evidence_provider_reported: int = 0
    evidence_local_estimate: int = 0
    evidence_unknown: int = 0
    status_2xx: int = 0
    status_4xx: int = 0
    status_5xx: int = 0
    status_499: int = 0
    status_other: int = 0

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(*(getattr(self, f) + getattr(other, f) for f in _FIELDS))

    @property
    def evidence(self) -> dict[Evidence, int]:
        """Requests per ``usageEvidence`` value."""
        return {
            "provider-reported": self.evidence_provider_reported,
            "local-estimate": self.evidence_local_estimate,
            "unknown": self.evidence_unknown,
        }

    @property
    def statuses(self) -> dict[StatusClass, int]:
        """Requests per status class; ``499`` is not counted in ``4xx``."""
        return {
            "2xx": self.status_2xx,
            "4xx": self.status_4xx,
            "5xx": self.status_5xx,
            "499": self.status_499,
            "other": self.status_other,
        }

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> UsageTotals:
        """The counters of an aggregate item (plain Python values); absent or non-integer counts as 0."""
        values = {}
        for field, attr in COUNTER_ATTRIBUTES.items():
            value = item.get(attr, 0)
            values[field] = value if isinstance(value, int) and not isinstance(value, bool) else 0
        return cls(**values)


_FIELDS: Final = tuple(f.name for f in dataclasses.fields(UsageTotals))
COUNTER_ATTRIBUTES: Final[dict[str, str]] = {
    "requests": "requests",
    "prompt_tokens": "promptTokens",
    "completion_tokens": "completionTokens",
    "total_tokens": "totalTokens",
    "cached_tokens": "cachedTokens",
    "reasoning_tokens": "reasoningTokens",
    "cost_micro_usd": "costMicroUsd",
    "unknown_cost_requests": "unknownCostRequests",
    "evidence_provider_reported": "evidenceProviderReported",
    "evidence_local_estimate": "evidenceLocalEstimate",
    "evidence_unknown": "evidenceUnknown",
    "status_2xx": "status2xx",
    "status_4xx": "status4xx",
    "status_5xx": "status5xx",
    "status_499": "status499",
    "status_other": "statusOther",
}
""":class:`UsageTotals` field → the item attribute holding it."""
_EVIDENCE_FIELD: Final[dict[Evidence, str]] = {
    "provider-reported": "evidence_provider_reported",
    "local-estimate": "evidence_local_estimate",
    "unknown": "evidence_unknown",
}


def increments(record: UsageRecord) -> dict[str, int]:
    """The non-zero counter increments (by item attribute) one request adds to each of its aggregates."""
    fields = {
        "requests": 1,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "total_tokens": record.total_tokens,
        "cached_tokens": record.cached_tokens,
        "reasoning_tokens": record.reasoning_tokens,
        "cost_micro_usd": record.cost_micro_usd or 0,
        "unknown_cost_requests": int(record.cost_micro_usd is None),
        _EVIDENCE_FIELD[record.usage_evidence]: 1,
        f"status_{record.status_class}": 1,
    }
    return {COUNTER_ATTRIBUTES[f]: n for f, n in fields.items() if n}
