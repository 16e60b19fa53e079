"""Server mode's out-of-process audit shipper against a real WAL and a real SQS queue on moto.

It ships what the workers appended; it skips a directory another shipper holds; it adopts a WAL
directory that no worker writes any more, ships it and deletes it; it exits, after a last drain,
when the gateway that started it is gone or when told to stop. It ships from a SCHED_IDLE thread,
or with ``--no-idle`` from its main thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml

from tests.support.threads import idle_threads
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
    writer = _open_writer(spool / "worker-0")
    _append(writer, [f"req_{i}" for i in range(20)])
    writer.close()
    yield spool / "worker-0", config, {**os.environ, **cloud.env()}


def _open_writer(directory: Path) -> WalWriter:
    writer = WalWriter(directory, instance_id="ship-test", limits=LIMITS, durable=True)
    writer.open()
    return writer


def _append(writer: WalWriter, request_ids: list[str]) -> None:
    for request_id in request_ids:
        ev = events.request_admitted(
            request_id=request_id,
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


def _acked(directory: Path) -> int:
    return WalReader(directory).acked


def _wait(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _ship(config: Path, env: dict[str, str], parent: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tollway.audit.ship.process", "--config", str(config), "--parent", str(parent), *extra],
        env=env,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def _killed_at_exit(*processes: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever the test asserts, no process of it outlives it."""
    try:
        yield
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(5)


def _queued_request_ids(cloud: LocalCloud, queue_name: str) -> list[str]:
    """Every ``requestId`` in the messages on the queue (received and deleted)."""
    sqs = boto3.client("sqs", endpoint_url=cloud.endpoint, region_name=cloud.region, **_keys(cloud))
    url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
    found: list[str] = []
    while True:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not messages:
            return found
        for message in messages:
            found += [e["requestId"] for e in json.loads(message["Body"])["events"]]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def _keys(cloud: LocalCloud) -> dict[str, str]:
    env = cloud.env()
    return {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"]}


def test_ships_everything_and_exits_when_its_gateway_is_gone(setup: tuple[Path, Path, dict[str, str]]) -> None:
    directory, config, env = setup
    gateway = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    shipper = _ship(config, env, gateway.pid)
    with _killed_at_exit(gateway, shipper):
        assert _wait(lambda: _acked(directory) == 20), "the ship process did not acknowledge the WAL"
        assert shipper.poll() is None
        # Background work: it yields the cores to the gateway's workers (niceness 10 above ours),
        # and ships from a thread at SCHED_IDLE; its main thread keeps the niceness to take over.
        assert os.getpriority(os.PRIO_PROCESS, shipper.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        if sys.platform.startswith("linux"):
            idle = idle_threads(shipper.pid)
            assert len(idle) == 1 and shipper.pid not in idle, f"SCHED_IDLE threads: {idle}"
        gateway.kill()
        gateway.wait(5)
        assert shipper.wait(15) == 0


def test_skips_a_directory_another_shipper_holds(setup: tuple[Path, Path, dict[str, str]]) -> None:
    directory, config, env = setup
    with (directory / "ship.lock").open("ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shipper = _ship(config, env, os.getpid())
        with _killed_at_exit(shipper):
            time.sleep(1.5)
            assert _acked(directory) == 0, "a second shipper interleaved with the lock holder"
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert _wait(lambda: _acked(directory) == 20)
            shipper.terminate()
            assert shipper.wait(15) == 0


def test_adopts_a_directory_no_worker_writes_ships_it_and_deletes_it(
    setup: tuple[Path, Path, dict[str, str]], cloud: LocalCloud, prefix: str
) -> None:
    directory, config, env = setup
    leftover = directory.parent / "worker-3"  # a worker index this one-worker gateway no longer starts
    writer = _open_writer(leftover)
    _append(writer, [f"left_{i}" for i in range(7)])
    shipper = _ship(
        config,
        env,
        os.getpid(),
        "--no-idle",
        "--orphan-idle-s",
        "0",
        "--orphan-retire-s",
        "0",
        "--orphan-scan-s",
        "0.2",
    )
    try:
        with _killed_at_exit(shipper):
            assert _wait(lambda: _acked(directory) == 20)
            if sys.platform.startswith("linux"):
                assert idle_threads(shipper.pid) == [], "--no-idle still started a SCHED_IDLE thread"
            time.sleep(1.0)
            assert leftover.is_dir() and _acked(leftover) == 0, "a directory with a live writer was adopted"
            writer.close()
            assert _wait(lambda: not leftover.exists(), timeout_s=15), "the orphan was not adopted and retired"
            shipper.terminate()
            assert shipper.wait(15) == 0
    finally:
        writer.close()
    shipped = _queued_request_ids(cloud, topology(prefix).queue("audit").name)
    assert sorted(set(shipped)) == sorted({f"req_{i}" for i in range(20)} | {f"left_{i}" for i in range(7)})


def test_a_backlog_beyond_one_pass_drains_without_waiting_out_the_interval(
    setup: tuple[Path, Path, dict[str, str]], cloud: LocalCloud, prefix: str
) -> None:
    directory, config, env = setup
    # One record a read and 64 reads a pass: the 200 records need four passes. With a minute's
    # flush interval between passes, only the first pass could run within the test's wait.
    settings = yaml.safe_load(config.read_text())
    settings["audit"]["sink"].update(batchSize=1, flushIntervalMs=60000)
    config.write_text(yaml.safe_dump(settings))
    writer = _open_writer(directory)
    _append(writer, [f"more_{i}" for i in range(180)])
    writer.close()
    shipper = _ship(config, env, os.getpid())
    with _killed_at_exit(shipper):
        assert _wait(lambda: _acked(directory) == 200, timeout_s=30), f"acknowledged {_acked(directory)} of 200"
        shipper.terminate()
        assert shipper.wait(15) == 0
    shipped = _queued_request_ids(cloud, topology(prefix).queue("audit").name)
    assert sorted(shipped) == sorted([f"req_{i}" for i in range(20)] + [f"more_{i}" for i in range(180)])
