"""The ``tollway`` command: ``up``, ``serve``, ``audit``, ``config validate``, ``pii conformance`` and
``conformance run|show`` (provider conformance per deployment, docs/conformance.md).

``serve`` and ``up`` check what they can before anything listens, and fail with one line and
exit status 2: the configuration loads and validates, every secret it references resolves
(:func:`preflight`), and, for ``up``, every port it will bind is free.

``up`` runs the mock providers, the local cloud and the audit shipper in process groups of their
own, so a Ctrl-C in the terminal reaches only ``up`` (and the gateway), which then stops them in
order, each step bounded: the gateway (in-flight requests finish, leases go back to the local
cloud), the audit shipper (it ships what the gateway's WAL still holds), the local cloud (its
event-source runner takes what is on the queues and finishes its batches, then moto stops), the
mock providers. Each child also exits by itself if ``up`` is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.metadata
import logging
import multiprocessing
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, NoReturn

from tollway.pids import alive
from tollway.up_state import UpState, read_state, remove_state, write_state

__all__ = ["main", "preflight", "stop_in_order"]

log = logging.getLogger("tollway.cli")

GRACEFUL_SHUTDOWN_S: Final = 10
"""How long in-flight requests (streams too) get to finish once the gateway is told to stop."""
_SHIPPER_STOP_S: Final = 15.0
"""The ship process bounds its last drain at 10 s (``tollway.audit.ship.process``)."""
_CLOUD_STOP_S: Final = 40.0
"""The local cloud's runner drains for at most 10 s and finishes its batches within 10 s more,
then moto server gets up to 10 s: see ``tollway.cloud.__main__``."""
_MOCK_STOP_S: Final = 5.0


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit status 2: what cannot start, and why."""
    print(f"tollway: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _configure_logging(level: str, access_log: bool, fmt: str = "json") -> None:
    """One handler on the root logger: JSON lines on stderr, or ``fmt="text"`` for a person reading them.

    ``TOLLWAY_LOG_FORMAT`` overrides ``fmt``; it is in the environment of every process this one
    starts, so the workers, the audit shipper and the local cloud all log in the same format. A bad
    value fails here, before anything listens.
    """
    from tollway.telemetry.logs import configure_logging, env_log_format, parse_log_format

    try:
        chosen = env_log_format(parse_log_format(fmt))
    except ValueError as exc:
        _fail(str(exc))
    configure_logging(level, fmt=chosen, access_log=access_log)


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
    from tollway.server.protocol import gateway_protocol

    cfg = load_config(Path(config_path))
    _configure_logging(log_level, access_log, cfg.telemetry.logFormat)
    admission = cfg.admission
    config = uvicorn.Config(
        app=lambda: create_app(config_path),
        factory=True,
        loop="uvloop",
        http=gateway_protocol(
            admission.headerReadTimeoutMs / 1000,
            max_header_bytes=admission.maxRequestHeaderBytes,
            max_headers=admission.maxRequestHeaders,
        ),
        lifespan="on",
        access_log=False,
        log_level="warning",
        log_config=None,  # uvicorn's own handlers would print text lines: its loggers go through ours
        timeout_keep_alive=30,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        h11_max_incomplete_event_size=64 * 1024,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _spawned_worker(sock: socket.socket, config_path: str, log_level: str, access_log: bool, index: int) -> None:
    """A worker process. A terminal's Ctrl-C reaches it too, with its whole process group; uvicorn
    has stopped gracefully by the time it re-raises the signal, so that is no error to report."""
    with contextlib.suppress(KeyboardInterrupt):
        _worker(sock, config_path, log_level, access_log, index)


def _supervise(sock: socket.socket, config_path: str, workers: int, log_level: str, access_log: bool) -> None:
    """Run ``workers`` processes on one listening socket; forward SIGHUP, respawn crashes."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    stopping = False

    def spawn(index: int) -> Any:
        proc = ctx.Process(target=_spawned_worker, args=(sock, config_path, log_level, access_log, index), daemon=False)
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
                _forget_metrics_of(p.pid)
                procs[i] = spawn(i)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + GRACEFUL_SHUTDOWN_S + 5
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            log.warning("worker %s did not stop within %d s; killing it", p.pid, GRACEFUL_SHUTDOWN_S + 5)
            p.kill()
            p.join(timeout=5)


def _forget_metrics_of(pid: int | None) -> None:
    """A dead worker's live gauges (requests in flight, …) must not count in the next scrape."""
    if pid and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def preflight(config_path: str, *, env_secrets_only: bool = False) -> None:
    """Load and validate the configuration and resolve every secret it references, or exit 2.

    The gateway's workers resolve the same secrets when they publish the configuration; a
    missing one found there crash-looped them behind a ``Tollway listening`` line. What is
    resolved is what publication resolves: each principal key's ``secretRef`` and the
    ``current`` credentials of providers that authenticate. Values are never printed.
    ``env_secrets_only`` skips ``aws-sm:`` references (``up`` checks those once its local cloud
    is running).
    """
    from tollway.config.loader import load_config
    from tollway.config.pii import check_preservation
    from tollway.exceptions import ConfigError
    from tollway.secrets import SecretResolver

    try:
        cfg = load_config(Path(config_path))
        check_preservation(cfg, Path(config_path).parent)  # reads pii.conformanceFile, as publication does
    except ConfigError as exc:
        _print_issues(config_path, exc, prefix="tollway: error: ")
        raise SystemExit(2) from None
    tracing = cfg.telemetry.tracing
    if tracing.enabled:
        from tollway.telemetry.tracing import resolve_endpoint

        if resolve_endpoint(tracing.endpoint) is None:
            _fail(
                "telemetry.tracing is enabled but names no collector: set telemetry.tracing.endpoint "
                "or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT"
            )
    refs = [
        (f"principals[{i}].keys[{j}].secretRef", key.secretRef)
        for i, principal in enumerate(cfg.principals)
        for j, key in enumerate(principal.keys)
        if key.secretRef
    ]
    refs += [
        (f"providers.{pid}.credentials[{k}].secretRef", cred.secretRef)
        for pid, provider in cfg.providers.items()
        if provider.authMode != "none"
        for k, cred in enumerate(provider.credentials)
        if cred.lifecycle == "current"
    ]
    resolver = SecretResolver()
    for path, ref in refs:
        if env_secrets_only and not ref.startswith("env:"):
            continue
        try:
            resolver.resolve(ref, path)
        except ConfigError as exc:
            problem = f"secret {ref} is not set or empty" if ref.startswith("env:") else exc.issues[0].message
            _fail(f"{problem} ({path})")
    for pid, provider in cfg.providers.items():
        if provider.type == "bedrock" and provider.authMode != "none":
            # Bedrock signs with the gateway's own AWS credentials: none found is the same crash loop.
            from tollway.transport.sigv4 import botocore_credentials

            try:
                botocore_credentials(provider.awsProfile, path=f"providers.{pid}")
            except ConfigError as exc:
                _fail(f"{exc.issues[0].message} ({exc.issues[0].path})")
        elif provider.type == "vertex" and provider.authMode != "none":
            # Vertex AI takes tokens from the gateway's own Google credentials: the same check.
            from tollway.providers.gemini.vertex_auth import google_credentials

            try:
                google_credentials(path=f"providers.{pid}")
            except ConfigError as exc:
                _fail(f"{exc.issues[0].message} ({exc.issues[0].path})")


def _start_audit_shipper(config_path: str, workers: int) -> subprocess.Popen[bytes] | None:
    """When the audit trail is on, ship the workers' WALs from a process of its own.

    Shipping inside a worker put the sink client's CPU and threads on the request path's GIL
    (docs/benchmarks.md); the ship process exits on its own if this process dies.
    """
    from tollway.config.loader import load_config

    if load_config(Path(config_path)).audit.sink.type == "none":
        return None
    os.environ["TOLLWAY_AUDIT_SHIPPER"] = "external"  # the workers, spawned after this, append only
    # Its own process group: a terminal's Ctrl-C must not make it drain before the gateway stopped
    # appending; it is stopped after the gateway, and exits by itself if this process dies.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tollway.audit.ship.process",
            "--config",
            config_path,
            "--workers",
            str(workers),
            "--parent",
            str(os.getpid()),
        ],
        stdin=subprocess.DEVNULL,
        process_group=0,
    )


@dataclass(frozen=True, slots=True)
class Child:
    """A process ``up`` or ``serve`` started, and how long it may take to stop after SIGTERM."""

    name: str
    proc: subprocess.Popen[Any]
    stop_timeout_s: float


def stop_in_order(children: Sequence[Child]) -> None:
    """SIGTERM each child and wait for it to exit (SIGKILL after its timeout) before the next.

    From here on the process is stopping, and Ctrl-C is ignored: every step is bounded, and an
    interrupted stop would leave the later children running, in process groups of their own.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for child in children:
        started = time.monotonic()
        _stop_child(child.proc, child.stop_timeout_s)
        log.debug("%s stopped in %.1f s", child.name, time.monotonic() - started)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_server(sock: socket.socket, config_path: str, workers: int, log_level: str, access_log: bool) -> None:
    """Serve until stopped, then stop the audit shipper (it ships what the gateway's WAL still
    holds) and remove the metric files."""
    # uvicorn re-raises SIGTERM after its graceful shutdown. Under the default handler that killed
    # the process before the ``finally`` below: the shipper was left to notice on its own and the
    # metrics directory stayed behind. As SystemExit, the ``finally`` runs.
    signal.signal(signal.SIGTERM, _exit_on_term)
    metrics_dir = _start_metrics(config_path)
    shipper = _start_audit_shipper(config_path, workers)
    try:
        if workers == 1:
            _worker(sock, config_path, log_level, access_log)
        else:
            _supervise(sock, config_path, workers, log_level, access_log)
    finally:
        if shipper is not None:
            stop_in_order([Child("audit shipper", shipper, _SHIPPER_STOP_S)])
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


_METRICS_PREFIX: Final = "tollway-metrics-"


def sweep_metrics_dirs(temp: Path) -> list[Path]:
    """Remove the metrics directories, in ``temp`` and owned by this user, of servers that are gone.

    A server removes its own when it stops; one that was killed (SIGKILL, out of memory) cannot.
    Each directory is named after the pid of the server that made it, and only one whose server
    no longer runs is removed: a reused pid keeps a stale directory, never removes a live one."""
    removed: list[Path] = []
    uid = os.getuid()
    for entry in temp.glob(f"{_METRICS_PREFIX}*-*"):
        owner = entry.name.removeprefix(_METRICS_PREFIX).split("-", 1)[0]
        try:
            if not owner.isdigit() or entry.lstat().st_uid != uid or not entry.is_dir() or alive(int(owner)):
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _start_metrics(config_path: str) -> str | None:
    """With metrics on, give every process of this server one directory for its metric files
    (prometheus-client's multiprocess mode: a scrape of any worker aggregates them all), and
    serve the scrape on ``telemetry.metrics.port`` from this process when one is set."""
    import tempfile

    from tollway.config.loader import load_config

    metrics = load_config(Path(config_path)).telemetry.metrics
    if not metrics.enabled:
        return None
    sweep_metrics_dirs(Path(tempfile.gettempdir()))
    directory = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # read when prometheus_client is first imported
    if metrics.port is not None:
        from prometheus_client import CollectorRegistry, multiprocess, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        try:
            start_http_server(metrics.port, addr=metrics.host, registry=registry)
        except OSError as exc:
            _fail(f"cannot serve metrics on {metrics.host}:{metrics.port}: {exc.strerror or exc}")
        print(f"Tollway metrics on http://{metrics.host}:{metrics.port}/metrics", flush=True)
    return directory


def _listen(host: str, port: int, flag: str) -> socket.socket:
    try:
        return bind_socket(host, port)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another port with {flag})")


def serve(config_path: str, host: str, port: int, workers: int, log_level: str, access_log: bool) -> None:
    _configure_logging(log_level, access_log)
    preflight(config_path)
    sock = _listen(host, port, "--port")
    print(f"Tollway listening on http://{host}:{sock.getsockname()[1]}/v1 ({workers} worker(s))", flush=True)
    run_server(sock, config_path, workers, log_level, access_log)


def _print_issues(path: str, exc: Any, prefix: str = "") -> None:
    print(f"{prefix}{path}: invalid configuration", file=sys.stderr)
    for issue in exc.issues:
        print(f"  {issue}", file=sys.stderr)


def _start_mock(port: int) -> tuple[Child, str]:
    """The mock providers on 127.0.0.1:``port``, in a process group of their own."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tollway.mock",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parent",
            str(os.getpid()),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        process_group=0,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "mock listening on "
    if not line.startswith(prefix):
        _stop_child(proc, _MOCK_STOP_S)
        proc.stdout.close()
        _fail(f"the mock providers did not start on 127.0.0.1:{port} (choose another port with --mock-port)")
    threading.Thread(target=_forward, args=(proc.stdout,), daemon=True, name="mock-stdout").start()
    return Child("mock providers", proc, _MOCK_STOP_S), line[len(prefix) :]


_CLOUD_READY: Final = re.compile(r"Tollway local cloud is up on (\S+?),")
_CLOUD_START_TIMEOUT_S: Final = 60.0


def _start_cloud(port: int, prefix: str, env: dict[str, str]) -> tuple[Child, str]:
    """Start ``python -m tollway.cloud up`` (moto server, bootstrap, event-source runner).

    The provider secrets are seeded with the mock provider key, by the name of the environment
    variable that holds it (never the value on a command line). Returns once the cloud is ready;
    what it prints after that (its stop summary) goes to this process's stdout.
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
            "--parent",
            str(os.getpid()),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        process_group=0,
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
            # Forwarded off the main thread, so a late message can never block the child on a full pipe.
            threading.Thread(target=_forward, args=(proc.stdout,), daemon=True, name="cloud-stdout").start()
            return Child("local cloud", proc, _CLOUD_STOP_S), m.group(1)
    _stop_child(proc)
    raise SystemExit(f"the local cloud did not become ready within {_CLOUD_START_TIMEOUT_S:.0f} s")


def _forward(stream: Any) -> None:
    """Copy a child's stdout to ours until it ends (the child exits), then close it."""
    with stream:
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()


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


def _port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now, or ``None`` when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
    return None


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (all held open until all are picked)."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def up_ports(host: str, port: int, mock_port: int, cloud_port: int | None) -> tuple[int, int | None]:
    """Check every port ``up`` will bind before anything starts, or exit 2 naming the flag to change.

    Returns the mock's and the cloud's ports, a 0 replaced by a free port (the gateway binds its
    own 0 itself). ``cloud_port`` is ``None`` when no moto server is started here.
    """
    wanted = [("--port", host, port), ("--mock-port", "127.0.0.1", mock_port)]
    if cloud_port is not None:
        wanted.append(("--cloud-port", "127.0.0.1", cloud_port))
    taken: dict[int, str] = {}
    for flag, where, number in wanted:
        if not number:
            continue
        if number in taken:
            _fail(f"{taken[number]} and {flag} are both {number}; give each its own port")
        taken[number] = flag
        problem = _port_problem(where, number)
        if problem is not None:
            _fail(f"port {number} on {where} {problem}; choose another with {flag} ({flag} 0 picks a free one)")
    free = iter(_free_ports(4))
    chosen_mock = mock_port or next(p for p in free if p not in taken)
    if cloud_port is None:
        return chosen_mock, None
    return chosen_mock, cloud_port or next(p for p in free if p not in taken and p != chosen_mock)


def _command() -> str:
    """How this ``tollway`` was run, to print a command that works as shown (``.venv/bin/tollway``)."""
    argv0 = Path(sys.argv[0])
    if argv0.name != "tollway":
        return "tollway"
    try:
        return str(argv0.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(argv0)


def _local_pii_key(stage: str) -> None:
    """Keep the PII placeholder key where a deployment keeps it, in Secrets Manager (here the local
    cloud's), and point the example config's ``pii.keySecretRef`` at it. A fresh random key for each
    run: request-scoped placeholders never outlive their request."""
    if os.environ.get("TOLLWAY_PII_KEY_REF"):
        return
    from tollway import aws

    name = f"{stage}/pii-placeholder-key"
    sm = aws.client("secretsmanager")
    value = secrets.token_urlsafe(32)
    try:
        sm.create_secret(Name=name, SecretString=value)
    except sm.exceptions.ResourceExistsException:
        sm.put_secret_value(SecretId=name, SecretString=value)
    os.environ["TOLLWAY_PII_KEY_REF"] = f"aws-sm:{name}"


def _local_content_store(stage: str) -> None:
    """Point the example config's content store at the stage's content bucket and KMS key: the
    bucket's name holds the account, which the local cloud tells once it runs."""
    from tollway import aws

    account = aws.client("sts").get_caller_identity()["Account"]
    names = stage_names(stage, account, os.environ["AWS_DEFAULT_REGION"])
    for name in ("TOLLWAY_BUCKET_CONTENT", "TOLLWAY_CONTENT_KMS_KEY_ID"):
        os.environ.setdefault(name, names[name])


def _dummy_aws_credentials() -> None:
    """Give the gateway dummy AWS credentials, with or without the local cloud, overriding any real ones.

    Everything ``up`` starts is local: the demo's Bedrock alias signs each request (SigV4) to the
    bundled mock, and the local cloud is an emulator. Bedrock needs some credentials to sign with,
    even against the mock, and real ones must never sign a request to either. These are the ones
    ``tollway.cloud.local`` gives its children (not imported here: ``tollway.cloud`` is not shipped
    in the Lambda core layer, and this module is). ``serve`` keeps the environment it is given.
    """
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"})
    os.environ.pop("AWS_SESSION_TOKEN", None)


def _local_cloud_environment(endpoint: str, stage: str) -> None:
    """Point the gateway (and what later issues add to it) at the local cloud, never at AWS (whose
    credentials :func:`_dummy_aws_credentials` has already replaced)."""
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_DEFAULT_REGION", _LOCAL_REGION)
    # The audit trail ships to the local cloud's audit queue (the bundled example reads these; the
    # name is the spec's, see tests/unit/test_cli.py).
    os.environ.setdefault("TOLLWAY_AUDIT_SINK", "sqs")
    # request_finished events also feed the usage reconciler, whose ledger GET /v1/usage reads;
    # budgets lease from the stage's quota-leases table.
    for name, value in local_environment(stage).items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("TOLLWAY_GOVERNANCE_STORE", "dynamodb")
    # The demo's chat-capture-v1 keeps its tokenized exchanges in the stage's content bucket.
    os.environ.setdefault("TOLLWAY_CONTENT_CAPTURE", "tokenized-content")


_LOCAL_REGION: Final = "us-east-1"


def up(args: argparse.Namespace) -> None:
    """Start the embedded default: mock providers, the local cloud, and the gateway on the example config.

    ``--no-cloud`` keeps the pure in-process mode (mock providers and gateway only). Ports, the
    configuration and its secrets are checked before anything starts; the stop order is in the
    module docstring.
    """
    config = args.config or str(resources.files("tollway") / "examples" / "llm-router.yml")
    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets the
    # finally below stop the children instead of orphaning them.
    signal.signal(signal.SIGTERM, _exit_on_term)
    demo_key = os.environ.get("TOLLWAY_DEMO_KEY") or "tw-demo-" + secrets.token_urlsafe(24)
    os.environ["TOLLWAY_DEMO_KEY"] = demo_key
    os.environ.setdefault("TOLLWAY_MOCK_PROVIDER_KEY", "mock-" + secrets.token_urlsafe(16))
    os.environ.setdefault("TOLLWAY_PII_KEY", secrets.token_urlsafe(32))  # --no-cloud: the key stays in memory
    cloud_env = dict(os.environ)  # as the user gave it: the cloud decides what to start from it
    external = os.environ.get("AWS_ENDPOINT_URL", "").strip().rstrip("/")
    mock_port, cloud_port = up_ports(
        args.host, args.port, args.mock_port, None if args.no_cloud or external else args.cloud_port
    )
    os.environ.setdefault("TOLLWAY_MOCK_URL", f"http://127.0.0.1:{mock_port}")
    _dummy_aws_credentials()
    cloud_line = "  cloud    : off (--no-cloud)"
    if not args.no_cloud:
        _local_cloud_environment(external or f"http://127.0.0.1:{cloud_port}", args.stage)
    _configure_logging(args.log_level, not args.no_access_log)
    preflight(config, env_secrets_only=True)
    children: list[Child] = []
    try:
        mock, _ = _start_mock(mock_port)
        children.append(mock)
        if not args.no_cloud:
            cloud, endpoint = _start_cloud(cloud_port or 0, args.stage, cloud_env)
            children.insert(0, cloud)  # stopped before the mock: its runner may still be handling events
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            write_state(UpState(endpoint, args.stage, os.environ["AWS_DEFAULT_REGION"], os.getpid()))
            hint = f"{_command()} audit list --since 10m"
            cloud_line = f"  cloud    : {endpoint} (stage {args.stage}; audit trail on: {hint})"
            _local_pii_key(args.stage)
            _local_content_store(args.stage)
            preflight(config)  # aws-sm: references can be read now
        sock = _listen(args.host, args.port, "--port")
        base = f"http://{args.host}:{sock.getsockname()[1]}/v1"
        print(
            "\n".join(
                [
                    "Tollway is running on its embedded default (bundled mock providers).",
                    f"  base URL : {base}",
                    f"  demo key : {demo_key}",
                    cloud_line,
                    f"  metrics  : {base.removesuffix('/v1')}/metrics (Prometheus; docs/observability.md)",
                    "  models   : chat-fast-v1 (OpenAI Chat Completions), chat-claude-v1 (Anthropic Messages),",
                    "             chat-gemini-v1 (Gemini), chat-bedrock-v1 (Bedrock Converse), each on its mock,",
                    "             chat-pii-v1 (PII tokenized before the mock sees it), embed-small-v1 (embeddings)",
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
        stop_in_order(children)
        remove_state(os.getpid())


def stage_names(stage: str, account: str, region: str) -> dict[str, str]:
    """The resource names of a stage that ``export`` and ``content`` use, as the topology names them
    (spelled out, as :func:`local_environment`'s are; tests/unit/test_cli.py checks them)."""
    return {
        "TOLLWAY_STAGE": stage,
        "TOLLWAY_QUEUE_AUDIT": local_audit_queue(stage),
        "TOLLWAY_QUEUE_EXPORTS": f"{stage}-export-requests",
        "TOLLWAY_TABLE_AUDIT": f"{stage}-audit",
        "TOLLWAY_BUCKET_CONTENT": f"{stage}-content-{account}-{region}",
        "TOLLWAY_BUCKET_EXPORTS": f"{stage}-exports-{account}-{region}",
        "TOLLWAY_CONTENT_KMS_KEY_ID": f"alias/{stage}-content",
    }


def cloud_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command that reads or writes the stage's resources (``export``,
    ``content``): the local cloud of the ``tollway up`` running in this directory when no
    ``AWS_ENDPOINT_URL`` is set, dummy credentials for a local endpoint, and every resource name of
    the stage (``TOLLWAY_QUEUE_EXPORTS``, ``TOLLWAY_BUCKET_CONTENT``…) unless already set."""
    import boto3

    env = dict(os.environ if environ is None else environ)
    running = None if env.get("AWS_ENDPOINT_URL", "").strip() else read_state()
    if running is not None:
        env["AWS_ENDPOINT_URL"] = running.endpoint
        env["AWS_REGION"] = running.region
        env.setdefault("TOLLWAY_STAGE", running.stage)
    endpoint = env.get("AWS_ENDPOINT_URL", "").strip() or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or _LOCAL_REGION
    env.setdefault("AWS_REGION", region)
    if endpoint and urllib.parse.urlsplit(endpoint).hostname in ("127.0.0.1", "localhost", "::1"):
        # A local cloud takes any credentials; a developer's real ones are never sent to it.
        env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = "test", "test"
        env.pop("AWS_SESSION_TOKEN", None)
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=env.get("AWS_SESSION_TOKEN"),
        region_name=region,
    )
    account = session.client("sts", endpoint_url=endpoint).get_caller_identity()["Account"]
    stage = env.get("TOLLWAY_STAGE", "").strip() or "tollway"
    return {**stage_names(stage, account, region), **env}


def config_validate(path: str, conformance: bool = False) -> int:
    from tollway.config.loader import load_config_with_warnings
    from tollway.config.pii import check_preservation
    from tollway.exceptions import ConfigError

    try:
        cfg, warnings = load_config_with_warnings(Path(path))
        check_preservation(cfg, Path(path).parent)
        if conformance:  # requireConformance against the stored results (docs/conformance.md)
            from tollway.conformance import check_config

            issues = check_config(cfg, Path(path).parent)
            if issues:
                raise ConfigError(issues)
    except ConfigError as exc:
        _print_issues(path, exc)
        return 1
    counts = f"{len(cfg.models)} aliases, {len(cfg.providers)} providers, {len(cfg.principals)} principals"
    print(f"{path}: ok ({counts})" + (f", {len(warnings)} warning(s)" if warnings else ""))
    for issue in warnings:  # accepted, but written settings that cannot take effect
        print(f"  warning: {issue}", file=sys.stderr)
    return 0


def conformance(args: argparse.Namespace) -> int:
    """``conformance run`` (the suite against one deployment, results stored) and ``conformance
    show`` (its stored results): one line per case, then a summary. Exit status 0 when every
    capability its routes declare passed, 1 when one did not (or has no result), 2 on a usage or
    configuration error."""
    from tollway.config.loader import load_config
    from tollway.config.root import Publisher
    from tollway.conformance import ConformanceStoreError, open_store, results_location
    from tollway.conformance.commands import UsageProblem, run_or_show
    from tollway.exceptions import ConfigError

    config = Path(args.config or os.environ.get("TOLLWAY_CONFIG", "") or "llm-router.yml")
    try:
        cfg = load_config(config)
        # --results is taken from the working directory, a configured location from the config's folder.
        store = (
            open_store(args.results)
            if args.results
            else open_store(results_location(cfg.conformance.results), config.parent)
        )
        publisher = Publisher(config_dir=config.parent) if args.conformance_command == "run" else None
        return run_or_show(cfg, args.deployment, args.model or (), store, publisher, timeout_s=args.timeout)
    except ConfigError as exc:
        _print_issues(str(config), exc, prefix="tollway: error: ")
        return 2
    except (UsageProblem, ConformanceStoreError) as exc:
        _fail(f"{config}: {exc}")
    except OSError as exc:
        _fail(f"cannot read {config}: {exc.strerror or exc}")


def pii_conformance(args: argparse.Namespace) -> int:
    """Measure how each alias's deployment keeps placeholders over the preservation corpus (docs/pii.md).

    Exit status 0 when every case got an answer (or a ``pii_unresolved`` refusal, itself a
    measurement), 1 when some request failed otherwise, 2 on bad arguments.
    """
    from tollway.pii.conformance import ConformanceError, load_corpus, run

    key = args.key or os.environ.get("TOLLWAY_KEY", "")
    if not key:
        _fail("--key (or $TOLLWAY_KEY) is required: a Tollway key allowed on every --model")
    models: dict[str, str] = {}
    for spec in args.model:
        alias, _, label = spec.partition("=")
        label = label or alias
        if not alias or label in models:
            _fail(f"--model {spec!r}: give ALIAS or ALIAS=LABEL, each label once")
        models[label] = alias
    try:
        corpus = load_corpus(args.corpus)
    except ConformanceError as exc:
        _fail(str(exc))
    results = run(
        args.base_url,
        key,
        [(alias, label) for label, alias in models.items()],
        corpus,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
    )
    if args.out:
        Path(args.out).write_bytes(results.to_json())
    else:
        sys.stdout.buffer.write(results.to_json())
    for line in results.summary():
        print(line, file=sys.stderr if not args.out else sys.stdout)
    failed = any(code != "502 pii_unresolved" for d in results.deployments.values() for code in d.errors)
    return 1 if failed else 0


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an option may word its own ``(default: …)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "(default:" in action.help:
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    try:
        return importlib.metadata.version("tollway")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tollway", description="Tollway LLM gateway")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, port: int) -> None:
        p.add_argument("--host", default="127.0.0.1", help="address the gateway listens on")
        p.add_argument("--port", type=int, default=port, help="gateway port; 0 picks a free port")
        p.add_argument("--workers", type=int, default=1, help="gateway worker processes on one socket")
        p.add_argument("--log-level", default="info", help="log level: debug, info, warning or error")

    p_up = sub.add_parser(
        "up",
        help="run the gateway on the embedded default (mock providers, local cloud)",
        description="Run the mock providers, the local cloud and the gateway on 127.0.0.1 until Ctrl-C.",
        formatter_class=_HelpFormatter,
    )
    common(p_up, 8080)
    p_up.add_argument(
        "--config", help="an llm-router.yml to serve (default: the bundled shared/tollway/examples/llm-router.yml)"
    )
    p_up.add_argument("--no-access-log", action="store_true", help="do not log each request (default: logged)")
    p_up.add_argument(
        "--no-cloud",
        action="store_true",
        help="no local cloud: mock providers and gateway only, audit off (default: off)",
    )
    p_up.add_argument("--mock-port", type=int, default=0, help="mock providers' port; 0 picks a free port")
    p_up.add_argument("--cloud-port", type=int, default=4566, help="moto server port; 0 picks a free port")
    p_up.add_argument("--stage", default="tollway", help="resource name prefix in the local cloud")

    p_serve = sub.add_parser(
        "serve",
        help="run the gateway on a config file",
        description="Run the gateway on an llm-router.yml until Ctrl-C or SIGTERM; SIGHUP reloads it.",
        formatter_class=_HelpFormatter,
    )
    common(p_serve, 8080)
    p_serve.add_argument("--config", required=True, help="the llm-router.yml to serve (default: none, required)")
    p_serve.add_argument("--access-log", action="store_true", help="log each request (default: off)")

    p_audit = sub.add_parser(
        "audit", help="read the audit store: audit show REQUEST_ID | audit list --since 1h", add_help=False
    )
    p_audit.add_argument("rest", nargs=argparse.REMAINDER)

    sub.add_parser("export", help="governed dataset exports: export create|list|show|download", add_help=False)
    sub.add_parser("content", help="captured content: content delete --request ID | --before DATE", add_help=False)
    p_cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = p_cfg.add_subparsers(dest="config_command", required=True)
    p_val = cfg_sub.add_parser("validate", help="validate an llm-router.yml and print every error with its path")
    p_val.add_argument("file")
    p_val.add_argument(
        "--conformance",
        action="store_true",
        help="also check requireConformance routes against the stored conformance results (docs/conformance.md)",
    )

    p_cnf = sub.add_parser("conformance", help="provider conformance per deployment: conformance run|show")
    cnf_sub = p_cnf.add_subparsers(dest="conformance_command", required=True)
    for name, what in (
        ("run", "send the conformance suite to one provider deployment and store its results"),
        ("show", "print one provider deployment's stored conformance results"),
    ):
        p = cnf_sub.add_parser(
            name, help=what, description=what + " (docs/conformance.md).", formatter_class=_HelpFormatter
        )
        p.add_argument(
            "--deployment", required=True, help="a key of providers: in the config (default: none, required)"
        )
        p.add_argument("--config", help="the llm-router.yml (default: $TOLLWAY_CONFIG, else ./llm-router.yml)")
        p.add_argument(
            "--model",
            action="append",
            help="a physical model the deployment serves; repeat for more (default: every chat model it serves)",
        )
        p.add_argument(
            "--results",
            help="a directory or s3://bucket/prefix (default: conformance.results, else $TOLLWAY_CONFORMANCE_RESULTS, "
            "else .tollway/conformance beside the config)",
        )
        p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")

    p_pii = sub.add_parser("pii", help="PII tools: pii conformance")
    pii_sub = p_pii.add_subparsers(dest="pii_command", required=True)
    p_conf = pii_sub.add_parser(
        "conformance",
        help="measure how deployments keep PII placeholders over the preservation corpus",
        description="Send the preservation corpus through a gateway to each alias and write the rates of "
        "preserved, altered, omitted and hallucinated placeholders (docs/pii.md).",
        formatter_class=_HelpFormatter,
    )
    p_conf.add_argument(
        "--base-url",
        required=True,
        help="the gateway's OpenAI base URL, e.g. http://127.0.0.1:8080/v1 (default: none, required)",
    )
    p_conf.add_argument("--key", help="a Tollway key allowed on every alias (default: $TOLLWAY_KEY)")
    p_conf.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="ALIAS[=LABEL]",
        help="an alias with a PII profile; repeat for more. LABEL (e.g. a route id) keys its result instead "
        "(default: none, required)",
    )
    p_conf.add_argument("--out", help="write the results JSON here (default: stdout)")
    p_conf.add_argument("--corpus", help="a corpus file (default: the bundled preservation-v1)")
    p_conf.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    p_conf.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["export"], ["content"]):
        # Their own parsers (``tollway.export.commands``), on the stage's resources.
        from tollway.export.commands import content_main, export_main

        run = export_main if argv[0] == "export" else content_main
        if any(a in ("-h", "--help") for a in argv[1:]) or len(argv) == 1:
            return run(argv[1:], {})
        os.environ.update(cloud_environ())  # this process's AWS clients (credentials, endpoint) read it
        return run(argv[1:], os.environ)
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
        return config_validate(args.file, args.conformance)
    if args.command == "conformance":
        return conformance(args)
    if args.command == "pii":
        return pii_conformance(args)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
