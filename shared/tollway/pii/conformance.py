"""Does the model keep the placeholders? The preservation corpus, its runner, and its results.

Reversible tokenization works only with a model that copies placeholders exactly. The corpus
(``corpus/preservation-v1.json``, versioned) holds prompts whose values sit in prose, lists, JSON,
tables, code, conversation history and tool calls, each asking for its values back. The runner sends
every case through a gateway, buffered, to each alias it is given, so the gateway tokenizes the
prompt, the deployment answers, and the gateway restores what came back intact. It then reads the
answer as any client would:

* a case's value in the answer came back as an exact placeholder: **preserved**;
* a value missing while the answer holds something that was a placeholder (a well-formed one left
  unresolved, or a near miss carrying ``TWPII``): **altered**, one such remnant per missing value;
* a value missing with no remnant to account for it: **omitted**;
* remnants left over once every missing value is accounted for: the answer **hallucinated** a
  placeholder (invented one, or repeated a value and a mangled copy of it).

Preserved, altered and omitted are shares of the values (they add up to 1); hallucinated is the
share of answers with a leftover remnant. A case whose request fails (a transport error, a 5xx, a
``502 pii_unresolved`` from a ``reject-buffered`` alias) got nothing back: its values count as
omitted and the failure is counted by its error code. Measure through a ``leave-masked`` alias with
the production profile's ``promptEnrichment``, which changes what a model does.

The runner addresses aliases, so it measures an alias's routes together (with fallback, mostly the
first). Results are keyed by the alias, or by a label given as ``ALIAS=LABEL``: measuring through a
single-route alias and labelling the result with a route id keys it by that deployment, which
publication looks up first (``tollway.config.pii``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tollway.exceptions import TollwayError
from tollway.pii.placeholders import PLACEHOLDER_RE

if TYPE_CHECKING:
    import httpx

__all__ = [
    "CORPUS_VERSION",
    "Case",
    "ConformanceError",
    "Corpus",
    "DeploymentResult",
    "Outcome",
    "Results",
    "answer_text",
    "classify",
    "load_corpus",
    "load_results",
    "measure",
]

CORPUS_VERSION = "preservation-v1"

_REMNANT = re.compile(r"\[?twpii[\w\]]*", re.IGNORECASE | re.ASCII)
"""What is left of a placeholder a model mangled: the marker, in any case, and what clings to it."""


class ConformanceError(TollwayError, ValueError):
    """A corpus or a results file is not what the runner reads and writes."""


@dataclass(frozen=True, slots=True)
class Case:
    """One prompt and the values it holds, all in its last message (as the detectors find them)."""

    id: str
    shape: str
    messages: tuple[Mapping[str, Any], ...]
    values: tuple[str, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: Any = None

    def body(self, model: str) -> dict[str, Any]:
        """The Chat Completions request for ``model``."""
        out: dict[str, Any] = {"model": model, "messages": list(self.messages)}
        if self.tools:
            out["tools"] = list(self.tools)
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice
        return out


@dataclass(frozen=True, slots=True)
class Corpus:
    version: str
    cases: tuple[Case, ...]


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The corpus at ``path``, or the bundled ``preservation-v1``."""
    if path is None:
        raw = resources.files("tollway.pii").joinpath("corpus", f"{CORPUS_VERSION}.json").read_bytes()
    else:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConformanceError(f"cannot read the corpus {str(path)!r} ({exc.strerror})") from None
    try:
        doc = orjson.loads(raw)
        version = doc["version"]
        cases = tuple(_case(c) for c in doc["cases"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConformanceError(f"not a preservation corpus: {exc}") from None
    if not isinstance(version, str) or not version or not cases:
        raise ConformanceError("not a preservation corpus: it needs a version and cases")
    return Corpus(version, cases)


def _case(raw: Mapping[str, Any]) -> Case:
    values = raw["values"]
    messages = raw["messages"]
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"case {raw.get('id')!r} needs a list of values")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"case {raw.get('id')!r} needs messages")
    return Case(
        id=str(raw["id"]),
        shape=str(raw.get("shape", "")),
        messages=tuple(messages),
        values=tuple(dict.fromkeys(values)),
        tools=tuple(raw.get("tools") or ()),
        tool_choice=raw.get("toolChoice"),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one case's values in its answer."""

    preserved: int = 0
    altered: int = 0
    omitted: int = 0
    hallucinated: int = 0
    """Remnants of placeholders that no missing value accounts for."""


def classify(answer: str, values: Iterable[str]) -> Outcome:
    """How ``answer`` (as the client got it) treated ``values`` (see the module docstring)."""
    distinct = list(dict.fromkeys(values))
    missing = sum(1 for v in distinct if v not in answer)
    unresolved = {m.group() for m in PLACEHOLDER_RE.finditer(answer)}
    remnants = {m.group() for m in _REMNANT.finditer(PLACEHOLDER_RE.sub(" ", answer))}
    found = len(unresolved) + len(remnants)
    altered = min(missing, found)
    return Outcome(len(distinct) - missing, altered, missing - altered, found - altered)


def answer_text(response: Mapping[str, Any]) -> str:
    """The text of a Chat Completions answer: its content, and its tool calls' string arguments."""
    parts: list[str] = []
    for choice in response.get("choices") or ():
        message = choice.get("message") or {}
        for key in ("content", "refusal"):
            if isinstance(message.get(key), str):
                parts.append(message[key])
        for call in message.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments") or ""
            try:
                parts.extend(_strings(orjson.loads(arguments)))
            except orjson.JSONDecodeError:
                parts.append(arguments)
    return "\n".join(parts)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


@dataclass(frozen=True, slots=True)
class DeploymentResult:
    """One alias's (or labelled deployment's) measurement; rates in [0, 1]."""

    alias: str
    cases: int
    values: int
    preserved: float
    altered: float
    omitted: float
    hallucinated: float
    failed: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "cases": self.cases,
            "values": self.values,
            "preserved": self.preserved,
            "altered": self.altered,
            "omitted": self.omitted,
            "hallucinated": self.hallucinated,
            "failed": self.failed,
            "errors": dict(self.errors),
        }


@dataclass(frozen=True, slots=True)
class Results:
    corpus: str
    measured_at: str
    deployments: Mapping[str, DeploymentResult]

    def to_json(self) -> bytes:
        doc = {
            "corpus": self.corpus,
            "measuredAt": self.measured_at,
            "deployments": {key: d.to_json() for key, d in self.deployments.items()},
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"

    def summary(self) -> list[str]:
        """One line per deployment, for a terminal."""
        lines = []
        for key, d in self.deployments.items():
            name = key if key == d.alias else f"{key} (through {d.alias})"
            failed = f"; {d.failed} failed: " + ", ".join(f"{c} {n}" for c, n in d.errors.items()) if d.failed else ""
            lines.append(
                f"{name}: {d.cases} cases, {d.values} values: preserved {d.preserved:.1%}, altered {d.altered:.1%}, "
                f"omitted {d.omitted:.1%}, hallucinated {d.hallucinated:.1%} of answers{failed}"
            )
        return lines


def load_results(raw: bytes) -> Results:
    """A results file as :meth:`Results.to_json` writes it. Raises :class:`ConformanceError`."""
    try:
        doc = orjson.loads(raw)
        corpus, measured_at, deployments = doc["corpus"], doc["measuredAt"], doc["deployments"]
        if not isinstance(corpus, str) or not isinstance(measured_at, str) or not isinstance(deployments, dict):
            raise TypeError("corpus and measuredAt must be strings, deployments an object")
        parsed = {str(key): _deployment(str(key), d) for key, d in deployments.items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConformanceError(f"not a conformance result: {exc}") from None
    return Results(corpus, measured_at, parsed)


def _deployment(key: str, d: Mapping[str, Any]) -> DeploymentResult:
    rates = {}
    for name in ("preserved", "altered", "omitted", "hallucinated"):
        rate = d[name]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ValueError(f"{key}.{name} must be a rate between 0 and 1")
        rates[name] = float(rate)
    errors = d.get("errors") or {}
    return DeploymentResult(
        alias=str(d.get("alias", key)),
        cases=int(d["cases"]),
        values=int(d["values"]),
        failed=int(d.get("failed", 0)),
        errors={str(k): int(v) for k, v in errors.items()},
        **rates,
    )


@dataclass(slots=True)
class _Tally:
    alias: str
    cases: int = 0
    values: int = 0
    preserved: int = 0
    altered: int = 0
    omitted: int = 0
    hallucinated: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, case: Case, outcome: Outcome | str) -> None:
        self.cases += 1
        self.values += len(case.values)
        if isinstance(outcome, str):
            self.omitted += len(case.values)
            self.errors[outcome] = self.errors.get(outcome, 0) + 1
            return
        self.preserved += outcome.preserved
        self.altered += outcome.altered
        self.omitted += outcome.omitted
        self.hallucinated += outcome.hallucinated > 0

    def result(self) -> DeploymentResult:
        values, cases = max(self.values, 1), max(self.cases, 1)
        return DeploymentResult(
            alias=self.alias,
            cases=self.cases,
            values=self.values,
            preserved=self.preserved / values,
            altered=self.altered / values,
            omitted=self.omitted / values,
            hallucinated=self.hallucinated / cases,
            failed=sum(self.errors.values()),
            errors=dict(sorted(self.errors.items())),
        )


async def _ask(client: httpx.AsyncClient, case: Case, alias: str) -> Outcome | str:
    """The case's outcome, or the error code of a request that got no answer."""
    import httpx

    try:
        response = await client.post("chat/completions", json=case.body(alias))
    except httpx.HTTPError as exc:
        return f"transport_error ({type(exc).__name__})"
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return f"{response.status_code} {code}" if code else str(response.status_code)
    return classify(answer_text(body), case.values)


async def measure(
    client: httpx.AsyncClient,
    models: Sequence[tuple[str, str]],
    corpus: Corpus | None = None,
    *,
    concurrency: int = 4,
) -> Results:
    """Send every case to each ``(alias, key)`` through ``client`` and tally the answers by ``key``.

    ``client`` carries the gateway's base URL (``…/v1/``, with the trailing slash) and the
    Tollway key; requests go to its ``chat/completions``, buffered, at most ``concurrency`` at once.
    """
    corpus = corpus or load_corpus()
    gate = asyncio.Semaphore(max(1, concurrency))
    tallies = {key: _Tally(alias) for alias, key in models}

    async def one(alias: str, key: str, case: Case) -> None:
        async with gate:
            outcome = await _ask(client, case, alias)
        tallies[key].add(case, outcome)

    await asyncio.gather(*(one(alias, key, case) for alias, key in models for case in corpus.cases))
    measured_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Results(corpus.version, measured_at, {key: t.result() for key, t in tallies.items()})


def run(
    base_url: str,
    key: str,
    models: Sequence[tuple[str, str]],
    corpus: Corpus | None = None,
    *,
    concurrency: int = 4,
    timeout_s: float = 120.0,
) -> Results:
    """:func:`measure` against the gateway at ``base_url`` (e.g. ``http://127.0.0.1:8080/v1``)."""
    import httpx

    async def go() -> Results:
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s) as client:
            return await measure(client, models, corpus, concurrency=concurrency)

    return asyncio.run(go())
