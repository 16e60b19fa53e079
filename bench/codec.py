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
from types import GenericAlias
from typing import Any, get_args

import msgspec
import orjson
from pydantic import ConfigDict, create_model

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


_Fields = dict[str, Any]
"""A model's fields, name → type; a field whose type admits ``None`` defaults to it, the others are required."""


def _envelope(model: Callable[[str, _Fields], type]) -> type:
    """The chat request envelope (what ``to_canonical`` reads), as ``model`` builds a model of fields.

    Both libraries' models come from this one table, so they check the same fields and types.
    """
    function = model(
        "Function",
        {"name": str, "description": str | None, "parameters": dict[str, Any] | None, "strict": bool | None},
    )
    tool = model("Tool", {"type": str, "function": function})
    message = model(
        "Message",
        {
            "role": str,
            "content": str | list[dict[str, Any]] | None,
            "name": str | None,
            "tool_calls": list[dict[str, Any]] | None,
            "tool_call_id": str | None,
        },
    )
    return model(
        "Request",
        {
            "model": str,
            "messages": GenericAlias(list, (message,)),
            "temperature": float | None,
            "top_p": float | None,
            "stop": str | list[str] | None,
            "max_tokens": int | None,
            "max_completion_tokens": int | None,
            "stream": bool | None,
            "stream_options": dict[str, Any] | None,
            "tools": GenericAlias(list, (tool,)) | None,
            "tool_choice": str | dict[str, Any] | None,
            "parallel_tool_calls": bool | None,
            "response_format": dict[str, Any] | None,
            "user": str | None,
            "metadata": dict[str, str] | None,
        },
    )


def _optional(annotation: Any) -> bool:
    return type(None) in get_args(annotation)


def _pydantic_model(name: str, fields: _Fields) -> type:
    """A pydantic model that forbids unknown fields."""
    spec: dict[str, Any] = {k: (t, None if _optional(t) else ...) for k, t in fields.items()}
    model: type = create_model(f"_P{name}", __config__=ConfigDict(extra="forbid"), **spec)
    return model


def _msgspec_struct(name: str, fields: _Fields) -> type:
    """A msgspec ``Struct`` that forbids unknown fields."""
    spec = [(k, t, None) if _optional(t) else (k, t) for k, t in fields.items()]
    struct: type = msgspec.defstruct(f"_M{name}", spec, forbid_unknown_fields=True)
    return struct


_PRequest: Any = _envelope(_pydantic_model)
_MRequest: Any = _envelope(_msgspec_struct)


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
