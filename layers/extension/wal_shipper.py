"""The WAL-shipper Lambda extension: ships the function's audit WAL between invokes and at SHUTDOWN.

Lambda starts ``/opt/extensions/tollway-wal-shipper`` (the launcher beside this module) at init.
It registers with the Extensions API for ``INVOKE`` and ``SHUTDOWN`` and then loops on
``event/next``:

- ``INVOKE``: drain the WAL, bounded by the invoke's deadline, then ask for the next event.
  Lambda does not start the next invoke of this environment until every extension has asked, so
  a drain never delays a response: it only adds to the invoke's billed time. Lambda sends
  ``INVOKE`` as the function starts, so the drain ships everything committed so far (the previous
  invokes' tails and whatever this one has already appended); the rest waits for the next event.
- ``SHUTDOWN``: a last drain within the shutdown deadline, then exit 0.

The function appends to ``$TOLLWAY_AUDIT_WAL_DIR/worker-<N>`` (``tollway.audit.pipeline``); the
extension ships every ``worker-*`` directory there. Records stay in the WAL until the sink
accepted them, so a failed drain loses nothing while the volume lives: ``/tmp`` lives as long as
the execution environment, an EFS path beyond it.

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
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from tollway.audit.shipper import Shipper
from tollway.audit.sinks import AuditSink, KafkaSink, SinkUnavailable, SqsSink, UsageFanOut

__all__ = ["EXTENSION_NAME", "ExtensionSettings", "ExtensionsApi", "WalDrainer", "event_deadline", "main", "run"]

log = logging.getLogger("tollway.audit.extension")

EXTENSION_NAME: Final = "tollway-wal-shipper"
"""Must equal the executable's file name in ``/opt/extensions``: Lambda matches the two."""
API_VERSION: Final = "2020-01-01"
INVOKE_MARGIN_S: Final = 1.0
"""Time left before the invoke's deadline when a drain stops, for the ``event/next`` call itself."""
SHUTDOWN_MARGIN_S: Final = 0.2
BATCH_RECORDS: Final = 256
BATCH_BYTES: Final = 1024 * 1024


class ExtensionError(RuntimeError):
    """The Extensions API refused a call or did not answer."""


class ExtensionsApi:
    """A client of the Lambda Extensions API (``$AWS_LAMBDA_RUNTIME_API``), standard library only."""

    def __init__(self, runtime_api: str, name: str = EXTENSION_NAME, *, timeout_s: float = 10.0) -> None:
        self._base = f"http://{runtime_api}/{API_VERSION}/extension"
        self._name = name
        self._timeout_s = timeout_s
        self.identifier: str | None = None

    def _request(self, method: str, path: str, body: Any, headers: Mapping[str, str], timeout_s: float | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self._base}/{path}", data=data, method=method, headers=dict(headers))
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


class WalDrainer:
    """One :class:`Shipper` per ``worker-*`` WAL directory under ``base``, all into one sink."""

    def __init__(self, base: Path, sink: AuditSink) -> None:
        self._base = base
        self._sink = sink
        self._shippers: dict[Path, Shipper] = {}

    def _directories(self) -> list[Path]:
        try:
            return sorted(p for p in self._base.iterdir() if p.is_dir() and p.name.startswith("worker-"))
        except FileNotFoundError:
            return []

    def drain(self, deadline: float) -> int:
        """Ship what every WAL holds, until ``deadline`` (monotonic); failures are logged, never raised."""
        from tollway.audit.wal import WalReader

        shipped = 0
        for directory in self._directories():
            shipper = self._shippers.get(directory)
            try:
                if shipper is None:
                    shipper = Shipper(
                        WalReader(directory),
                        self._sink,
                        batch_records=BATCH_RECORDS,
                        batch_bytes=BATCH_BYTES,
                        idle_s=0.0,
                        max_backoff_s=1.0,
                    )
                    self._shippers[directory] = shipper
                shipped += shipper.drain_once(deadline)
            except SinkUnavailable as exc:
                log.warning("audit sink unavailable, records stay in the WAL: %s", exc)
                break
            except Exception:
                log.exception("could not ship the audit WAL in %s", directory)
        return shipped

    def stats(self) -> dict[str, Any]:
        return {directory.name: shipper.stats() for directory, shipper in self._shippers.items()}


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
    drainer = None if sink is None else WalDrainer(settings.wal_dir, sink)
    log.info("%s registered: sink %r, WAL %s", EXTENSION_NAME, sink, settings.wal_dir)
    while True:
        event = api.next_event()
        kind = event.get("eventType")
        shutdown = kind == "SHUTDOWN"
        if drainer is not None:
            drainer.drain(event_deadline(event, SHUTDOWN_MARGIN_S if shutdown else INVOKE_MARGIN_S))
        if shutdown:
            if drainer is not None:
                log.info("%s shutting down (%s): %s", EXTENSION_NAME, event.get("shutdownReason"), drainer.stats())
            if isinstance(sink, KafkaSink):
                sink.close(0.5)
            return 0


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
