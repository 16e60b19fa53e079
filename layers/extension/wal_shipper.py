"""The WAL-shipper Lambda extension: ships the function's audit WAL between invokes and at SHUTDOWN.

Lambda starts ``/opt/extensions/tollway-wal-shipper`` (the launcher beside this module) at init.
It registers with the Extensions API for ``INVOKE`` and ``SHUTDOWN`` and then loops on
``event/next``:

- ``INVOKE``: drain the WAL, bounded by the invoke's deadline. Lambda sends ``INVOKE`` as the
  function starts, so that drain ships what earlier invokes left. Then the extension waits for
  the Telemetry API's ``platform.runtimeDone`` of this invoke (it subscribes to the platform
  events at start, with a listener on ``$TOLLWAY_TELEMETRY_HOST``, default
  ``sandbox.localdomain``) and drains again: this invoke's own records leave right after its
  response, not at the next invoke, which may come hours later. Lambda does not freeze the
  environment, nor start the next invoke, until every extension has asked for the next event,
  so a drain never delays a response; it adds to the invoke's billed time. If the subscription
  fails, the extension keeps to the first drain and says so in its log.
- ``SHUTDOWN``: a last drain within the shutdown deadline, then exit 0.

The function appends to ``$TOLLWAY_AUDIT_WAL_DIR/env-<id>``, one directory per execution
environment (``tollway.audit.wal.dirs``: the id is kept in the environment's ``/tmp``, which the
function and the extension share); the extension ships that directory. Records stay in the WAL
until the sink accepted them, so a failed drain loses nothing while the volume lives: ``/tmp``
lives as long as the execution environment, an EFS path beyond it. On EFS, where every
environment's directory is visible, the extension also adopts the directories of environments
that are gone (nobody holds their locks, and nothing changed in them for
``$TOLLWAY_AUDIT_ORPHAN_IDLE_S``, default 300 s): it ships them after an invoke's response, for
at most 2 s a pass, and deletes them once everything is acknowledged and nothing changed in them
for ``$TOLLWAY_AUDIT_ORPHAN_RETIRE_S`` (default a day).

Settings come from the environment only, so the extension needs neither the config file nor a
parser: ``TOLLWAY_AUDIT_SINK`` (``sqs``, the default; ``kafka``; or ``none`` to idle),
``TOLLWAY_QUEUE_AUDIT`` (the queue name; the CDK app sets it), ``TOLLWAY_AUDIT_KAFKA_BOOTSTRAP``
and ``TOLLWAY_AUDIT_KAFKA_TOPIC``, and the usual ``AWS_REGION`` and ``AWS_ENDPOINT_URL``. It
imports only the standard library and ``tollway.audit`` (the core layer); the SQS sink uses the
runtime's boto3, the Kafka sink needs kafka-python in a layer.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, Literal, cast

from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import AuditSink, KafkaSink, SinkUnavailable, SqsSink, UsageFanOut
from tollway.audit.wal.dirs import ORPHAN_IDLE_S, ORPHAN_RETIRE_S, ShipLock, lambda_directory_name, ship_orphans

__all__ = [
    "EXTENSION_NAME",
    "ExtensionSettings",
    "ExtensionsApi",
    "RuntimeDone",
    "WalDrainer",
    "event_deadline",
    "main",
    "run",
]

log = logging.getLogger("tollway.audit.extension")

EXTENSION_NAME: Final = "tollway-wal-shipper"
"""Must equal the executable's file name in ``/opt/extensions``: Lambda matches the two."""
API_VERSION: Final = "2020-01-01"
TELEMETRY_API_VERSION: Final = "2022-07-01"
TELEMETRY_SCHEMA: Final = "2022-12-13"
TELEMETRY_BUFFER_MS: Final = 25
"""The shortest buffering Lambda accepts: the delay between the response and the second drain."""
MAX_RUNTIME_DONE_MISSES: Final = 3
"""Invokes in a row without their ``platform.runtimeDone`` before the extension stops waiting for
it (each miss kept the environment up until the invoke's deadline)."""
INVOKE_MARGIN_S: Final = 1.0
"""Time left before the invoke's deadline when a drain stops, for the ``event/next`` call itself."""
SHUTDOWN_MARGIN_S: Final = 0.2
BATCH_RECORDS: Final = 512
BATCH_BYTES: Final = 1024 * 1024
ORPHAN_SCAN_S: Final = 60.0


class ExtensionError(RuntimeError):
    """The Extensions API refused a call or did not answer."""


class ExtensionsApi:
    """A client of the Lambda Extensions API (``$AWS_LAMBDA_RUNTIME_API``), standard library only."""

    def __init__(self, runtime_api: str, name: str = EXTENSION_NAME, *, timeout_s: float = 10.0) -> None:
        self._base = f"http://{runtime_api}/{API_VERSION}/extension"
        self._telemetry = f"http://{runtime_api}/{TELEMETRY_API_VERSION}/telemetry"
        self._name = name
        self._timeout_s = timeout_s
        self.identifier: str | None = None

    def _request(
        self,
        method: str,
        path: str,
        body: Any,
        headers: Mapping[str, str],
        timeout_s: float | None,
        url: str | None = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        target = url or f"{self._base}/{path}"
        request = urllib.request.Request(target, data=data, method=method, headers=dict(headers))
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read()
                identifier = response.headers.get("Lambda-Extension-Identifier")
        except (urllib.error.URLError, OSError) as exc:
            raise ExtensionError(f"Extensions API {method} {path} failed: {exc}") from None
        if path == "register":
            if not identifier:
                raise ExtensionError("Extensions API register answered without Lambda-Extension-Identifier")
            self.identifier = identifier
        return json.loads(raw) if raw else None

    def _id_header(self) -> dict[str, str]:
        if self.identifier is None:
            raise ExtensionError("the extension is not registered")
        return {"Lambda-Extension-Identifier": self.identifier}

    def register(self, events: list[str]) -> str:
        self._request("POST", "register", {"events": events}, {"Lambda-Extension-Name": self._name}, self._timeout_s)
        assert self.identifier is not None
        return self.identifier

    def next_event(self) -> dict[str, Any]:
        """Block until Lambda sends the next event.

        No timeout on purpose: Lambda freezes the environment between invokes, and the answer may
        come hours later; the environment's own lifecycle (SHUTDOWN) bounds the wait.
        """
        event = self._request("GET", "event/next", None, self._id_header(), None)
        if not isinstance(event, dict):
            raise ExtensionError("Extensions API event/next answered without a JSON object")
        return event

    def subscribe_telemetry(self, uri: str) -> None:
        """Have Lambda post this environment's platform events (``platform.runtimeDone``) to ``uri``."""
        body = {
            "schemaVersion": TELEMETRY_SCHEMA,
            "destination": {"protocol": "HTTP", "URI": uri},
            "types": ["platform"],
            "buffering": {"timeoutMs": TELEMETRY_BUFFER_MS, "maxBytes": 262144, "maxItems": 1000},
        }
        headers = {**self._id_header(), "Content-Type": "application/json"}
        self._request("PUT", "telemetry", body, headers, self._timeout_s, url=self._telemetry)

    def init_error(self, error_type: str, message: str) -> None:
        """Report a failed initialization; Lambda then fails the function's init and restarts the environment."""
        headers = {**self._id_header(), "Lambda-Extension-Function-Error-Type": error_type}
        self._request(
            "POST", "init/error", {"errorMessage": message, "errorType": error_type}, headers, self._timeout_s
        )


SinkKind = Literal["sqs", "kafka", "none"]


@dataclass(frozen=True)
class ExtensionSettings:
    wal_dir: Path
    sink: SinkKind
    queue_name: str = ""
    endpoint: str | None = None
    region: str = "us-east-1"
    kafka_bootstrap: str = ""
    kafka_topic: str = "tollway-audit-events"
    orphan_idle_s: float = ORPHAN_IDLE_S
    orphan_retire_s: float = ORPHAN_RETIRE_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ExtensionSettings:
        """Raises ``ValueError`` naming every missing or wrong variable."""
        sink = env.get("TOLLWAY_AUDIT_SINK", "sqs").strip().lower() or "sqs"
        problems = []
        if sink not in ("sqs", "kafka", "none"):
            problems.append(f"TOLLWAY_AUDIT_SINK={sink!r} is not sqs, kafka or none")
        wal_dir = env.get("TOLLWAY_AUDIT_WAL_DIR", "").strip()
        if sink != "none" and not wal_dir:
            problems.append("TOLLWAY_AUDIT_WAL_DIR is not set")
        if sink == "sqs" and not env.get("TOLLWAY_QUEUE_AUDIT"):
            problems.append("TOLLWAY_QUEUE_AUDIT is not set")
        if sink == "kafka" and not env.get("TOLLWAY_AUDIT_KAFKA_BOOTSTRAP"):
            problems.append("TOLLWAY_AUDIT_KAFKA_BOOTSTRAP is not set")
        orphan_idle_s = _seconds(env, "TOLLWAY_AUDIT_ORPHAN_IDLE_S", ORPHAN_IDLE_S, problems)
        orphan_retire_s = _seconds(env, "TOLLWAY_AUDIT_ORPHAN_RETIRE_S", ORPHAN_RETIRE_S, problems)
        if problems:
            raise ValueError("; ".join(problems))
        return cls(
            wal_dir=Path(wal_dir),
            sink=cast(SinkKind, sink),
            queue_name=env.get("TOLLWAY_QUEUE_AUDIT", ""),
            endpoint=env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            kafka_bootstrap=env.get("TOLLWAY_AUDIT_KAFKA_BOOTSTRAP", ""),
            kafka_topic=env.get("TOLLWAY_AUDIT_KAFKA_TOPIC") or "tollway-audit-events",
            orphan_idle_s=orphan_idle_s,
            orphan_retire_s=orphan_retire_s,
        )

    def build_sink(self, env: Mapping[str, str]) -> AuditSink | None:
        if self.sink == "sqs":
            audit = SqsSink(self.queue_name, self.endpoint, self.region, env)
            usage_queue = env.get("TOLLWAY_QUEUE_USAGE", "")
            if not usage_queue:
                return audit
            return UsageFanOut(audit, SqsSink(usage_queue, self.endpoint, self.region, env))
        if self.sink == "kafka":
            return KafkaSink(self.kafka_bootstrap, self.kafka_topic)
        return None


def _seconds(env: Mapping[str, str], name: str, default: float, problems: list[str]) -> float:
    """``env[name]`` as a number of seconds >= 0, ``default`` when unset; a bad value is a problem."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        problems.append(f"{name}={raw!r} is not a number of seconds >= 0")
    return value


class WalDrainer:
    """Ships this environment's WAL directory and, now and then, adopts orphans under the same root.

    ``own`` is the directory the function writes (``env-<id>``, :mod:`tollway.audit.wal.dirs`). The
    extension holds its ``ship.lock`` from the first drain on, so no other environment's extension
    adopts it while this one lives. Other directories under ``base`` are adopted only when nobody
    writes or ships them and they have been idle for ``orphan_idle_s`` (an environment reclaimed
    with records left on EFS), at most once every ``orphan_scan_s``.
    """

    def __init__(
        self,
        base: Path,
        sink: AuditSink,
        own: str,
        *,
        orphan_scan_s: float = ORPHAN_SCAN_S,
        orphan_idle_s: float = ORPHAN_IDLE_S,
        orphan_retire_s: float = ORPHAN_RETIRE_S,
        batch_records: int | None = None,
    ) -> None:
        self._base = base
        self._batch_records = BATCH_RECORDS if batch_records is None else batch_records
        self._sink = sink
        self._own = base / own
        self._lock = ShipLock(self._own)
        self._shipper: Shipper | None = None
        self._orphan_scan_s = orphan_scan_s
        self._orphan_idle_s = orphan_idle_s
        self._orphan_retire_s = orphan_retire_s
        self._next_orphan_scan = 0.0
        self._orphans_shipped = self._orphans_retired = 0
        self._drained_orphans: dict[Path, float] = {}

    def drain(self, deadline: float, *, orphans: bool = True, exhaust: bool = False) -> int:
        """Ship what the WAL holds until ``deadline`` (monotonic), then orphans if one is due and
        ``orphans``; failures are logged, never raised.

        One drain of the own WAL makes at most 64 reads of ``batch_records``. With ``exhaust``
        (at SHUTDOWN, the last chance for records on ``/tmp``) drains follow each other until the
        WAL is caught up, a send fails, or ``deadline``.
        """
        from tollway.audit.wal import WalReader

        shipped = 0
        try:
            if self._lock.acquire():  # False until the function has opened its WAL
                if self._shipper is None:
                    self._shipper = Shipper(
                        WalReader(self._own),
                        self._sink,
                        batch_records=self._batch_records,
                        batch_bytes=BATCH_BYTES,
                        idle_s=0.0,
                        max_backoff_s=1.0,
                    )
                shipped += self._shipper.drain_once(deadline)
                while exhaust and self._shipper.more and time.monotonic() < deadline:
                    shipped += self._shipper.drain_once(deadline)
            if orphans and time.monotonic() >= self._next_orphan_scan:
                self._next_orphan_scan = time.monotonic() + self._orphan_scan_s
                count, retired = ship_orphans(
                    self._base,
                    self._sink,
                    own=[self._own],
                    batch_records=BATCH_RECORDS,
                    batch_bytes=BATCH_BYTES,
                    deadline=deadline,
                    idle_s=self._orphan_idle_s,
                    retire_after_s=self._orphan_retire_s,
                    drained=self._drained_orphans,
                )
                shipped += count
                self._orphans_shipped += count
                self._orphans_retired += retired
        except SinkUnavailable as exc:
            log.warning("audit sink unavailable, records stay in the WAL: %s", exc)
        except Exception:
            log.exception("could not ship the audit WAL under %s", self._base)
        return shipped

    def stats(self) -> dict[str, Any]:
        own = self._shipper.stats() if self._shipper is not None else {}
        return {**own, "orphans_shipped": self._orphans_shipped, "orphans_retired": self._orphans_retired}

    def close(self) -> None:
        self._lock.release()


class RuntimeDone:
    """The Telemetry API's listener: which invokes the function's runtime has finished.

    Lambda posts batches of platform events (a JSON list) to it; a ``platform.runtimeDone`` event
    names its invoke in ``record.requestId``. Only those are kept, and each only until waited for.
    """

    def __init__(self, host: str) -> None:
        self._done: set[str] = set()
        self._cond = threading.Condition()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    events = json.loads(self.rfile.read(length) or b"[]")
                except ValueError:
                    events = []
                listener._record(events if isinstance(events, list) else [])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # per-event access logs would be noise in the function's log group

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.uri = f"http://{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="telemetry-listener", daemon=True).start()

    def _record(self, events: list[Any]) -> None:
        finished = [
            e["record"]["requestId"]
            for e in events
            if isinstance(e, dict)
            and e.get("type") == "platform.runtimeDone"
            and isinstance(e.get("record"), dict)
            and isinstance(e["record"].get("requestId"), str)
        ]
        if finished:
            with self._cond:
                self._done.update(finished)
                self._cond.notify_all()

    def wait(self, request_id: str, deadline: float) -> bool:
        """Whether the runtime finished ``request_id`` before ``deadline`` (a monotonic instant)."""
        with self._cond:
            done = self._cond.wait_for(lambda: request_id in self._done, max(0.0, deadline - time.monotonic()))
            self._done.discard(request_id)
            return done

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def event_deadline(event: Mapping[str, Any], margin_s: float) -> float:
    """The event's ``deadlineMs`` (Unix milliseconds) as a ``time.monotonic()`` instant, less ``margin_s``."""
    deadline_ms = event.get("deadlineMs")
    if not isinstance(deadline_ms, int | float):
        return time.monotonic() + 1.0
    return time.monotonic() + (deadline_ms / 1000 - time.time()) - margin_s


def run(api: ExtensionsApi, env: Mapping[str, str]) -> int:
    """Register, then serve events until SHUTDOWN; the process's exit code."""
    api.register(["INVOKE", "SHUTDOWN"])
    try:
        settings = ExtensionSettings.from_env(env)
        sink = settings.build_sink(env)
    except ValueError as exc:
        log.error("%s: %s", EXTENSION_NAME, exc)
        api.init_error("Extension.ConfigError", str(exc))
        return 1
    drainer = None
    if sink is not None:
        own = lambda_directory_name()
        drainer = WalDrainer(
            settings.wal_dir,
            sink,
            own,
            orphan_idle_s=settings.orphan_idle_s,
            orphan_retire_s=settings.orphan_retire_s,
        )
        log.info("%s registered: sink %r, WAL %s", EXTENSION_NAME, sink, settings.wal_dir / own)
    done = None if drainer is None else _subscribe(api, env)
    misses = 0
    while True:
        event = api.next_event()
        kind = event.get("eventType")
        shutdown = kind == "SHUTDOWN"
        if drainer is not None:
            deadline = event_deadline(event, SHUTDOWN_MARGIN_S if shutdown else INVOKE_MARGIN_S)
            # Orphans only when the invoke is done (or when its end cannot be seen): adopting one
            # at INVOKE would take CPU from the function while it serves the request.
            drainer.drain(deadline, orphans=done is None and not shutdown, exhaust=shutdown)
            request_id = event.get("requestId")
            if done is not None and not shutdown and isinstance(request_id, str):
                if done.wait(request_id, deadline):
                    misses = 0
                    drainer.drain(deadline)  # this invoke's own records, right after its response
                else:
                    misses += 1
                    if misses >= MAX_RUNTIME_DONE_MISSES:
                        log.warning(
                            "%s: no platform.runtimeDone for %d invokes; draining at INVOKE and SHUTDOWN only",
                            EXTENSION_NAME,
                            misses,
                        )
                        done.close()
                        done = None
        if shutdown:
            if done is not None:
                done.close()
            if drainer is not None:
                log.info("%s shutting down (%s): %s", EXTENSION_NAME, event.get("shutdownReason"), drainer.stats())
                drainer.close()
            if isinstance(sink, KafkaSink):
                sink.close(0.5)
            return 0


def _subscribe(api: ExtensionsApi, env: Mapping[str, str]) -> RuntimeDone | None:
    """The runtimeDone listener, subscribed; ``None`` (drain at INVOKE and SHUTDOWN only) if that fails."""
    host = env.get("TOLLWAY_TELEMETRY_HOST", "").strip() or "sandbox.localdomain"
    try:
        done = RuntimeDone(host)
    except OSError as exc:
        log.warning(
            "%s: no telemetry listener on %s (%s); draining at INVOKE and SHUTDOWN only", EXTENSION_NAME, host, exc
        )
        return None
    try:
        api.subscribe_telemetry(done.uri)
    except ExtensionError as exc:
        log.warning(
            "%s: Telemetry API subscription failed (%s); draining at INVOKE and SHUTDOWN only", EXTENSION_NAME, exc
        )
        done.close()
        return None
    return done


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    runtime_api = os.environ.get("AWS_LAMBDA_RUNTIME_API")
    if not runtime_api:
        log.error("%s: AWS_LAMBDA_RUNTIME_API is not set; this runs inside Lambda only", EXTENSION_NAME)
        return 1
    try:
        return run(ExtensionsApi(runtime_api), os.environ)
    except ExtensionError as exc:
        log.error("%s: %s", EXTENSION_NAME, exc)
        return 1
