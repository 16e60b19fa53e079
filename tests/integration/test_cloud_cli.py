"""``python -m tollway.cloud`` and the LocalStack ready.d hook, run as a user runs them."""

from __future__ import annotations

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
from pathlib import Path
from typing import IO

import pytest

from tollway.cloud.bootstrap import describe, expected_state
from tollway.cloud.local import LocalCloud, free_port
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "localstack" / "init" / "ready.d" / "10-tollway-bootstrap.sh"
SECRET = "sk-from-the-environment-only"


def cli_env(cloud: LocalCloud, **extra: str) -> dict[str, str]:
    return {**os.environ, **cloud.env(), **extra}


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


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
