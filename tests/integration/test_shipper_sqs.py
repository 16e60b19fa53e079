"""A real WAL shipped into a real SQS queue on the local cloud: by the server-mode task, and by the Lambda extension.

The extension runs as its own process, exactly as Lambda starts it (the layer's executable),
against a local stand-in for the Lambda Extensions API: an HTTP server on 127.0.0.1 that speaks
the same paths and headers and hands out INVOKE and SHUTDOWN events when the test says so.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.audit_events import request_events
from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import SqsSink
from tollway.audit.wal import WalLimits, WalReader, WalWriter
from tollway.audit.wal.dirs import lambda_directory_name
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology

pytestmark = pytest.mark.local_cloud

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "layers" / "extension" / "extensions" / "tollway-wal-shipper"
LIMITS = WalLimits(max_bytes=8 << 20, segment_bytes=256 << 10, max_record_bytes=64 << 10)


def interleaved(prefix: str, requests: int) -> list[bytes]:
    """Several requests' events interleaved round-robin, as concurrent requests append them."""
    per_request = [request_events(f"{prefix}-{i}", 1 + i % 3) for i in range(requests)]
    return [e for group in itertools.zip_longest(*per_request) for e in group if e is not None]


def event_id(payload: bytes) -> str:
    eid: str = json.loads(payload)["eventId"]
    return eid


def open_writer(directory: Path) -> WalWriter:
    writer = WalWriter(directory, instance_id="it-shipper", limits=LIMITS, durable=False)
    writer.open()
    return writer


def append_written(writer: WalWriter, payloads: list[bytes]) -> int:
    """Append and wait (bounded) until the writer has handed every record to the OS; the last sequence."""
    seq = 0
    for payload in payloads:
        seq = writer.append(payload)
    deadline = time.monotonic() + 10
    while writer.durable_watermark < seq:
        assert time.monotonic() < deadline, "the WAL writer did not write within 10 s"
        time.sleep(0.005)
    return seq


def sqs_client(cloud: LocalCloud) -> Any:
    env = cloud.env()
    return boto3.client(
        "sqs",
        endpoint_url=cloud.endpoint,
        region_name=cloud.region,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def create_queue(cloud: LocalCloud, prefix: str) -> tuple[str, str]:
    name = topology(prefix).queue("audit").name
    url: str = sqs_client(cloud).create_queue(QueueName=name)["QueueUrl"]
    return name, url


def receive_all(cloud: LocalCloud, url: str, expected_events: int, timeout_s: float = 20) -> list[list[dict[str, Any]]]:
    """Every message's events, until ``expected_events`` arrived and one more receive comes back empty."""
    sqs = sqs_client(cloud)
    messages: list[list[dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        for message in got:
            body = message["Body"]
            assert len(body.encode()) <= 200 * 1024
            doc = json.loads(body)
            assert doc["v"] == 1
            assert 1 <= len(doc["events"]) <= 64
            messages.append(doc["events"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        if not got and sum(len(m) for m in messages) >= expected_events:
            return messages
    raise AssertionError(f"received {sum(len(m) for m in messages)} of {expected_events} events in {timeout_s} s")


def assert_shipped_exactly(messages: list[list[dict[str, Any]]], payloads: list[bytes]) -> None:
    """Each event arrived once, and each message is a contiguous, in-order run of the WAL.

    SQS standard queues do not promise delivery order, so messages are put back in WAL order by
    their first event; what the shipper controls (order inside and between its messages) must
    then reproduce the appended sequence exactly, and so every request's events in order.
    """
    position = {event_id(p): i for i, p in enumerate(payloads)}
    received = [e["eventId"] for m in messages for e in m]
    assert len(received) == len(set(received)), "an event arrived twice"
    assert set(received) == set(position), "events are missing or foreign"
    runs = sorted(([position[e["eventId"]] for e in m] for m in messages), key=lambda run: run[0])
    assert [i for run in runs for i in run] == list(range(len(payloads)))
    for m in messages:
        for e in m:
            assert json.loads(payloads[position[e["eventId"]]]) == e


async def test_server_mode_ships_a_live_wal_into_sqs_once_and_in_order(
    cloud: LocalCloud, prefix: str, tmp_path: Path
) -> None:
    name, url = create_queue(cloud, prefix)
    writer = open_writer(tmp_path / "wal" / "worker-0")
    reader = WalReader(tmp_path / "wal" / "worker-0")
    sink = SqsSink(name, cloud.endpoint, cloud.region, cloud.env())
    shipper = Shipper(reader, sink, batch_records=100, batch_bytes=1 << 20, idle_s=0.02, max_backoff_s=1.0)
    stop = asyncio.Event()
    task = asyncio.create_task(shipper.run(stop))
    payloads: list[bytes] = []
    try:
        for wave in range(4):
            batch = interleaved(f"{prefix}-w{wave}", 40)
            payloads += batch
            for payload in batch:
                writer.append(payload)
            await asyncio.sleep(0.05)
        last = writer.appended
        for _ in range(600):
            if shipper.stats()["acked"] == last:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await asyncio.to_thread(writer.close)
    stats = shipper.stats()
    assert stats["acked"] == last == len(payloads)
    assert stats["shipped_records"] == len(payloads)
    assert stats["failures"] == 0
    assert WalReader(tmp_path / "wal" / "worker-0").acked == last
    messages = await asyncio.to_thread(receive_all, cloud, url, len(payloads))
    assert len(messages) == stats["shipped_messages"]
    assert_shipped_exactly(messages, payloads)


async def test_a_missing_queue_keeps_records_in_the_wal_until_it_exists(
    cloud: LocalCloud, prefix: str, tmp_path: Path
) -> None:
    name = topology(prefix).queue("audit").name
    directory = tmp_path / "wal" / "worker-0"
    writer = open_writer(directory)
    try:
        payloads = interleaved(prefix, 10)
        last = append_written(writer, payloads)
        shipper = Shipper(
            WalReader(directory),
            SqsSink(name, cloud.endpoint, cloud.region, cloud.env()),
            batch_records=64,
            batch_bytes=1 << 20,
            idle_s=0.02,
            max_backoff_s=0.2,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(shipper.run(stop))
        for _ in range(200):
            if shipper.stats()["failures"] >= 2:
                break
            await asyncio.sleep(0.05)
        assert shipper.stats()["failures"] >= 2
        assert WalReader(directory).acked == 0
        _, url = create_queue(cloud, prefix)
        for _ in range(200):
            if shipper.stats()["acked"] == last:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        await asyncio.to_thread(writer.close)
    assert shipper.stats()["acked"] == last
    assert shipper.stats()["backoff_s"] == 0.0
    messages = await asyncio.to_thread(receive_all, cloud, url, len(payloads))
    assert_shipped_exactly(messages, payloads)


class _ExtensionsHandler(BaseHTTPRequestHandler):
    """The API's three paths, as Lambda serves them to an external extension."""

    server: _ExtensionsServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        doc: dict[str, Any] = json.loads(raw) if raw else {}
        return doc

    def _identified(self) -> bool:
        api = self.server.api
        if self.headers.get("Lambda-Extension-Identifier") != api.identifier:
            api.problems.append(f"{self.path} without the extension identifier")
            self._json(403, {"errorType": "Extension.Forbidden"})
            return False
        return True

    def do_POST(self) -> None:
        api = self.server.api
        if self.path == "/2020-01-01/extension/register":
            name = self.headers.get("Lambda-Extension-Name")
            if name != api.NAME:
                api.problems.append(f"registered as {name!r}")
            api.registered.append(self._body())
            body = {"functionName": "tollway-gateway", "functionVersion": "$LATEST", "handler": "run.sh"}
            self._json(200, body, {"Lambda-Extension-Identifier": api.identifier})
        elif self.path == "/2020-01-01/extension/init/error":
            if self._identified():
                error_type = self.headers.get("Lambda-Extension-Function-Error-Type", "")
                api.init_errors.append((error_type, self._body()))
                self._json(202, {"status": "OK"})
        else:
            self._json(404, {"errorType": "NotFound"})

    def do_GET(self) -> None:
        api = self.server.api
        if self.path != "/2020-01-01/extension/event/next":
            self._json(404, {"errorType": "NotFound"})
            return
        if not self._identified():
            return
        event = api.next_event()
        if event is None:
            self._json(500, {"errorType": "Test.NoEvent"})
            return
        self._json(200, event, {"Lambda-Extension-Event-Identifier": str(uuid.uuid4())})


class _ExtensionsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeExtensionsApi) -> None:
        super().__init__(("127.0.0.1", 0), _ExtensionsHandler)
        self.api = api


class FakeExtensionsApi:
    """The Lambda Extensions API on 127.0.0.1: register, event/next (fed by :meth:`send`), init/error."""

    NAME = "tollway-wal-shipper"

    def __init__(self) -> None:
        self.identifier = str(uuid.uuid4())
        self.registered: list[dict[str, Any]] = []
        self.init_errors: list[tuple[str, dict[str, Any]]] = []
        self.next_calls = 0
        self.problems: list[str] = []
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cond = threading.Condition()
        self.server = _ExtensionsServer(self)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def next_event(self) -> dict[str, Any] | None:
        """Count the call, then hold it until the test sends an event (60 s at most, as a test bound)."""
        with self._cond:
            self.next_calls += 1
            self._cond.notify_all()
        try:
            return self._events.get(timeout=60)
        except queue.Empty:
            return None

    def wait_next_calls(self, n: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
        """Until the extension has asked for its ``n``-th event (so it finished handling the previous one)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.next_calls < n:
                assert proc.poll() is None, f"the extension exited with {proc.returncode}"
                left = deadline - time.monotonic()
                assert left > 0, f"the extension asked for {self.next_calls} events, not {n}, in {timeout_s} s"
                self._cond.wait(min(left, 0.1))

    def send(self, event_type: str, deadline_in_s: float) -> None:
        event: dict[str, Any] = {"eventType": event_type, "deadlineMs": int((time.time() + deadline_in_s) * 1000)}
        if event_type == "INVOKE":
            event.update(requestId=str(uuid.uuid4()), invokedFunctionArn="arn:aws:lambda:us-east-1:0:function:gw")
        else:
            event["shutdownReason"] = "spindown"
        self._events.put(event)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def extensions_api() -> Iterator[FakeExtensionsApi]:
    api = FakeExtensionsApi()
    yield api
    api.close()


def start_extension(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(LAUNCHER)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_the_layer_ships_its_extension_as_an_executable() -> None:
    assert LAUNCHER.is_file()
    assert os.access(LAUNCHER, os.X_OK)
    assert LAUNCHER.name == FakeExtensionsApi.NAME, "Lambda requires the registered name to be the file name"
    assert LAUNCHER.read_text().startswith("#!/usr/bin/env python3\n")


def test_the_extension_ships_after_each_invoke_and_drains_at_shutdown(
    cloud: LocalCloud, prefix: str, tmp_path: Path, extensions_api: FakeExtensionsApi
) -> None:
    name, url = create_queue(cloud, prefix)
    wal_base = tmp_path / "wal"
    scratch = tmp_path / "scratch"  # the execution environment's /tmp, shared by function and extension
    scratch.mkdir()
    directory = wal_base / lambda_directory_name(scratch)
    writer = open_writer(directory)
    # A reclaimed environment's WAL on the shared volume (EFS), with records it never shipped.
    gone = wal_base / ("env-" + uuid.uuid4().hex)
    gone_writer = open_writer(gone)
    orphaned = interleaved(f"{prefix}-gone", 3)
    append_written(gone_writer, orphaned)
    gone_writer.close()
    env = {
        **os.environ,
        **cloud.env(),
        "TMPDIR": str(scratch),
        "AWS_LAMBDA_RUNTIME_API": extensions_api.address,
        "TOLLWAY_AUDIT_WAL_DIR": str(wal_base),
        "TOLLWAY_QUEUE_AUDIT": name,
        "TOLLWAY_AUDIT_SINK": "sqs",
        "TOLLWAY_AUDIT_ORPHAN_IDLE_S": "0",
        "TOLLWAY_AUDIT_ORPHAN_RETIRE_S": "0",
    }
    log_path = tmp_path / "extension.log"
    proc = start_extension(env, log_path)
    try:
        extensions_api.wait_next_calls(1, proc)
        assert extensions_api.registered == [{"events": ["INVOKE", "SHUTDOWN"]}]

        first = interleaved(f"{prefix}-a", 6)
        append_written(writer, first)
        extensions_api.send("INVOKE", 30)
        extensions_api.wait_next_calls(2, proc)
        # No Telemetry API here, so the INVOKE drain also adopts the orphan, ships it and deletes it.
        assert_shipped_exactly(receive_all(cloud, url, len(first) + len(orphaned)), first + orphaned)
        assert not gone.exists()

        second = interleaved(f"{prefix}-b", 9)
        append_written(writer, second)
        extensions_api.send("INVOKE", 30)
        extensions_api.wait_next_calls(3, proc)
        assert_shipped_exactly(receive_all(cloud, url, len(second)), second)

        tail = interleaved(f"{prefix}-c", 4)
        last = append_written(writer, tail)
        extensions_api.send("SHUTDOWN", 2)
        assert proc.wait(15) == 0, log_path.read_text()
    finally:
        stop(proc)
        writer.close()
    assert_shipped_exactly(receive_all(cloud, url, len(tail)), tail)
    assert WalReader(directory).acked == last == len(first) + len(second) + len(tail)
    assert extensions_api.problems == []
    assert extensions_api.init_errors == []


def test_a_misconfigured_extension_reports_an_init_error(tmp_path: Path, extensions_api: FakeExtensionsApi) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLWAY_")}
    env.update(AWS_LAMBDA_RUNTIME_API=extensions_api.address, TOLLWAY_AUDIT_WAL_DIR=str(tmp_path / "wal"))
    log_path = tmp_path / "extension.log"
    proc = start_extension(env, log_path)
    try:
        assert proc.wait(15) == 1, log_path.read_text()
    finally:
        stop(proc)
    assert len(extensions_api.init_errors) == 1
    error_type, body = extensions_api.init_errors[0]
    assert error_type == "Extension.ConfigError"
    assert "TOLLWAY_QUEUE_AUDIT" in body["errorMessage"]
    assert extensions_api.next_calls == 0
    assert extensions_api.problems == []
