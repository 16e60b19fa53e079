"""One process's audit pipeline, built from the ``audit:`` block at start: WAL writer, recorder, shipper.

The WAL directory is ``<spool.path>/worker-<N>`` in server mode (``N`` is ``$TOLLWAY_WORKER_INDEX``,
set by ``tollway serve`` for each worker; 0 for a single process) and ``env-<id>`` on Lambda, one per
execution environment (:mod:`tollway.audit.wal.dirs`): one single-writer WAL per process, and the
same directory again after a restart, so recovery replays what the previous process appended but
never shipped. ``$TOLLWAY_AUDIT_WAL_DIR`` overrides ``spool.path`` (Lambda sets it to a ``/tmp`` or
EFS path; the WAL-shipper extension reads the same variable).

In server mode the shipper is an asyncio task of this process; on Lambda the function only
appends, and the extension in ``layers/extension`` ships after each invoke.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tollway.audit.recorder import AuditRecorder

if TYPE_CHECKING:
    from tollway.audit.ship.shipper import Shipper
    from tollway.audit.wal import WalWriter
    from tollway.config.schema import AuditConfig

__all__ = ["AuditPipeline", "build_sink", "external_shipper", "wal_directory", "wal_root"]

log = logging.getLogger("tollway.audit")

_WAL_PUBLIC = (
    "available",
    "durable",
    "writes_on_loop",
    "write_delay_ms",
    "appended",
    "durable_watermark",
    "loss_window_records",
    "bytes_on_disk",
    "max_bytes",
    "segments",
)
_SHIPPER_PUBLIC = ("acked", "lag", "shipped_records", "shipped_messages", "failures", "backoff_s")


def wal_root(cfg: AuditConfig) -> Path:
    """The directory holding every worker's WAL: ``$TOLLWAY_AUDIT_WAL_DIR``, else ``spool.path``."""
    return Path(os.environ.get("TOLLWAY_AUDIT_WAL_DIR") or cfg.spool.path)


def wal_directory(cfg: AuditConfig) -> Path:
    from tollway.audit.wal.dirs import wal_directory_name

    return wal_root(cfg) / wal_directory_name(os.environ)


def external_shipper() -> bool:
    """True when another process ships this process's WAL: the Lambda extension, or the
    ``tollway.audit.ship.process`` that ``tollway serve`` starts (``TOLLWAY_AUDIT_SHIPPER=external``)."""
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME")) or os.environ.get("TOLLWAY_AUDIT_SHIPPER") == "external"


@dataclass
class AuditPipeline:
    recorder: AuditRecorder
    writer: WalWriter
    shipper: Shipper | None
    directory: Path = Path()
    _stop: asyncio.Event | None = None
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, cfg: AuditConfig, *, ship: bool) -> AuditPipeline | None:
        """Open the WAL (running recovery) and, with ``ship``, build the shipper; ``None`` when audit is off."""
        if cfg.sink.type == "none":
            return None
        from tollway.audit.wal import WalLimits, WalWriter

        spool = cfg.spool
        limits = WalLimits(
            max_bytes=spool.maxBytes,
            segment_bytes=spool.segmentBytes,
            max_record_bytes=spool.maxRecordBytes,
            max_batch_records=spool.maxBatchRecords,
            max_batch_bytes=spool.maxBatchBytes,
            max_commit_delay_s=spool.maxCommitDelayMs / 1000,
            commit_timeout_s=spool.commitTimeoutMs / 1000,
            async_write_delay_s=spool.asyncWriteDelayMs / 1000,
        )
        directory = wal_directory(cfg)
        durable = cfg.durability == "local-durable"
        writer = WalWriter(
            directory, instance_id=f"{socket.gethostname()}:{directory.name}", limits=limits, durable=durable
        )
        report = writer.open()
        log.info("audit WAL %s open (%s): %s", directory, cfg.durability, report)
        recorder = AuditRecorder(
            writer,
            durable=durable,
            terminal_commit=cfg.terminalCommitBeforeResponse,
            commit_timeout_s=limits.commit_timeout_s,
            content_mode=cfg.contentMode,
        )
        shipper = _shipper(cfg, directory) if ship else None
        return cls(recorder=recorder, writer=writer, shipper=shipper, directory=directory)

    def start(self, *, write_on_loop: bool = False) -> None:
        """Start the shipper task on the running loop (server mode); with ``write_on_loop`` (and
        ``bounded-async``), the loop also writes the WAL's batches (:meth:`WalWriter.write_on_loop`)."""
        if write_on_loop and not self.writer.durable:
            self.writer.write_on_loop(asyncio.get_running_loop())
        if self.shipper is not None and self._task is None:
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self.shipper.run(self._stop))

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Stop the shipper after one last drain, then flush and close the WAL."""
        if self._task is not None and self._stop is not None:
            self._stop.set()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(self._task, timeout_s)
        await asyncio.to_thread(self.writer.close, timeout_s)

    def acked(self) -> int | None:
        """The highest WAL sequence the queue has acknowledged (``None`` before any is known)."""
        if self.shipper is not None:
            acked = self.shipper.stats()["acked"]
            return int(acked) if acked is not None else None
        from tollway.audit.wal import WalError, WalReader

        try:
            return WalReader(self.directory).acked
        except WalError:
            return None

    def stats(self) -> dict[str, Any]:
        """Numbers only (``/healthz`` is unauthenticated): no paths, queue names, endpoints or error text."""
        wal = self.writer.stats()
        out: dict[str, Any] = {
            "wal": {k: wal[k] for k in _WAL_PUBLIC if k in wal},
            "dropped_after_dispatch": self.recorder.dropped,
            "rejected_unrecorded": self.recorder.rejected_unrecorded,
        }
        if self.shipper is not None:
            shipped = self.shipper.stats()
            out["shipper"] = {k: shipped[k] for k in _SHIPPER_PUBLIC if k in shipped}
        else:
            from tollway.audit.wal import WalError, WalReader

            # Shipped by another process: its durable acknowledgement checkpoint says how far.
            try:
                out["shipper"] = {"external": True, "acked": WalReader(self.directory).acked}
            except WalError:
                out["shipper"] = {"external": True, "acked": None}
        return out


def build_sink(cfg: AuditConfig) -> Any:
    """The configured sink: the SQS queue (``sink.queueName`` or ``$TOLLWAY_QUEUE_AUDIT``) or Kafka.

    With SQS, ``request_finished`` events also go to the usage queue (``sink.usageQueueName`` or
    ``$TOLLWAY_QUEUE_USAGE``) when one is named, for the usage reconciler.
    """
    from tollway.audit.ship.sinks import KafkaSink, SqsSink, UsageFanOut

    sink_cfg = cfg.sink
    if sink_cfg.type == "sqs":
        queue = sink_cfg.queueName or os.environ.get("TOLLWAY_QUEUE_AUDIT", "")
        if not queue:
            raise RuntimeError("audit.sink.type is sqs but neither audit.sink.queueName nor TOLLWAY_QUEUE_AUDIT is set")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        audit = SqsSink(queue, endpoint, region, dict(os.environ))
        usage_queue = sink_cfg.usageQueueName or os.environ.get("TOLLWAY_QUEUE_USAGE", "")
        if not usage_queue:
            return audit
        return UsageFanOut(audit, SqsSink(usage_queue, endpoint, region, dict(os.environ)))
    return KafkaSink(sink_cfg.bootstrapServers, sink_cfg.topic)


def _shipper(cfg: AuditConfig, directory: Path) -> Shipper:
    from tollway.audit.ship.shipper import Shipper
    from tollway.audit.wal import WalReader

    return Shipper(
        WalReader(directory),
        build_sink(cfg),
        batch_records=cfg.sink.batchSize,
        batch_bytes=cfg.spool.maxBatchBytes,
        idle_s=cfg.sink.flushIntervalMs / 1000,
        max_backoff_s=5.0,
    )
