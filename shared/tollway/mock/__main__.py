"""``python -m tollway.mock --host 127.0.0.1 --port 0 [--workers N]``: serve the mock providers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tollway.mock.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tollway.mock", description="Serve Tollway's mock LLM providers.")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default: 0)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        serve(args.host, args.port, args.workers)
    except ValueError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
