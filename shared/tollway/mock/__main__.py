"""``python -m tollway.mock --host 127.0.0.1 --port 0 [--workers N] [--parent PID]``: serve the mock providers."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence

from tollway.mock.server import serve

_PARENT_CHECK_S = 0.5


def _stop_with(parent: int) -> None:
    """SIGTERM this process (uvicorn's graceful stop) once ``parent`` is gone.

    ``tollway up`` runs the mock in a process group of its own, so that a terminal's Ctrl-C
    reaches only ``up``, which stops the mock after the gateway; a killed ``up`` must not leave
    the mock behind.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tollway.mock", description="Serve Tollway's mock LLM providers.")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default: 0)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    parser.add_argument(
        "--parent",
        type=int,
        metavar="PID",
        help="the process that started this one: stop when it is gone (default: run until stopped)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.parent is not None:
        _stop_with(args.parent)
    try:
        serve(args.host, args.port, args.workers)
    except ValueError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
