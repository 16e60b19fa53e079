"""A real OTLP/HTTP traces receiver on 127.0.0.1 for tests: what a collector would be sent, decoded.

It answers ``POST /v1/traces`` (``application/x-protobuf``, optionally gzip or deflate encoded) the
way a collector does, with 200 and an empty ``ExportTraceServiceResponse``, and keeps each span as
a plain dict and each request body as it arrived (for scans of what left the process).
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = ["OtlpReceiver"]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    return None if kind is None else getattr(v, kind)


def _attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _span(span: Span, resource: dict[str, Any], scope: str) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "kind": Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        "attributes": _attributes(span.attributes),
        "events": [
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)} for e in span.events
        ],
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
        "status": Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
        "flags": span.flags,
        "scope": scope,
        "resource": resource,
    }


class OtlpReceiver:
    """``with OtlpReceiver() as rx:`` export to ``rx.endpoint``, then ``rx.wait_for(...)``."""

    def __init__(self) -> None:
        self._spans: list[dict[str, Any]] = []
        self._bodies: list[bytes] = []
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/v1/traces":
                    return self._answer(404)
                if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/x-protobuf":
                    return self._answer(415)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "identity")
                try:
                    raw = gzip.decompress(body) if encoding == "gzip" else body
                    raw = zlib.decompress(raw) if encoding == "deflate" else raw
                    receiver._accept(raw, ExportTraceServiceRequest.FromString(raw))
                except Exception:  # a body a collector would refuse
                    return self._answer(400)
                return self._answer(200, ExportTraceServiceResponse().SerializeToString())

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}/v1/traces"

    def _accept(self, raw: bytes, request: ExportTraceServiceRequest) -> None:
        spans: list[dict[str, Any]] = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                spans.extend(_span(span, resource, ss.scope.name) for span in ss.spans)
        with self._arrived:
            self._bodies.append(raw)
            self._spans.extend(spans)
            self._arrived.notify_all()

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def spans(self) -> list[dict[str, Any]]:
        with self._arrived:
            return list(self._spans)

    def raw_bodies(self) -> list[bytes]:
        """Each request body as decoded from its content encoding (protobuf bytes)."""
        with self._arrived:
            return list(self._bodies)

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> list[dict[str, Any]]:
        """The spans received once ``predicate`` holds for them; fails at the deadline with what arrived."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while not predicate(list(self._spans)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [s["name"] for s in self._spans]
                    raise AssertionError(f"OTLP receiver: condition not met within {timeout_s} s; spans: {names}")
                self._arrived.wait(remaining)
            return list(self._spans)
