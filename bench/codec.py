"""Microbenchmark for the hot-path JSON decision (one fast parse per request): request envelope decode.

``python -m bench.codec [--seconds 2]`` parses each bench payload into a typed request three
ways and prints the median time per parse:

- ``tollway``: what the gateway runs, ``orjson.loads`` plus ``to_canonical`` (typed checks);
- ``pydantic``: ``model_validate_json`` into an equivalent pydantic model;
- ``msgspec``: ``msgspec.json.decode`` into an equivalent ``Struct`` (msgspec is a dev dependency).

The pydantic and msgspec models check less than ``to_canonical`` (no capability gating, no
limits, no unknown-field policy), so the comparison favours them. One process, one core: a
single-threaded loop with no servers, so the numbers are stable enough for ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict

from tollway.api.chat_request import parse_body, to_canonical
from tollway.routing.plan import AliasPlan, RetryPolicy

PAYLOADS = Path(__file__).parent / "payloads"

PLAN = AliasPlan(
    name="bench-alias",
    capabilities=frozenset({"streaming", "tools", "vision", "json_object", "json_schema"}),
    max_input_tokens=1_000_000,
    max_output_tokens=100_000,
    default_max_output_tokens=1024,
    allowed_parameters=frozenset(),
    reject_unknown_parameters=True,
    groups=(),
    retry=RetryPolicy(1, 0.0, 0.0, frozenset()),
)


class _PFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _PTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    function: _PFunction


class _PMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _PRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[_PMessage]
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[_PTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


class _MFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _MTool(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: _MFunction


class _MMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _MRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    messages: list[_MMessage]
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[_MTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


def _msgspec_decoder() -> Callable[[bytes], Any]:
    decoder = msgspec.json.Decoder(_MRequest)
    return decoder.decode


def _tollway(raw: bytes) -> Any:
    return to_canonical(parse_body(raw), PLAN)


def decoders() -> dict[str, Callable[[bytes], Any]]:
    out: dict[str, Callable[[bytes], Any]] = {"tollway": _tollway, "pydantic": _PRequest.model_validate_json}
    out["msgspec"] = _msgspec_decoder()
    return out


def payload_bytes(name: str) -> bytes:
    body = orjson.loads((PAYLOADS / f"{name}.json").read_bytes())
    body["model"] = PLAN.name
    return orjson.dumps(body)


def time_per_call(fn: Callable[[bytes], Any], raw: bytes, seconds: float, rounds: int = 7) -> float:
    """Median over ``rounds`` of the mean time per call, in microseconds."""
    fn(raw)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.05:
        fn(raw)
        n += 1
    per_round = max(1, int(n * seconds / rounds / 0.05))
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn(raw)
        samples.append((time.perf_counter() - t0) / per_round * 1e6)
    return statistics.median(samples)


def run(seconds: float) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for name in ("small", "10kib", "tools"):
        raw = payload_bytes(name)
        results[name] = {label: time_per_call(fn, raw, seconds) for label, fn in decoders().items()}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per payload and decoder")
    args = parser.parse_args(argv)
    results = run(args.seconds)
    labels = list(next(iter(results.values())))
    print("| payload | " + " | ".join(f"{lbl} µs" for lbl in labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[lbl]:.1f}" for lbl in labels) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
