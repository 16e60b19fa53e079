"""``python -m bench.inprocess [--audit] [--telemetry T] [--pii] [--requests N]``: the gateway's own CPU per request.

The whole ASGI app (middleware, route, pipeline, front end, stages, gateway, codec) serves ``N``
buffered chat requests in this process, called directly with ASGI messages, with every provider
answering at once from a transport that does no I/O. No socket, no server, no load generator and
no mock process share the CPU, so what is left is the request path's own Python, which the
end-to-end profiles (``python -m bench.run fixed-500``) measure only beside all of those. It is the
tool for an A/B of a change to the request path: run it in a worktree of each commit, alternating.

``--audit`` turns the audit trail on (a bounded-async WAL in a temporary directory, shipping
left to an external shipper that is not started), so the audit stage and the WAL writer's thread
are measured too. CPU is ``time.process_time``: every thread of the process.

``--telemetry`` (default ``off``) sets the ``telemetry:`` block: ``metrics`` records every metric
(Prometheus, one process), ``traced`` adds tracing at ``sampleRatio: 0.01`` exported over OTLP to
a sink in this process (``bench.otlp_sink``), so the exporter's thread is counted too.

``--pii`` sends bench/payloads/pii-2k.json (2 KB, five PII values) to an alias with a request-scope
PII profile, and the provider's answer repeats the first placeholder it was sent, so tokenization
and recovery are both measured; ``--payload pii-2k`` without ``--pii`` is its baseline.

To measure a commit from before the transport factory (``Publisher.transport_factory``), run this
file against that commit's tree (``PYTHONPATH=<worktree>/shared:<worktree> .venv/bin/python
bench/inprocess.py``): it then replaces the publisher's ``build_transport`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

__all__ = ["chat_scope", "main", "measure"]

KEY = "tw-bench-inprocess"
_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
)
_BODY = orjson.dumps({"model": "a", "messages": [{"role": "user", "content": "Say hello."}]})


_PLACEHOLDER = re.compile(rb"\[TWPII1_[A-Z0-9]+_[A-Z2-7]+_[A-Z2-7]+\]")


def _answer(content: str) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


class _AnswerAtOnce:
    """A ``Transport`` whose every buffered call answers 200 with one completion, after one yield
    to the event loop (as a socket read would). The completion repeats the first PII placeholder of
    the request, when it has one, for the gateway to restore."""

    async def send(self, upstream: Any, timing: Any = None) -> tuple[int, Mapping[str, str], bytes]:
        await asyncio.sleep(0)
        found = _PLACEHOLDER.search(upstream.body)
        if found is None:
            return 200, {"content-type": "application/json"}, _ANSWER
        return 200, {"content-type": "application/json"}, _answer(f"Write to {found.group(0).decode()} today.")

    def stream(self, upstream: Any, timing: Any = None) -> Any:
        raise NotImplementedError("bench.inprocess measures buffered requests")

    async def aclose(self) -> None:
        return None


def _factory(*args: Any, **kwargs: Any) -> _AnswerAtOnce:
    return _AnswerAtOnce()


def _config(
    directory: Path, audit: bool, telemetry: str = "off", otlp: str = "", pii: bool = False, content: str = ""
) -> Path:
    cfg: dict[str, Any] = {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "q",
                "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_BENCH_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "a",
                "routes": [{"id": "r", "provider": "p", "model": "m", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            {
                "id": "bench",
                "tenant": "bench",
                "allowedModels": ["a"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            }
        ],
    }
    if pii:
        cfg["pii"] = {"keySecretRef": "env:TOLLWAY_BENCH_PII_KEY", "profiles": [{"id": "p", "scope": "request"}]}
        cfg["models"][0]["piiProfileId"] = "p"
    if content:
        cfg["models"][0]["contentMode"] = content
        cfg["content"] = {"store": {"type": "memory"}}
    cfg["telemetry"] = {"metrics": {"enabled": telemetry != "off"}}
    if telemetry == "traced":
        cfg["telemetry"]["tracing"] = {"enabled": True, "endpoint": otlp, "sampleRatio": 0.01}
    if audit:
        cfg["audit"] = {
            "durability": "bounded-async",
            "sink": {"type": "sqs", "queueName": "tollway-bench-inprocess"},
            "spool": {"path": str(directory / "wal")},
        }
    path = directory / "llm-router.yml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _install_transport() -> None:
    import tollway.config.root as root_module
    from tollway.server.runtime import GatewayRuntime

    if hasattr(root_module.Publisher, "restage"):  # a tree with Publisher.transport_factory
        load: Any = GatewayRuntime.load

        def with_factory(path: Path, **kwargs: Any) -> Any:
            return load(path, transport_factory=_factory)

        GatewayRuntime.load = with_factory  # type: ignore[method-assign,assignment]
    else:  # an older tree: the publisher called the module's build_transport
        vars(root_module)["build_transport"] = _factory


def chat_scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ASGI scope of one ``POST /v1/chat/completions`` from 127.0.0.1, for calling the app
    directly (also what tests that drive the app message by message send)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


async def _serve(
    app: Any, headers: list[tuple[bytes, bytes]], body: bytes = _BODY, out: bytearray | None = None
) -> int:
    """One request; its status, and its response body in ``out`` when given."""
    scope = chat_scope(headers)
    read = False
    done = asyncio.Event()
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif out is not None:
            out.extend(message.get("body", b""))

    await app(scope, receive, send)
    done.set()
    return status


def _body(payload: str) -> bytes:
    if payload == "small":
        return _BODY
    doc = orjson.loads((Path(__file__).parent / "payloads" / f"{payload}.json").read_bytes())
    return orjson.dumps({"model": "a", "messages": doc["messages"]})


def measure(
    *,
    audit: bool,
    requests: int,
    warmup: int = 300,
    telemetry: str = "off",
    pii: bool = False,
    payload: str = "",
    content: str = "",
) -> dict[str, Any]:
    """CPU and wall time per request, over ``requests`` after ``warmup``; raises if one is not a 200."""
    payload = payload or ("pii-2k" if pii else "small")
    body = _body(payload)
    os.environ.setdefault("TOLLWAY_BENCH_PROVIDER_KEY", "sk-bench")
    os.environ.setdefault("TOLLWAY_BENCH_PII_KEY", "bench-pii-key-" + "k" * 32)
    os.environ["TOLLWAY_AUDIT_SHIPPER"] = "external"
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    _install_transport()
    from bench.otlp_sink import OtlpSink
    from tollway.server.app import create_app

    with tempfile.TemporaryDirectory() as tmp, OtlpSink() as sink:
        app = create_app(_config(Path(tmp), audit, telemetry, sink.endpoint, pii, content), watch_interval_s=None)
        headers = [
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]

        async def run() -> tuple[float, float]:
            async with app.router.lifespan_context(app):
                for _ in range(warmup):
                    await _serve(app, headers, body)
                answer = bytearray()
                await _serve(app, headers, body, answer)
                if pii and (b"TWPII" in answer or b"@example.com" not in answer):
                    raise RuntimeError("the gateway did not restore the placeholder the provider answered with")
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(requests):
                    status = await _serve(app, headers, body)
                    if status != 200:
                        raise RuntimeError(f"the gateway answered {status}")
                return time.process_time() - cpu, time.perf_counter() - wall

        cpu_s, wall_s = asyncio.run(run())
    return {
        "audit": audit,
        "telemetry": telemetry,
        "pii": pii,
        "content": content or "metadata-only",
        "payload": payload,
        "requests": requests,
        "cpu_us_per_request": round(cpu_s / requests * 1e6, 1),
        "wall_us_per_request": round(wall_s / requests * 1e6, 1),
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__.split("\n")[0])
    parser.add_argument("--audit", action="store_true", help="audit trail on (WAL written, not shipped)")
    parser.add_argument("--telemetry", choices=["off", "metrics", "traced"], default="off")
    parser.add_argument("--pii", action="store_true", help="a request-scope PII alias (payload pii-2k)")
    parser.add_argument("--payload", choices=["small", "pii-2k"], default="", help="small, or pii-2k with --pii")
    parser.add_argument(
        "--content",
        choices=["tokenized-content", "encrypted-raw"],
        default="",
        help="capture content (needs --audit) into the in-memory content store (default: metadata-only)",
    )
    parser.add_argument("--requests", type=int, default=3000, help="measured requests (default 3000)")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0:
        parser.error("--requests must be at least 1 and --warmup at least 0")
    if args.content and not args.audit:
        parser.error("--content needs --audit: the audit trail holds the content's references")
    result = measure(
        audit=args.audit,
        requests=args.requests,
        warmup=args.warmup,
        telemetry=args.telemetry,
        pii=args.pii,
        payload=args.payload,
        content=args.content,
    )
    if args.json:
        print(json.dumps(result))
    else:
        mode = ("audit on " if result["audit"] else "audit off") + f", telemetry {result['telemetry']}"
        mode += f", payload {result['payload']}" + (", PII request scope" if result["pii"] else "")
        mode += f", content {result['content']}"
        print(
            f"{mode}: {result['cpu_us_per_request']} µs CPU, {result['wall_us_per_request']} µs wall per request "
            f"({result['requests']} requests, Python {result['python']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
