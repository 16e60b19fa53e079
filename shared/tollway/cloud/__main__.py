"""``python -m tollway.cloud {up,bootstrap,describe}``: the local cloud from the command line.

- ``up`` starts the local cloud (moto server on 127.0.0.1, or the emulator ``$AWS_ENDPOINT_URL``
  points at), bootstraps the topology, runs the event-source runner until Ctrl-C, SIGTERM or the
  end of ``--parent``, then stops in order: the runner takes what is still on its queues (at most
  :data:`RUNNER_DRAIN_S`) and finishes its batches, and only then does the moto server it started
  stop, reporting what its in-memory state held.
- ``bootstrap`` and ``describe`` work on a running endpoint (``--endpoint``, else
  ``$AWS_ENDPOINT_URL``, else ``http://127.0.0.1:4566``); ``describe`` prints JSON.

Secret values never come from the command line (it is visible to other users in ``ps``):
``--secret openai=TOLLWAY_MOCK_PROVIDER_KEY`` names the environment variable that holds one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from tollway.cloud.bootstrap import BootstrapError, Clients, bootstrap, describe
from tollway.cloud.local import DEFAULT_PORT, LOCAL_REGION, LocalCloud, LocalCloudError, start_local_cloud
from tollway.cloud.resources import DEFAULT_PREFIX, Topology, topology
from tollway.cloud.runner import EventSourceRunner, RunnerError

log = logging.getLogger("tollway.cloud")

_LOG_FILE: Final = Path(".tollway") / "local-cloud.log"
_HEALTH_CHECK_S: Final = 1.0
RUNNER_DRAIN_S: Final = 10.0
"""How long a stopping runner keeps taking what is on its queues."""
RUNNER_STOP_S: Final = 10.0
"""How long, after that, the batches in hand get to finish."""


def _secrets(pairs: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, env_name = pair.partition("=")
        if not sep or not key or not env_name:
            parser.error(f"--secret takes KEY=ENV_VAR, got {pair!r}")
        value = os.environ.get(env_name)
        if not value:
            parser.error(f"environment variable {env_name} (for secret {key}) is not set or empty")
        values[key] = value
    return values


def _export_function_environment(topo: Topology, env: Mapping[str, str], account: str, region: str) -> None:
    """Give in-process handlers the environment their Lambda would have (one process: one union)."""
    os.environ.update(env)
    os.environ.update(topo.environment(account, region))
    for fn in topo.functions:
        for key, value in fn.environment:
            if os.environ.get(key, value) != value:
                log.warning(
                    "function %s wants %s set differently from another function; keeping the first", fn.name, key
                )
            os.environ.setdefault(key, value)


def _held(topo: Topology, cloud: LocalCloud) -> str:
    """What the cloud's tables and queues hold, as one phrase (its state is lost when moto stops)."""
    clients = Clients(cloud.endpoint, cloud.region, cloud.env())
    dynamodb, sqs = clients.client("dynamodb"), clients.client("sqs")
    parts = []
    try:
        for t in topo.tables:
            if items := int(dynamodb.describe_table(TableName=t.name)["Table"].get("ItemCount", 0)):
                parts.append(f"{t.name} {items} item(s)")
        for q in topo.queues:
            for name in (q.name, q.dlq_name):
                url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
                attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                if messages := int(attrs["Attributes"].get("ApproximateNumberOfMessages", "0")):
                    parts.append(f"{name} {messages} message(s)")
    except Exception as exc:  # a summary, never a reason to fail the stop
        parts.append(f"the rest unknown ({type(exc).__name__})")
    return ", ".join(parts) or "nothing"


def _up(args: argparse.Namespace, topo: Topology, secrets: Mapping[str, str]) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    _LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    cloud = start_local_cloud(args.port, log_path=_LOG_FILE)
    runner: EventSourceRunner | None = None
    try:
        env = cloud.env()
        report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, secrets=secrets, env=env)
        print(report.summary(), flush=True)
        _export_function_environment(topo, env, report.account, cloud.region)
        runner = EventSourceRunner(topo, endpoint=cloud.endpoint, region=cloud.region, env=env)
        runner.start()
        where = "moto server (started here)" if cloud.started_here else "the emulator at AWS_ENDPOINT_URL"
        print(
            f"Tollway local cloud is up on {cloud.endpoint}, {where}: {len(runner.mappings)} queue mapping(s),"
            f" {len(runner.schedules)} schedule(s). Press Ctrl-C to stop.",
            flush=True,
        )
        while not stop.wait(_HEALTH_CHECK_S):
            if cloud.proc is not None and cloud.proc.poll() is not None:
                print(f"moto server exited with {cloud.proc.returncode}; see {_LOG_FILE}", file=sys.stderr)
                return 1
            if args.parent is not None and os.getppid() != args.parent:
                log.info("the process that started the local cloud (%d) is gone; stopping", args.parent)
                break
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stop below is bounded; a second Ctrl-C must not cut it
        if runner is not None:
            runner.stop(RUNNER_STOP_S, drain_s=RUNNER_DRAIN_S)
        if cloud.started_here and cloud.proc is not None and cloud.proc.poll() is None:
            held = _held(topo, cloud)
            cloud.stop()
            print(f"Tollway local cloud stopped. Its in-memory state is gone: {held}.", flush=True)
        else:
            cloud.stop()
            print("Tollway local cloud stopped.", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tollway.cloud", description="Tollway's local cloud: up, bootstrap, describe."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"stage prefix of every name (default: {DEFAULT_PREFIX})"
    )
    common.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    with_secrets = argparse.ArgumentParser(add_help=False)
    with_secrets.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="KEY=ENV_VAR",
        help="store secret KEY (openai, anthropic) with the value of ENV_VAR; repeatable",
    )
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--endpoint", help="default: $AWS_ENDPOINT_URL, else http://127.0.0.1:4566")
    remote.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION") or LOCAL_REGION)
    up = sub.add_parser("up", parents=[common, with_secrets], help="start, bootstrap and run until Ctrl-C")
    up.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"moto server port; 0 picks one (default: {DEFAULT_PORT})"
    )
    up.add_argument(
        "--parent",
        type=int,
        metavar="PID",
        help="the process that started this one: stop when it is gone (default: run until stopped)",
    )
    sub.add_parser(
        "bootstrap", parents=[common, with_secrets, remote], help="create the resources on a running endpoint"
    )
    sub.add_parser("describe", parents=[common, remote], help="print the resources' actual state as JSON")
    args = parser.parse_args(argv)
    from tollway.telemetry.logs import configure_logging, env_log_format

    configure_logging(args.log_level, fmt=env_log_format())  # JSON lines on stderr, as the gateway writes them
    try:
        topo = topology(args.prefix)
    except ValueError as exc:
        parser.error(str(exc))
    secrets = _secrets(getattr(args, "secret", []), parser)
    try:
        if args.command == "up":
            return _up(args, topo, secrets)
        endpoint = args.endpoint or os.environ.get("AWS_ENDPOINT_URL", "").strip() or f"http://127.0.0.1:{DEFAULT_PORT}"
        if args.command == "bootstrap":
            print(bootstrap(topo, endpoint=endpoint, region=args.region, secrets=secrets, env=os.environ).summary())
        else:
            print(json.dumps(describe(topo, endpoint=endpoint, region=args.region, env=os.environ), indent=2))
        return 0
    except (BootstrapError, RunnerError, LocalCloudError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
