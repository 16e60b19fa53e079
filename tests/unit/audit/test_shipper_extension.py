"""The Lambda extension's settings, deadlines, draining and orphan adoption (real WALs on disk, an in-memory sink)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from layers.extension import EXTENSION_NAME, layer_files, wal_shipper
from layers.extension.wal_shipper import ExtensionsApi, ExtensionSettings, WalDrainer, event_deadline, run
from tollway.audit.ship.sinks import KafkaSink, SinkUnavailable, SqsSink
from tollway.audit.wal import WalLimits, WalReader, WalWriter
from tollway.audit.wal.dirs import lambda_directory_name

ROOT = Path(__file__).resolve().parents[3]
LIMITS = WalLimits(max_bytes=4 << 20, segment_bytes=256 << 10, max_record_bytes=64 << 10)


def env_dir(label: str) -> str:
    """An execution environment's WAL directory name (``env-`` and 32 hex digits), stable per label."""
    return "env-" + hashlib.sha256(label.encode()).hexdigest()[:32]


ENV_BROKEN = env_dir("broken")
ENV_GONE = env_dir("gone")
ENV_LATE = env_dir("late")
ENV_LIVE = env_dir("live")
ENV_MINE = env_dir("mine")
ENV_OWN = env_dir("own")
ENV_THEIRS = env_dir("theirs")
ENV_X = env_dir("x")


@dataclass
class MemorySink:
    fail: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    def send(self, batch: list[bytes]) -> None:
        if self.fail:
            raise SinkUnavailable("queue down")
        for body in batch:
            self.events.extend(json.loads(body)["events"])


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary directory, where the environment id lives (``/tmp`` on Lambda)."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def fill(directory: Path, request_id: str, count: int) -> None:
    """A WAL in ``directory`` holding ``count`` written records, closed again (as a finished function leaves it)."""
    writer = WalWriter(directory, instance_id="unit", limits=LIMITS, durable=True)
    writer.open()
    try:
        for n in range(count):
            writer.append(json.dumps({"eventId": f"{request_id}-{n}", "requestId": request_id}).encode())
    finally:
        writer.close()


def test_the_extension_needs_only_the_standard_library_and_tollway() -> None:
    """Lambda runs it with the runtime's interpreter, the core layer and nothing else (boto3 comes lazily)."""
    probe = (
        "import sys; sys.path[:0] = ['shared', 'layers/extension']\n"
        "import wal_shipper, tollway.audit.wal\n"
        "import json; top = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}\n"
        "print(json.dumps(sorted(top)))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == ["tollway", "wal_shipper"]


def test_the_layer_layout_starts_with_the_core_layer_alone(tmp_path: Path) -> None:
    """Unpacked as Lambda does under /opt, beside the core layer, the launcher finds everything it imports."""
    opt = tmp_path / "opt"
    for arcname, source in layer_files().items():
        target = opt / arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    shutil.copytree(
        ROOT / "shared" / "tollway", opt / "python" / "tollway", ignore=shutil.ignore_patterns("__pycache__")
    )
    launcher = opt / "extensions" / EXTENSION_NAME
    assert os.access(launcher, os.X_OK)
    env = {"PATH": os.environ.get("PATH", ""), "TOLLWAY_AUDIT_SINK": "none"}
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(launcher)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "AWS_LAMBDA_RUNTIME_API is not set" in done.stderr, done.stderr
    assert wal_shipper.EXTENSION_NAME == EXTENSION_NAME


def test_settings_default_to_sqs_and_name_every_missing_variable() -> None:
    with pytest.raises(ValueError) as err:
        ExtensionSettings.from_env({})
    assert "TOLLWAY_AUDIT_WAL_DIR" in str(err.value)
    assert "TOLLWAY_QUEUE_AUDIT" in str(err.value)
    settings = ExtensionSettings.from_env(
        {"TOLLWAY_AUDIT_WAL_DIR": "/tmp/wal", "TOLLWAY_QUEUE_AUDIT": "q", "AWS_REGION": "eu-west-1"}
    )
    assert settings.sink == "sqs"
    assert settings.region == "eu-west-1"
    assert settings.endpoint is None
    assert isinstance(settings.build_sink({}), SqsSink)


def test_kafka_settings_need_bootstrap_servers() -> None:
    env = {"TOLLWAY_AUDIT_SINK": "kafka", "TOLLWAY_AUDIT_WAL_DIR": "/tmp/wal"}
    with pytest.raises(ValueError, match="TOLLWAY_AUDIT_KAFKA_BOOTSTRAP"):
        ExtensionSettings.from_env(env)
    settings = ExtensionSettings.from_env({**env, "TOLLWAY_AUDIT_KAFKA_BOOTSTRAP": "b1:9092,b2:9092"})
    sink = settings.build_sink({})
    assert isinstance(sink, KafkaSink)
    assert sink.servers == ["b1:9092", "b2:9092"]
    assert sink.topic == "tollway-audit-events"


def test_an_unknown_sink_is_refused_and_none_needs_nothing() -> None:
    with pytest.raises(ValueError, match="not sqs, kafka or none"):
        ExtensionSettings.from_env({"TOLLWAY_AUDIT_SINK": "kinesis", "TOLLWAY_AUDIT_WAL_DIR": "/w"})
    assert ExtensionSettings.from_env({"TOLLWAY_AUDIT_SINK": "none"}).build_sink({}) is None


def test_an_eventevent_deadline_becomes_a_monotonic_instant_less_the_margin() -> None:
    now = time.monotonic()
    at = event_deadline({"deadlineMs": int((time.time() + 5) * 1000)}, 0.5)
    assert now + 4.3 < at < now + 4.7
    assert now < event_deadline({}, 0.5) <= time.monotonic() + 1.0


def test_the_own_wal_ships_and_orphans_are_adopted_unless_someone_holds_them(tmp_path: Path) -> None:
    fill(tmp_path / ENV_OWN, "own", 3)
    fill(tmp_path / "worker-0", "gone", 2)  # an environment (or an older version) that is gone
    live = WalWriter(tmp_path / ENV_LIVE, instance_id="unit", limits=LIMITS, durable=True)
    live.open()  # another environment's function, still running
    live.append(b'{"eventId":"live-0","requestId":"live"}')
    (tmp_path / ENV_BROKEN).mkdir()
    (tmp_path / ENV_BROKEN / "wal-00000000000000000001.seg").write_bytes(b"not a WAL segment" * 4)
    (tmp_path / "other").mkdir()
    sink = MemorySink()
    drainer = WalDrainer(tmp_path, sink, ENV_OWN, orphan_idle_s=0.0, orphan_retire_s=0.0)
    try:
        assert drainer.drain(time.monotonic() + 10) == 5
    finally:
        live.close()
        drainer.close()
    assert [e["eventId"] for e in sink.events] == ["own-0", "own-1", "own-2", "gone-0", "gone-1"]
    assert WalReader(tmp_path / ENV_OWN).acked == 3
    assert not (tmp_path / "worker-0").exists(), "the drained orphan was not retired"
    assert WalReader(tmp_path / ENV_LIVE).acked == 0
    assert (tmp_path / ENV_BROKEN).is_dir() and (tmp_path / "other").is_dir()
    assert drainer.stats()["orphans_retired"] == 1


def test_orphans_wait_for_the_scan_interval_and_for_their_idle_time(tmp_path: Path) -> None:
    fill(tmp_path / ENV_OWN, "own", 1)
    sink = MemorySink()
    drainer = WalDrainer(tmp_path, sink, ENV_OWN, orphan_scan_s=3600, orphan_idle_s=0.0, orphan_retire_s=0.0)
    assert drainer.drain(time.monotonic() + 10) == 1
    fill(tmp_path / ENV_LATE, "late", 2)
    assert drainer.drain(time.monotonic() + 10) == 0  # scanned a moment ago: not before the interval
    drainer.close()
    assert (tmp_path / ENV_LATE).is_dir()
    fresh = WalDrainer(tmp_path, MemorySink(), ENV_X, orphan_idle_s=3600)
    assert fresh.drain(time.monotonic() + 10) == 0  # changed just now: maybe a process restarting
    assert WalReader(tmp_path / ENV_LATE).acked == 0


def test_another_extensions_ship_lock_keeps_its_directory_from_adoption(tmp_path: Path) -> None:
    fill(tmp_path / ENV_THEIRS, "theirs", 2)
    theirs = WalDrainer(tmp_path, MemorySink(), ENV_THEIRS)
    theirs.drain(time.monotonic() + 10, orphans=False)  # holds env-theirs's ship.lock from now on
    fill(tmp_path / ENV_THEIRS, "more", 1)
    sink = MemorySink()
    mine = WalDrainer(tmp_path, sink, ENV_MINE, orphan_idle_s=0.0, orphan_retire_s=0.0)
    try:
        assert mine.drain(time.monotonic() + 10) == 0
        assert sink.events == [] and (tmp_path / ENV_THEIRS).is_dir()
    finally:
        theirs.close()
    assert mine.drain(time.monotonic() + 10) == 0  # the scan interval has not passed
    again = WalDrainer(tmp_path, sink, ENV_MINE, orphan_idle_s=0.0, orphan_retire_s=0.0)
    assert again.drain(time.monotonic() + 10) == 1
    assert [e["eventId"] for e in sink.events] == ["more-0"]
    assert not (tmp_path / ENV_THEIRS).exists()


def test_an_unavailable_sink_leaves_every_record_in_the_wal(tmp_path: Path) -> None:
    fill(tmp_path / ENV_OWN, "a", 3)
    fill(tmp_path / ENV_GONE, "b", 2)
    sink = MemorySink(fail=True)
    drainer = WalDrainer(tmp_path, sink, ENV_OWN, orphan_scan_s=0.0, orphan_idle_s=0.0, orphan_retire_s=0.0)
    assert drainer.drain(time.monotonic() + 10) == 0
    assert WalReader(tmp_path / ENV_OWN).acked == 0
    assert WalReader(tmp_path / ENV_GONE).acked == 0
    sink.fail = False
    assert drainer.drain(time.monotonic() + 10) == 5
    drainer.close()
    assert len(sink.events) == 5
    assert not (tmp_path / ENV_GONE).exists()


def test_a_missing_wal_directory_ships_nothing(tmp_path: Path) -> None:
    assert WalDrainer(tmp_path / "absent", MemorySink(), ENV_OWN).drain(time.monotonic() + 1) == 0


class ScriptedApi(ExtensionsApi):
    """Hands out a fixed list of events instead of long-polling Lambda."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__("127.0.0.1:9")
        self.events = events
        self.registered: list[list[str]] = []

    def register(self, events: list[str]) -> str:
        self.registered.append(events)
        self.identifier = "id"
        return "id"

    def next_event(self) -> dict[str, Any]:
        return self.events.pop(0)


def test_with_sink_none_the_extension_only_follows_the_lifecycle(tmp_path: Path) -> None:
    soon = int((time.time() + 5) * 1000)
    api = ScriptedApi([{"eventType": "INVOKE", "deadlineMs": soon}, {"eventType": "SHUTDOWN", "deadlineMs": soon}])
    assert run(api, {"TOLLWAY_AUDIT_SINK": "none"}) == 0
    assert api.registered == [["INVOKE", "SHUTDOWN"]]
    assert api.events == []


class TelemetryApi(ScriptedApi):
    """One invoke: while it runs the function appends more records, then Lambda posts runtimeDone."""

    def __init__(self, wal: Path, soon: int, subscribe_fails: bool = False) -> None:
        super().__init__([{"eventType": "INVOKE", "requestId": "r1", "deadlineMs": soon}])
        self.wal = wal
        self.soon = soon
        self.subscribe_fails = subscribe_fails
        self.uri: str | None = None
        self.shipped_before_next: int | None = None
        self.sink: MemorySink | None = None
        self.invoke = threading.Thread()

    def subscribe_telemetry(self, uri: str) -> None:
        if self.subscribe_fails:
            raise wal_shipper.ExtensionError("telemetry PUT failed")
        self.uri = uri

    def _finish_invoke(self) -> None:
        time.sleep(0.1)
        fill(self.wal / lambda_directory_name(), "during", 2)  # the invoke's own events, after INVOKE was sent
        if self.uri is not None:
            events = [{"type": "platform.start", "record": {"requestId": "r1"}}]
            events.append({"type": "platform.runtimeDone", "record": {"requestId": "r1", "status": "success"}})
            req = urllib.request.Request(self.uri, data=json.dumps(events).encode(), method="POST")
            urllib.request.urlopen(req, timeout=5).close()

    def next_event(self) -> dict[str, Any]:
        if self.events:
            self.invoke = threading.Thread(target=self._finish_invoke)
            self.invoke.start()
            return self.events.pop(0)
        assert self.sink is not None
        self.shipped_before_next = len(self.sink.events)
        self.invoke.join(5)  # SHUTDOWN comes later, once the invoke is over
        return {"eventType": "SHUTDOWN", "deadlineMs": self.soon}


def telemetry_env(wal_dir: Path) -> dict[str, str]:
    """The extension's settings for an SQS sink, with its Telemetry API listener on loopback."""
    return {
        "TOLLWAY_AUDIT_SINK": "sqs",
        "TOLLWAY_QUEUE_AUDIT": "q",
        "TOLLWAY_AUDIT_WAL_DIR": str(wal_dir),
        "TOLLWAY_TELEMETRY_HOST": "127.0.0.1",
    }


def _telemetry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, subscribe_fails: bool) -> TelemetryApi:
    fill(tmp_path / lambda_directory_name(), "before", 3)
    sink = MemorySink()
    monkeypatch.setattr(ExtensionSettings, "build_sink", lambda self, env: sink)
    api = TelemetryApi(tmp_path, int((time.time() + 5) * 1000), subscribe_fails=subscribe_fails)
    api.sink = sink
    assert run(api, telemetry_env(tmp_path)) == 0
    assert len(sink.events) == 5  # everything, by SHUTDOWN at the latest
    return api


def test_an_invokes_own_records_ship_on_its_runtime_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = _telemetry_run(tmp_path, monkeypatch, subscribe_fails=False)
    assert api.uri is not None and api.uri.startswith("http://127.0.0.1:")
    # Before asking for the next event (when Lambda may freeze the environment for hours), the
    # extension waited for runtimeDone and shipped the records the invoke appended after INVOKE.
    assert api.shipped_before_next == 5


def test_without_a_telemetry_subscription_the_extension_still_drains_at_invoke_and_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = _telemetry_run(tmp_path, monkeypatch, subscribe_fails=True)
    assert api.shipped_before_next is not None and api.shipped_before_next < 5


class SilentTelemetryApi(ScriptedApi):
    """Subscribed, but Lambda never posts runtimeDone: every wait runs to the invoke's deadline."""

    def __init__(self, invokes: int) -> None:
        super().__init__([])
        self.invokes = invokes
        self.gaps: list[float] = []
        self._last = 0.0

    def subscribe_telemetry(self, uri: str) -> None:
        pass

    def next_event(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._last:
            self.gaps.append(now - self._last)
        self._last = now
        soon = int((time.time() + 2.0) * 1000)  # less the 1 s margin: a 1 s wait
        if len(self.gaps) < self.invokes:
            return {"eventType": "INVOKE", "requestId": f"r{len(self.gaps)}", "deadlineMs": soon}
        return {"eventType": "SHUTDOWN", "deadlineMs": soon}


def test_missing_runtime_done_events_stop_the_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ExtensionSettings, "build_sink", lambda self, env: MemorySink())
    api = SilentTelemetryApi(invokes=5)
    assert run(api, telemetry_env(tmp_path)) == 0
    limit = wal_shipper.MAX_RUNTIME_DONE_MISSES
    # The first invokes wait for runtimeDone until their deadline (1 s); then the waiting stops.
    # The bounds are an order of magnitude apart: this checks behaviour, not speed.
    assert all(gap >= 0.8 for gap in api.gaps[:limit]), api.gaps
    assert all(gap < 0.5 for gap in api.gaps[limit:]), api.gaps


def test_a_drain_is_bounded_by_its_reads_unless_told_to_exhaust_the_wal(tmp_path: Path) -> None:
    fill(tmp_path / ENV_OWN, "own", 150)
    sink = MemorySink()
    drainer = WalDrainer(tmp_path, sink, ENV_OWN, orphan_scan_s=3600, batch_records=1)
    try:
        assert drainer.drain(time.monotonic() + 10) == 64  # 64 reads of one record
        assert drainer.drain(time.monotonic() + 10, exhaust=True) == 86
    finally:
        drainer.close()
    assert [e["eventId"] for e in sink.events] == [f"own-{n}" for n in range(150)]


def test_shutdown_ships_a_backlog_beyond_one_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SHUTDOWN is the last chance for records on ``/tmp``: it drains until caught up, not 64 reads."""
    fill(tmp_path / lambda_directory_name(), "left", 150)
    sink = MemorySink()
    monkeypatch.setattr(ExtensionSettings, "build_sink", lambda self, env: sink)
    monkeypatch.setattr(wal_shipper, "BATCH_RECORDS", 1)
    soon = int((time.time() + 30) * 1000)
    api = ScriptedApi([{"eventType": "SHUTDOWN", "deadlineMs": soon}])
    env = {"TOLLWAY_AUDIT_SINK": "sqs", "TOLLWAY_QUEUE_AUDIT": "q", "TOLLWAY_AUDIT_WAL_DIR": str(tmp_path)}
    assert run(api, env) == 0
    assert len(sink.events) == 150
