"""Server mode's out-of-process audit shipper against a real WAL and a real SQS queue on moto.

It ships what the workers appended; it skips a directory another shipper holds; it exits, after
a last drain, when the gateway that started it is gone or when told to stop.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tollway.audit import events
from tollway.audit.wal import WalLimits, WalReader, WalWriter
from tollway.cloud.bootstrap import bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

LIMITS = WalLimits(
    max_bytes=4 << 20,
    segment_bytes=1 << 20,
    max_record_bytes=64 << 10,
    max_batch_records=64,
    max_batch_bytes=1 << 20,
    max_commit_delay_s=0.001,
    commit_timeout_s=2.0,
)


@pytest.fixture
def setup(cloud: LocalCloud, prefix: str, tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    topo = topology(prefix)
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    spool = tmp_path / "spool"
    config = tmp_path / "llm-router.yml"
    config.write_text(
        yaml.safe_dump(
            {"audit": {"spool": {"path": str(spool)}, "sink": {"type": "sqs", "queueName": topo.queue("audit").name}}}
        )
    )
    writer = WalWriter(spool / "worker-0", instance_id="ship-test", limits=LIMITS, durable=True)
    writer.open()
    for i in range(20):
        ev = events.request_admitted(
            request_id=f"req_{i}",
            root_digest="d" * 64,
            principal_id="p",
            tenant="t",
            team=None,
            key_id="k",
            alias="a",
            stream=False,
            content_mode="metadata-only",
            max_attempts=1,
        )
        writer.append(ev.encode())
    writer.close()
    yield spool / "worker-0", config, {**os.environ, **cloud.env()}


def _acked(directory: Path) -> int:
    return WalReader(directory).acked


def _wait(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _ship(config: Path, env: dict[str, str], parent: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tollway.audit.ship_process", "--config", str(config), "--parent", str(parent)],
        env=env,
        stderr=subprocess.DEVNULL,
    )


def test_ships_everything_and_exits_when_its_gateway_is_gone(setup: tuple[Path, Path, dict[str, str]]) -> None:
    directory, config, env = setup
    gateway = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    shipper = _ship(config, env, gateway.pid)
    try:
        assert _wait(lambda: _acked(directory) == 20), "the ship process did not acknowledge the WAL"
        assert shipper.poll() is None
        # Background work: it yields the cores to the gateway's workers (niceness 10 above ours).
        assert os.getpriority(os.PRIO_PROCESS, shipper.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        gateway.kill()
        gateway.wait(5)
        assert shipper.wait(15) == 0
    finally:
        for p in (gateway, shipper):
            if p.poll() is None:
                p.kill()
                p.wait(5)


def test_skips_a_directory_another_shipper_holds(setup: tuple[Path, Path, dict[str, str]]) -> None:
    directory, config, env = setup
    with (directory / "ship.lock").open("ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shipper = _ship(config, env, os.getpid())
        try:
            time.sleep(1.5)
            assert _acked(directory) == 0, "a second shipper interleaved with the lock holder"
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert _wait(lambda: _acked(directory) == 20)
            shipper.terminate()
            assert shipper.wait(15) == 0
        finally:
            if shipper.poll() is None:
                shipper.kill()
                shipper.wait(5)
