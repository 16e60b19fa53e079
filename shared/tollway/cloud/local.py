"""The embedded local cloud: moto server on 127.0.0.1, unless an emulator is already reachable.

``AWS_ENDPOINT_URL`` pointing at a running LocalStack (or moto, or any emulator that answers)
wins: nothing is started and nothing is stopped. Otherwise moto server starts as a child
process on ``127.0.0.1:4566`` (the LocalStack edge port) or the port given, and
:meth:`LocalCloud.stop` ends it. The child runs in a process group of its own, so a Ctrl-C in
the terminal reaches only its parent, which stops it last (after the event-source runner that
still talks to it); it exits by itself when its parent is gone. No emulator here runs Lambda
code: the event-source runner (``tollway.cloud.runner``) plays that part.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from tollway.exceptions import TollwayError

__all__ = [
    "DEFAULT_PORT",
    "LOCAL_CREDENTIALS",
    "LocalCloud",
    "LocalCloudError",
    "free_port",
    "local_cloud",
    "reachable",
    "start_local_cloud",
]

DEFAULT_PORT: Final = 4566
LOCAL_REGION: Final = "us-east-1"
LOCAL_CREDENTIALS: Final[Mapping[str, str]] = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": LOCAL_REGION,
}
"""Dummy credentials: emulators accept any; real ones must never be sent to an emulator."""
_START_TIMEOUT_S: Final = 20.0


class LocalCloudError(TollwayError, RuntimeError):
    """The embedded emulator could not be started or did not become reachable in time."""


@dataclass
class LocalCloud:
    endpoint: str
    region: str = LOCAL_REGION
    proc: subprocess.Popen[bytes] | None = None
    """The moto server we started; ``None`` when an existing emulator is used."""
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def started_here(self) -> bool:
        return self.proc is not None

    def env(self) -> dict[str, str]:
        """Environment for a child process (or boto3) that talks to this cloud."""
        env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}
        for k, v in LOCAL_CREDENTIALS.items():
            env.setdefault(k, v)
        if not self.started_here:
            # An external emulator may be configured with its own keys; keep the caller's. It may
            # also be split by service (AWS_ENDPOINT_URL_DYNAMODB elsewhere); keep that too.
            for k, v in os.environ.items():
                if (k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") or k.startswith("AWS_ENDPOINT_URL_")) and v:
                    env[k] = v
        return env

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop moto server if we started it (SIGTERM, then SIGKILL); a no-op otherwise."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def reachable(endpoint: str, timeout_s: float = 1.0) -> bool:
    """True when something answers HTTP at ``endpoint`` (any status: emulators differ)."""
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/", timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def start_local_cloud(port: int | None = DEFAULT_PORT, *, log_path: Path | None = None) -> LocalCloud:
    """Use ``$AWS_ENDPOINT_URL`` when it answers; otherwise start moto server on 127.0.0.1.

    ``port=0`` or ``None`` picks a free port (tests). A busy port that is not an emulator the
    caller pointed us at is an error, not a silent reuse.
    """
    external = os.environ.get("AWS_ENDPOINT_URL", "").strip()
    if external:
        if not reachable(external):
            raise LocalCloudError(f"AWS_ENDPOINT_URL={external} does not answer; start it or unset the variable")
        return LocalCloud(endpoint=external.rstrip("/"), region=os.environ.get("AWS_DEFAULT_REGION", LOCAL_REGION))
    host = "127.0.0.1"
    port = port or free_port(host)
    if _port_in_use(host, port):
        raise LocalCloudError(
            f"{host}:{port} is already in use; set AWS_ENDPOINT_URL=http://{host}:{port} if it is a local cloud"
        )
    endpoint = f"http://{host}:{port}"
    log: IO[bytes] | None = log_path.open("ab") if log_path is not None else None
    env = {**os.environ, **LOCAL_CREDENTIALS}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tollway.cloud.moto_server",
            "--parent",
            str(os.getpid()),
            "--host",
            host,
            "--port",
            str(port),
        ],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        process_group=0,
    )
    cloud = LocalCloud(endpoint=endpoint, proc=proc, log_path=log_path, _log=log)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not reachable(endpoint, timeout_s=0.5):
        if proc.poll() is not None:
            cloud.stop()
            where = f"; see {log_path}" if log_path else ""
            raise LocalCloudError(f"moto server exited with {proc.returncode} during start{where}")
        if time.monotonic() > deadline:
            cloud.stop()
            raise LocalCloudError(f"moto server did not answer on {endpoint} within {_START_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return cloud


@contextlib.contextmanager
def local_cloud(port: int | None = DEFAULT_PORT, *, log_path: Path | None = None) -> Iterator[LocalCloud]:
    cloud = start_local_cloud(port, log_path=log_path)
    try:
        yield cloud
    finally:
        cloud.stop()
