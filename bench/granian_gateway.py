"""Serve the gateway under granian instead of uvicorn, for the ASGI-server comparison only.

``python -m bench.granian_gateway --config FILE --workers N`` picks a free loopback port (granian
binds by number, so port 0 cannot be reported back), prints the same ``Tollway listening on URL``
line as ``tollway serve`` and runs granian's ASGI interface with uvloop, the access log off.
This is a benchmark harness entry point, not a supported way to run Tollway.
"""

from __future__ import annotations

import argparse
import os
import socket


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.granian_gateway")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    os.environ["TOLLWAY_CONFIG"] = os.path.abspath(args.config)
    port = _free_port(args.host)
    print(f"Tollway listening on http://{args.host}:{port}/v1 ({args.workers} worker(s), granian)", flush=True)
    Granian(
        "tollway.server.app:create_app",
        address=args.host,
        port=port,
        interface=Interfaces.ASGI,
        workers=args.workers,
        loop=Loops.uvloop,
        factory=True,
        log_level=LogLevels.warning,
        log_access=False,
    ).serve()


if __name__ == "__main__":
    main()
