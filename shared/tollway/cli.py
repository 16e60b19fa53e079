"""The ``tollway`` command: ``up``, ``serve`` and ``config validate``."""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

__all__ = ["main"]

log = logging.getLogger("tollway.cli")


def _configure_logging(level: str, access_log: bool) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("tollway.access").setLevel(logging.INFO if access_log else logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(sock: socket.socket, config_path: str, log_level: str, access_log: bool, index: int = 0) -> None:
    # Until the app installs its reload handler, a SIGHUP must not kill a starting worker;
    # the worker reads the newest file at start anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # A respawned worker keeps its index, so it reopens (and recovers) the same audit WAL.
    os.environ["TOLLWAY_WORKER_INDEX"] = str(index)
    import uvicorn

    from tollway.config import load_config
    from tollway.server.app import create_app
    from tollway.server.protocol import header_deadline_protocol

    _configure_logging(log_level, access_log)
    header_timeout_s = load_config(Path(config_path)).admission.headerReadTimeoutMs / 1000
    config = uvicorn.Config(
        app=lambda: create_app(config_path),
        factory=True,
        loop="uvloop",
        http=header_deadline_protocol(header_timeout_s),
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _supervise(sock: socket.socket, config_path: str, workers: int, log_level: str, access_log: bool) -> None:
    """Run ``workers`` processes on one listening socket; forward SIGHUP, respawn crashes."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    stopping = False

    def spawn(index: int) -> Any:
        proc = ctx.Process(target=_worker, args=(sock, config_path, log_level, access_log, index), daemon=False)
        proc.start()
        return proc

    def on_hup(signum: int, frame: object) -> None:
        for p in procs:
            if p.pid:
                os.kill(p.pid, signal.SIGHUP)

    def on_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    procs.extend(spawn(i) for i in range(workers))
    while not stopping:
        time.sleep(0.2)
        for i, p in enumerate(procs):
            if not p.is_alive() and not stopping:
                log.error("worker %s exited with %s; restarting", p.pid, p.exitcode)
                procs[i] = spawn(i)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)


def _check_config(config_path: str) -> None:
    from tollway.config.loader import load_config
    from tollway.exceptions import ConfigError

    try:
        load_config(Path(config_path))
    except ConfigError as exc:
        _print_issues(config_path, exc)
        raise SystemExit(2) from None


def _start_audit_shipper(config_path: str, workers: int) -> subprocess.Popen[bytes] | None:
    """When the audit trail is on, ship the workers' WALs from a process of its own.

    Shipping inside a worker put the sink client's CPU and threads on the request path's GIL
    (docs/benchmarks.md); the ship process exits on its own if this process dies.
    """
    from tollway.config.loader import load_config

    if load_config(Path(config_path)).audit.sink.type == "none":
        return None
    os.environ["TOLLWAY_AUDIT_SHIPPER"] = "external"  # the workers, spawned after this, append only
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tollway.audit.ship_process",
            "--config",
            config_path,
            "--workers",
            str(workers),
            "--parent",
            str(os.getpid()),
        ],
        stdin=subprocess.DEVNULL,
    )


def run_server(sock: socket.socket, config_path: str, workers: int, log_level: str, access_log: bool) -> None:
    shipper = _start_audit_shipper(config_path, workers)
    try:
        if workers == 1:
            _worker(sock, config_path, log_level, access_log)
        else:
            _supervise(sock, config_path, workers, log_level, access_log)
    finally:
        if shipper is not None:
            shipper.terminate()  # it drains once more, bounded, then exits
            try:
                shipper.wait(timeout=15)
            except subprocess.TimeoutExpired:
                shipper.kill()
                shipper.wait(timeout=5)


def serve(config_path: str, host: str, port: int, workers: int, log_level: str, access_log: bool) -> None:
    _configure_logging(log_level, access_log)
    _check_config(config_path)
    sock = bind_socket(host, port)
    print(f"Tollway listening on http://{host}:{sock.getsockname()[1]}/v1 ({workers} worker(s))", flush=True)
    run_server(sock, config_path, workers, log_level, access_log)


def _print_issues(path: str, exc: Any) -> None:
    print(f"{path}: invalid configuration", file=sys.stderr)
    for issue in exc.issues:
        print(f"  {issue}", file=sys.stderr)


def _start_mock(host: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.mock", "--host", host, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "mock listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise SystemExit(f"mock providers failed to start: {line!r}")
    return proc, line[len(prefix) :]


_CLOUD_READY: Final = re.compile(r"Tollway local cloud is up on (\S+?),")
_CLOUD_START_TIMEOUT_S: Final = 60.0


def _start_cloud(port: int, prefix: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m tollway.cloud up`` (moto server, bootstrap, event-source runner).

    The provider secrets are seeded with the mock provider key, by the name of the environment
    variable that holds it (never the value on a command line). Returns once the cloud is ready.
    """
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tollway.cloud",
            "up",
            "--prefix",
            prefix,
            "--port",
            str(port),
            "--secret",
            "openai=TOLLWAY_MOCK_PROVIDER_KEY",
            "--secret",
            "anthropic=TOLLWAY_MOCK_PROVIDER_KEY",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + _CLOUD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise SystemExit(f"the local cloud failed to start (exit {proc.returncode}); see the messages above")
        if m := _CLOUD_READY.search(line):
            # Nothing more is printed until shutdown; drain it off the main thread so a late
            # message can never block the child on a full pipe.
            threading.Thread(target=proc.stdout.read, daemon=True, name="cloud-stdout").start()
            return proc, m.group(1)
    _stop_child(proc)
    raise SystemExit(f"the local cloud did not become ready within {_CLOUD_START_TIMEOUT_S:.0f} s")


def local_audit_queue(stage: str) -> str:
    """The audit queue of a stage, as ``tollway.cloud.resources.topology`` names it (not imported:
    ``tollway.cloud`` is not shipped in the Lambda core layer, and this module is)."""
    return f"{stage}-audit-events"


def local_environment(stage: str) -> dict[str, str]:
    """The resource names ``tollway up`` gives the gateway, as the topology names them (see
    :func:`local_audit_queue` for why they are spelled out here; tests/unit/test_cli.py checks them)."""
    return {
        "TOLLWAY_QUEUE_AUDIT": local_audit_queue(stage),
        "TOLLWAY_QUEUE_USAGE": f"{stage}-usage-events",
        "TOLLWAY_TABLE_USAGE_LEDGER": f"{stage}-usage-ledger",
        "TOLLWAY_TABLE_QUOTA_LEASES": f"{stage}-quota-leases",
    }


def _stop_child(proc: subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def up(args: argparse.Namespace) -> None:
    """Start the embedded default: mock providers, the local cloud, and the gateway on the example config.

    ``--no-cloud`` keeps the pure in-process mode (mock providers and gateway only).
    """
    config = args.config or str(resources.files("tollway") / "examples" / "llm-router.yml")
    children: list[subprocess.Popen[str]] = []

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets the
    # finally below stop the children instead of orphaning them.
    signal.signal(signal.SIGTERM, on_term)
    demo_key = os.environ.get("TOLLWAY_DEMO_KEY") or "tw-demo-" + secrets.token_urlsafe(24)
    os.environ["TOLLWAY_DEMO_KEY"] = demo_key
    os.environ.setdefault("TOLLWAY_MOCK_PROVIDER_KEY", "mock-" + secrets.token_urlsafe(16))
    try:
        mock, mock_url = _start_mock("127.0.0.1")
        children.append(mock)
        os.environ.setdefault("TOLLWAY_MOCK_URL", mock_url)
        cloud_line = "  cloud    : off (--no-cloud)"
        if not args.no_cloud:
            cloud, endpoint = _start_cloud(args.cloud_port, args.stage)
            children.append(cloud)
            # The gateway (and what later issues add to it) talks to the local cloud, never to AWS.
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            # Dummy credentials, as tollway.cloud.local gives its children, overriding any real
            # ones: real credentials are never sent to an emulator. (tollway.cloud is not imported
            # here: it is not shipped in the Lambda core layer, and this module is.)
            os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"})
            os.environ.pop("AWS_SESSION_TOKEN", None)
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            # The audit trail ships to the local cloud's audit queue (the bundled example reads
            # these; the name is the spec's, see tests/unit/test_cli.py).
            os.environ.setdefault("TOLLWAY_AUDIT_SINK", "sqs")
            # request_finished events also feed the usage reconciler, whose ledger GET /v1/usage
            # reads; budgets lease from the stage's quota-leases table.
            for name, value in local_environment(args.stage).items():
                os.environ.setdefault(name, value)
            os.environ.setdefault("TOLLWAY_GOVERNANCE_STORE", "dynamodb")
            cloud_line = f"  cloud    : {endpoint} (stage {args.stage}; audit trail on: tollway audit list --since 10m)"
        _configure_logging(args.log_level, not args.no_access_log)
        _check_config(config)
        sock = bind_socket(args.host, args.port)
        base = f"http://{args.host}:{sock.getsockname()[1]}/v1"
        print(
            "\n".join(
                [
                    "Tollway is running on its embedded default (bundled mock providers).",
                    f"  base URL : {base}",
                    f"  demo key : {demo_key}",
                    cloud_line,
                    "  models   : chat-fast-v1 (OpenAI-format mock), chat-claude-v1 (Anthropic-format mock)",
                    "",
                    "  from openai import OpenAI",
                    f'  client = OpenAI(base_url="{base}", api_key="{demo_key}")',
                    "  client.chat.completions.create(",
                    '      model="chat-fast-v1", messages=[{"role": "user", "content": "hi"}])',
                    "",
                    "Press Ctrl-C to stop.",
                ]
            ),
            flush=True,
        )
        run_server(sock, config, args.workers, args.log_level, not args.no_access_log)
    finally:
        for child in reversed(children):
            _stop_child(child)


def config_validate(path: str) -> int:
    from tollway.config.loader import load_config
    from tollway.exceptions import ConfigError

    try:
        cfg = load_config(Path(path))
    except ConfigError as exc:
        _print_issues(path, exc)
        return 1
    print(f"{path}: ok ({len(cfg.models)} aliases, {len(cfg.providers)} providers, {len(cfg.principals)} principals)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tollway", description="Tollway LLM gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, port: int) -> None:
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=port)
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--log-level", default="info")

    p_up = sub.add_parser("up", help="run the gateway on the embedded default (mock providers)")
    common(p_up, 8080)
    p_up.add_argument("--config", help="use this llm-router.yml instead of the bundled example")
    p_up.add_argument("--no-access-log", action="store_true")
    p_up.add_argument("--no-cloud", action="store_true", help="no local cloud: mock providers and gateway only")
    p_up.add_argument(
        "--cloud-port", type=int, default=4566, help="moto server port (default 4566; 0 picks a free port)"
    )
    p_up.add_argument("--stage", default="tollway", help="resource name prefix in the local cloud")

    p_serve = sub.add_parser("serve", help="run the gateway on a config file")
    common(p_serve, 8080)
    p_serve.add_argument("--config", required=True)
    p_serve.add_argument("--access-log", action="store_true")

    p_audit = sub.add_parser(
        "audit", help="read the audit store: audit show REQUEST_ID | audit list --since 1h", add_help=False
    )
    p_audit.add_argument("rest", nargs=argparse.REMAINDER)

    p_cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = p_cfg.add_subparsers(dest="config_command", required=True)
    p_val = cfg_sub.add_parser("validate", help="validate an llm-router.yml and print every error with its path")
    p_val.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["audit"]:
        # Everything after ``audit`` (including --help) belongs to the audit reader's own parser.
        from tollway.audit.cli import main as audit_main

        return audit_main(argv[1:])
    args = _parser().parse_args(argv)
    if getattr(args, "workers", 1) < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            up(args)
        elif args.command == "serve":
            serve(args.config, args.host, args.port, args.workers, args.log_level, args.access_log)
    except KeyboardInterrupt:
        return 0
    if args.command == "config":
        return config_validate(args.file)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
