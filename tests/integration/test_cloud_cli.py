"""``python -m tollway.cloud`` and the LocalStack ready.d hook, run as a user runs them."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import boto3
import httpx
import pytest

from tollway.cloud.bootstrap import Clients, describe, expected_state
from tollway.cloud.local import LocalCloud, free_port
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "localstack" / "init" / "ready.d" / "10-tollway-bootstrap.sh"
SECRET = "sk-from-the-environment-only"


def cli_env(cloud: LocalCloud, **extra: str) -> dict[str, str]:
    return {**os.environ, **cloud.env(), **extra}


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_bootstrap_then_describe_commands(cloud: LocalCloud, prefix: str) -> None:
    env = cli_env(cloud, TW_TEST_SECRET=SECRET)
    common = ["--endpoint", cloud.endpoint, "--region", cloud.region, "--prefix", prefix]

    done = run([sys.executable, "-m", "tollway.cloud", "bootstrap", *common, "--secret", "openai=TW_TEST_SECRET"], env)

    assert done.returncode == 0, done.stderr
    assert f"{prefix}-audit-events" in done.stdout and "created" in done.stdout
    assert SECRET not in done.stdout + done.stderr
    shown = run([sys.executable, "-m", "tollway.cloud", "describe", *common], env)
    assert shown.returncode == 0, shown.stderr
    account = describe_account(cloud, prefix)
    assert json.loads(shown.stdout) == expected_state(
        topology(prefix), account=account, region=cloud.region, secrets={"openai"}
    )


def describe_account(cloud: LocalCloud, prefix: str) -> str:
    state = describe(topology(prefix), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    bucket = state["buckets"]["config"]["name"]
    match = re.fullmatch(rf"{prefix}-config-(\d+)-{cloud.region}", bucket)
    assert match, bucket
    return match.group(1)


def test_a_secret_must_come_from_a_set_environment_variable(cloud: LocalCloud, prefix: str) -> None:
    env = cli_env(cloud)
    env.pop("TW_UNSET_VARIABLE", None)
    args = [sys.executable, "-m", "tollway.cloud", "bootstrap", "--endpoint", cloud.endpoint, "--prefix", prefix]

    done = run([*args, "--secret", "openai=TW_UNSET_VARIABLE"], env)

    assert done.returncode == 2
    assert "TW_UNSET_VARIABLE" in done.stderr
    assert describe(topology(prefix), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())["queues"] == {
        "audit": None,
        "usage": None,
        "exports": None,
    }


def test_the_localstack_ready_hook_runs_the_same_bootstrap(cloud: LocalCloud, prefix: str) -> None:
    env = cli_env(
        cloud,
        TOLLWAY_SHARED=str(ROOT / "shared"),
        TOLLWAY_PYTHON=sys.executable,
        TOLLWAY_STAGE=prefix,
        TOLLWAY_LOCALSTACK_ENDPOINT=cloud.endpoint,
        TOLLWAY_BOOTSTRAP_ARGS="--secret anthropic=TW_TEST_SECRET",
        TW_TEST_SECRET=SECRET,
    )

    done = run(["sh", str(HOOK)], env)

    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    state = describe(topology(prefix), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    account = describe_account(cloud, prefix)
    assert state == expected_state(topology(prefix), account=account, region=cloud.region, secrets={"anthropic"})


def test_the_hook_says_where_the_code_is_missing(tmp_path: Path) -> None:
    done = run(["sh", str(HOOK)], {**os.environ, "TOLLWAY_SHARED": str(tmp_path)})
    assert done.returncode == 1
    assert str(tmp_path) in done.stderr


def _lines(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_up_bootstraps_runs_and_stops_cleanly_on_ctrl_c(tmp_path: Path, prefix: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.cloud", "up", "--prefix", prefix, "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while not any("is up on" in line for line in seen) and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)
        assert any(f"is up on http://127.0.0.1:{port}" in line for line in seen), "".join(seen)
        endpoint = f"http://127.0.0.1:{port}"
        state = describe(topology(prefix), endpoint=endpoint, region="us-east-1")
        assert all(q is not None for q in state["queues"].values())
        assert (tmp_path / ".tollway" / "local-cloud.log").exists()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)
        assert proc.stdout is not None
        proc.stdout.close()
    tail = []
    while not lines.empty():
        tail.append(lines.get())
    assert "Tollway local cloud stopped." in "".join(tail)
    assert not _port_open(port), "moto server still running after up exited"


# ---------------------------------------------------------------- tollway up: the order of its stop

_TEST_KEYS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
_STOP_NOISE = re.compile(r"lease give-back|ERROR|Traceback|polling failed|EndpointConnectionError")
"""What ``up``'s output showed when Ctrl-C stopped moto first."""


@dataclass
class Up:
    """A ``tollway up`` process leading a process group of its own, as a terminal's foreground job."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    seen: list[str]
    stderr: Path

    @classmethod
    def start(cls, cwd: Path, env: dict[str, str], *args: str) -> Up:
        stderr = cwd / "up.stderr"
        with stderr.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tollway.cli", "up", "--port", "0", "--mock-port", "0", *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        assert proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_lines_then_close, args=(proc.stdout, lines), daemon=True).start()
        return cls(proc, lines, [], stderr)

    def banner(self, timeout_s: float = 60) -> dict[str, str]:
        """The banner's ``  name : value`` lines, once ``up`` is ready."""
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith("Press Ctrl-C") for line in self.seen):
            assert time.monotonic() < deadline, self.output()
            try:
                self.seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                assert self.proc.poll() is None, self.output()
        pairs = (line.partition(" : ") for line in self.seen)
        return {name.strip(): value.strip() for name, sep, value in pairs if sep and name.startswith("  ")}

    def ctrl_c(self, timeout_s: float = 60) -> int:
        """SIGINT to the whole process group, as a terminal sends Ctrl-C to its foreground job."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        """Everything ``up`` printed, stdout then stderr."""
        if self.proc.poll() is not None:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    self.seen.append(self.lines.get(timeout=0.2))
                except queue.Empty:
                    break
        return "".join(self.seen) + self.stderr.read_text()


def _lines_then_close(stream: IO[str], out: queue.Queue[str]) -> None:
    with stream:
        _lines(stream, out)


def _port(url: str) -> int:
    return int(urllib.parse.urlsplit(url).port or 0)


def _chat(base: str, key: str) -> str:
    resp = httpx.post(
        base + "/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "chat-fast-v1", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    return str(resp.headers["x-request-id"])


def _healthy(base: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base.removesuffix("/v1") + "/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"{base} never became healthy")


def _up_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOLLWAY_"))}
    return {**env, "TOLLWAY_DEMO_KEY": "tw-demo-" + uuid.uuid4().hex, **extra}


def _audit(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "tollway.cli", "audit", *args], env, cwd)


def _complete(request_id: str, env: dict[str, str], cwd: Path, timeout_s: float = 30) -> bool:
    """Whether the request's audit record becomes complete (every event stored) within the time."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = _audit(env, cwd, "show", request_id, "--json")
        if shown.returncode == 0 and json.loads(shown.stdout)["incomplete"] is False:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def test_ctrl_c_stops_the_gateway_then_the_shipper_then_the_runner_then_moto(tmp_path: Path, prefix: str) -> None:
    up = Up.start(tmp_path, _up_env(), "--cloud-port", "0", "--stage", prefix)
    try:
        banner = up.banner()
        base, key, endpoint = banner["base URL"], banner["demo key"], banner["cloud"].split()[0]
        _healthy(base)
        first = _chat(base, key)
        # The banner's hint works as printed, from this directory: `tollway audit` finds up's cloud.
        assert "audit list --since 10m" in banner["cloud"]
        bare = _up_env()
        assert _complete(first, bare, tmp_path), up.output()
        assert first in _audit(bare, tmp_path, "list", "--since", "10m").stdout
        dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1", **_TEST_KEYS)
        per_request = dynamodb.describe_table(TableName=f"{prefix}-audit")["Table"]["ItemCount"]
        # This request's events are still in the WAL or on a queue when Ctrl-C comes.
        _chat(base, key)
        status = up.ctrl_c()
    finally:
        up.kill()
    out = up.output()
    assert status == 0, out
    assert not _STOP_NOISE.search(out), out
    for fn, q in (("audit-writer", "audit-events"), ("usage-reconciler", "usage-events")):
        summary = rf"{prefix}-{fn}<-{prefix}-{q}: [1-9]\d* handled, 0 retried, 0 redriven, 0 left on the queue"
        assert re.search(summary, out), out
    # What moto held when it stopped, after the runner: both requests' audit items, nothing queued.
    held = re.search(r"^Tollway local cloud stopped\. Its in-memory state is gone: (.*)\.$", out, re.M)
    assert held is not None, out
    assert f"{prefix}-audit {2 * per_request} item(s)" in held.group(1), out
    assert "message(s)" not in held.group(1), out
    assert not (tmp_path / ".tollway" / "up.json").exists()
    assert not _port_open(_port(base)) and not _port_open(_port(endpoint))


def test_a_request_in_flight_at_ctrl_c_reaches_the_audit_store_and_the_usage_ledger(
    cloud: LocalCloud, tmp_path: Path, prefix: str
) -> None:
    """On an emulator that ``up`` did not start, and so does not stop, the stores are read afterwards."""
    up = Up.start(tmp_path, _up_env(**cloud.env()), "--stage", prefix)
    try:
        banner = up.banner()
        _healthy(banner["base URL"])
        request_id = _chat(banner["base URL"], banner["demo key"])
        status = up.ctrl_c()
    finally:
        up.kill()
    out = up.output()
    assert status == 0, out
    assert not _STOP_NOISE.search(out), out
    assert _complete(request_id, {**cli_env(cloud), "TOLLWAY_STAGE": prefix}, tmp_path, timeout_s=0), out
    dynamodb = Clients(cloud.endpoint, cloud.region, cloud.env()).client("dynamodb")
    key = {"pk": {"S": f"req#{urllib.parse.quote(request_id, safe='')}"}, "sk": {"S": "usage"}}
    assert "Item" in dynamodb.get_item(TableName=f"{prefix}-usage-ledger", Key=key), out


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, whatever its process group (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_up_leaves_no_process_behind(tmp_path: Path, prefix: str) -> None:
    up = Up.start(tmp_path, _up_env(), "--cloud-port", "0", "--stage", prefix)
    try:
        banner = up.banner()
        endpoint = banner["cloud"].split()[0]
        # The mock, the local cloud and its moto server, and the audit shipper (started last).
        deadline = time.monotonic() + 20
        while len(below := _descendants(up.proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(below) >= 4, below
        up.proc.kill()
        up.proc.wait(10)
        deadline = time.monotonic() + 20
        while any(_running(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in below if _running(p)]
        assert not _port_open(_port(endpoint))
    finally:
        up.kill()
