"""A collector stand-in for benchmarks: accepts OTLP/HTTP exports on 127.0.0.1 and discards them.

    python -m bench.otlp_sink [--port 0]    # prints "otlp sink listening on http://127.0.0.1:PORT/v1/traces"

A traced profile needs somewhere to export to: an unreachable collector would make the exporter
retry with backoff, which is not the cost being measured. This answers every ``POST`` with 200
and an empty body (an empty ``ExportTraceServiceResponse`` is zero bytes), counting what it got.
"""

from __future__ import annotations

import argparse
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["OtlpSink"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.server.exports += 1
        self.server.bytes += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    exports = 0
    bytes = 0


class OtlpSink:
    """The sink in a daemon thread of this process (``with OtlpSink() as sink: sink.endpoint``)."""

    def __init__(self, port: int = 0) -> None:
        self._server = _Server(("127.0.0.1", port), _Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True)

    @property
    def exports(self) -> int:
        return self._server.exports

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sink = OtlpSink(args.port)
    print(f"otlp sink listening on {sink.endpoint}", flush=True)
    sink._server.serve_forever()


if __name__ == "__main__":
    main()
