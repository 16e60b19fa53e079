"""One deployment's conformance result: what each case found, each capability's verdict, and a digest.

The JSON is the stored form (``<provider>/<model>.json``). Its ``digest`` is the SHA-256 of the
canonical JSON of every other field (sorted keys, compact), so a result edited by hand, or cut
short, no longer verifies and is refused when read. A reason is a fixed phrase with values the
suite chose (a capability, a category, a status): never prompt or completion text, a provider's
error body or a credential.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

from tollway.conformance.suite import CAPABILITIES
from tollway.exceptions import TollwayError

__all__ = [
    "RESULT_KIND",
    "CaseOutcome",
    "ConformanceResult",
    "InvalidResult",
    "Outcome",
    "capability_verdicts",
    "parse_result",
    "report_lines",
]

RESULT_KIND: Final = "tollway.conformance.result"
Outcome = Literal["pass", "fail", "skipped"]
_OUTCOMES: Final = frozenset({"pass", "fail", "skipped"})


class InvalidResult(TollwayError, ValueError):
    """A stored result that does not parse, or whose digest does not verify."""


@dataclass(frozen=True, slots=True)
class CaseOutcome:
    case: str
    capability: str
    outcome: Outcome
    reason: str = ""
    elapsed_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.case,
            "capability": self.capability,
            "outcome": self.outcome,
            "reason": self.reason,
            "elapsedMs": self.elapsed_ms,
        }


def capability_verdicts(cases: Iterable[CaseOutcome]) -> dict[str, Outcome]:
    """Per capability: ``fail`` if any of its cases failed, ``pass`` if one passed and none failed,
    ``skipped`` if none ran (the provider format cannot represent it)."""
    verdicts: dict[str, Outcome] = dict.fromkeys(CAPABILITIES, "skipped")
    for c in cases:
        current = verdicts.get(c.capability, "skipped")
        if c.outcome == "fail" or current == "fail":
            verdicts[c.capability] = "fail"
        elif c.outcome == "pass":
            verdicts[c.capability] = "pass"
    return verdicts


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class ConformanceResult:
    """What the suite found on one (provider deployment, physical model) pair."""

    suite_version: str
    suite_digest: str
    deployment: str
    provider_type: str
    provider_format: str
    model: str
    started_at: float
    finished_at: float
    """Seconds since the epoch, UTC."""
    cases: tuple[CaseOutcome, ...]

    @property
    def capabilities(self) -> dict[str, Outcome]:
        return capability_verdicts(self.cases)

    @property
    def passed(self) -> bool:
        """No case failed."""
        return all(c.outcome != "fail" for c in self.cases)

    def failed_cases(self, capability: str) -> list[CaseOutcome]:
        return [c for c in self.cases if c.capability == capability and c.outcome == "fail"]

    def body(self) -> dict[str, Any]:
        """Every field but the digest, as stored."""
        return {
            "kind": RESULT_KIND,
            "suite": {"version": self.suite_version, "digest": self.suite_digest},
            "deployment": self.deployment,
            "providerType": self.provider_type,
            "providerFormat": self.provider_format,
            "model": self.model,
            "startedAt": _stamp(self.started_at),
            "finishedAt": _stamp(self.finished_at),
            "cases": [c.to_json() for c in self.cases],
            "capabilities": self.capabilities,
        }

    @property
    def digest(self) -> str:
        return _digest(self.body())

    def to_json(self) -> bytes:
        body = self.body()
        return orjson.dumps({**body, "digest": _digest(body)}, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def _epoch(value: Any, where: str) -> float:
    if not isinstance(value, str):
        raise InvalidResult(f"{where} is not a timestamp")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidResult(f"{where} is not a timestamp") from None
    if parsed.tzinfo is None:
        raise InvalidResult(f"{where} has no time zone")
    return parsed.timestamp()


def _text(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise InvalidResult(f"{key} is missing or not a string")
    return value


def _case(raw: Any) -> CaseOutcome:
    if not isinstance(raw, dict):
        raise InvalidResult("a case is not an object")
    outcome = raw.get("outcome")
    if outcome not in _OUTCOMES:
        raise InvalidResult("a case's outcome is not pass, fail or skipped")
    elapsed = raw.get("elapsedMs", 0)
    return CaseOutcome(
        case=_text(raw, "id"),
        capability=_text(raw, "capability"),
        outcome=outcome,
        reason=_text(raw, "reason"),
        elapsed_ms=elapsed if isinstance(elapsed, int) else 0,
    )


def parse_result(raw: bytes) -> ConformanceResult:
    """A stored result, checked: it parses, it is a result, and its digest verifies."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidResult("not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND:
        raise InvalidResult(f"not a {RESULT_KIND}")
    suite = doc.get("suite")
    cases = doc.get("cases")
    if not isinstance(suite, dict) or not isinstance(cases, list):
        raise InvalidResult("suite or cases missing")
    result = ConformanceResult(
        suite_version=_text(suite, "version"),
        suite_digest=_text(suite, "digest"),
        deployment=_text(doc, "deployment"),
        provider_type=_text(doc, "providerType"),
        provider_format=_text(doc, "providerFormat"),
        model=_text(doc, "model"),
        started_at=_epoch(doc.get("startedAt"), "startedAt"),
        finished_at=_epoch(doc.get("finishedAt"), "finishedAt"),
        cases=tuple(_case(c) for c in cases),
    )
    body = {k: v for k, v in doc.items() if k != "digest"}
    if doc.get("digest") != _digest(body) or result.body() != body:
        raise InvalidResult("its digest does not verify")
    return result


def report_lines(result: ConformanceResult, required: Iterable[str] = ()) -> list[str]:
    """One line per case, then the capabilities and a summary: what ``tollway conformance`` prints.
    ``required`` capabilities are marked, and a summary says whether each of them passed."""
    need = list(required)
    head = f"{result.deployment} {result.model} ({result.provider_format}, suite {result.suite_version})"
    lines = [head]
    for c in result.cases:
        lines.append(
            f"  {c.outcome.upper():7} {c.case:24} {c.elapsed_ms:>6} ms" + (f"  {c.reason}" if c.reason else "")
        )
    verdicts = result.capabilities
    marked = [f"{cap}{'*' if cap in need else ''}={verdict}" for cap, verdict in verdicts.items()]
    lines.append("  capabilities: " + " ".join(marked) + ("  (* declared by a route)" if need else ""))
    missing = [cap for cap in need if verdicts.get(cap) != "pass"]
    failed = sum(c.outcome == "fail" for c in result.cases)
    if missing:
        lines.append(f"  FAILED: {', '.join(missing)} did not pass ({failed} case(s) failed)")
    else:
        lines.append(f"  ok: every declared capability passed ({failed} case(s) failed)")
    return lines
