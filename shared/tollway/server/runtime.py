"""What one gateway process holds: the active root, its publisher, admission counters, reload.

Reload compiles a candidate off the request path and swaps it in with one assignment. A
candidate that fails to load, validate or compile leaves the active root in place, and the
log says why (the issue paths, never a secret value).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tollway.audit.pipeline import AuditPipeline
from tollway.config.loader import load_config_with_warnings
from tollway.config.root import PublishedRoot, Publisher, RootHolder
from tollway.config.schema import (
    AuditConfig,
    ContentConfig,
    CorsConfig,
    GovernanceConfig,
    PiiVaultConfig,
    RouterConfig,
    TelemetryConfig,
)
from tollway.config.validate import CAPTURING_MODES
from tollway.exceptions import ConfigError, ConfigIssue, TollwayError
from tollway.gateway import Gateway
from tollway.governance.leases import LeasePolicy, LocalLedger
from tollway.governance.meter import Governor
from tollway.governance.store import DynamoDBLeaseStore, LeaseStore, LeaseStoreSettings, MemoryLeaseStore
from tollway.pii.vault.base import PiiVault
from tollway.pipeline.admission import Admission
from tollway.pipeline.compile import stage_compiler
from tollway.pipeline.core import Pipeline
from tollway.pipeline.observe import Observer
from tollway.pipeline.stages.audit import AuditStage
from tollway.pipeline.stages.content import ContentStage
from tollway.pipeline.stages.pii import PiiStage
from tollway.transport import build_transport
from tollway.transport.base import TransportFactory

if TYPE_CHECKING:
    from tollway.content.base import ContentRecord, ContentRef, ContentStore
    from tollway.content.writer import ContentWriter
    from tollway.metering import UsageLedger
    from tollway.telemetry.metrics import GatewayMetrics
    from tollway.telemetry.tracing import Tracer

__all__ = ["GatewayRuntime"]

log = logging.getLogger("tollway.runtime")


@dataclass
class GatewayRuntime:
    config_path: Path
    publisher: Publisher
    holder: RootHolder
    gateway: Gateway = field(default_factory=Gateway)
    admission: Admission = field(default_factory=Admission)
    audit: AuditPipeline | None = None
    audit_config: AuditConfig = field(default_factory=AuditConfig)
    """The ``audit:`` block as loaded at start; the WAL and sink are per process, so a reload does not change them."""
    governance_config: GovernanceConfig = field(default_factory=GovernanceConfig)
    """The ``governance:`` block as loaded at start: the lease store and the pricing source are per
    process; policies, budgets and quota groups reload with the root."""
    cors_config: CorsConfig = field(default_factory=CorsConfig)
    """The ``cors:`` block as loaded at start: middleware is fixed when the app is built."""
    telemetry_config: TelemetryConfig = field(default_factory=TelemetryConfig)
    """The ``telemetry:`` block as loaded at start: instruments and exporters are built once."""
    metrics: GatewayMetrics | None = None
    tracer: Tracer | None = None
    pipeline: Pipeline | None = None
    """The request path (:meth:`attach_audit` builds it again with the audit recorder)."""
    pii: PiiStage = field(default_factory=PiiStage)
    content: ContentStage | None = None
    """Content capture (``contentMode``), when the ``content:`` block has a store; its writer puts
    records in the background and reports each one to the audit trail."""
    content_writer: ContentWriter | None = None
    """PII tokenization, in the plans of aliases with a PII profile; it owns the vault client."""
    _usage_ledger: UsageLedger | None = None
    _stamp: tuple[float, int] | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _publishing: asyncio.Future[PublishedRoot] | None = None
    """A reload's publication, running in a thread; ``aclose`` waits for it."""

    @classmethod
    def load(cls, config_path: Path, *, transport_factory: TransportFactory = build_transport) -> GatewayRuntime:
        """Load and publish the first root; an invalid file is fatal at start. ``transport_factory``
        builds each provider's client (tests pass ``tests.fakes``' ``MockTransport``'s)."""
        stamp = cls._stat(config_path)
        cfg, warnings = load_config_with_warnings(config_path)
        # One replica holding the whole limit as its lease cannot overshoot anyone: with the
        # in-process store the lease is the limit, so no request waits on a refill.
        fraction = 1.0 if cfg.governance.store == "memory" else cfg.governance.leaseFraction
        governor = Governor(LocalLedger(_lease_store(cfg.governance), LeasePolicy(fraction=fraction)))
        pii = PiiStage(_vault_factory(cfg.pii.vault))
        publisher = Publisher(
            config_dir=config_path.parent,
            transport_factory=transport_factory,
            stages=stage_compiler(governor, None, pii),
        )
        root = publisher.publish(cfg)
        publisher.commit()
        _log_warnings(warnings)
        runtime = cls(
            config_path=config_path,
            publisher=publisher,
            holder=RootHolder(root),
            gateway=Gateway(governor=governor),
            audit_config=cfg.audit,
            governance_config=cfg.governance,
            cors_config=cfg.cors,
            telemetry_config=cfg.telemetry,
            pii=pii,
        )
        if cfg.content.store is not None and any(m.contentMode in CAPTURING_MODES for m in cfg.models):
            runtime._start_content(cfg.content)
        runtime._stamp = stamp  # taken before the read, so a write during start-up is seen by the watch
        runtime._start_telemetry()
        runtime.attach_audit(None)
        return runtime

    def _start_content(self, cfg: ContentConfig) -> None:
        """The content store and its writer; the writer's callbacks append to whichever audit trail is
        attached when a record is stored (none: the reference is lost, and counted as dropped)."""
        from tollway.content.writer import ContentWriter

        def stored(record: ContentRecord, ref: ContentRef) -> None:
            audit = self.audit
            if audit is not None and audit.recorder is not None:
                audit.recorder.content_stored(record.request_id, self.holder.root.digest, ref.to_body())
            if self.metrics is not None:
                self.metrics.content_records.child("stored").inc()

        def dropped(record: ContentRecord, reason: str) -> None:
            audit = self.audit
            if audit is not None and audit.recorder is not None:
                audit.recorder.content_dropped(record.request_id, self.holder.root.digest, record.mode, reason)
            if self.metrics is not None:
                self.metrics.content_records.child(reason).inc()

        self.content_writer = ContentWriter(
            _content_store(cfg),
            max_pending=cfg.maxPending,
            max_pending_bytes=cfg.maxPendingBytes,
            on_stored=stored,
            on_dropped=dropped,
        )
        self.content = ContentStage(self.content_writer)

    def _start_telemetry(self) -> None:
        """Build the metrics and the tracer the ``telemetry:`` block asks for (neither: nothing at all)."""
        cfg = self.telemetry_config
        if cfg.metrics.enabled:
            from tollway.telemetry.metrics import GatewayMetrics

            metrics = self.metrics = GatewayMetrics(
                environment=cfg.environment, max_label_sets=cfg.metrics.maxLabelSets
            )
            self.gateway.metrics = metrics
            waits = metrics.lease_waits
            self.governor.ledger.on_wait = lambda outcome, seconds: waits.child(outcome).observe(seconds)
        if cfg.tracing.enabled:
            from tollway.telemetry.tracing import Tracer

            dropped = self.metrics.trace_spans_dropped.child() if self.metrics is not None else None
            self.tracer = Tracer.from_config(
                cfg.tracing,
                environment=cfg.environment,
                on_dropped=dropped.inc if dropped is not None else None,
            )

    @property
    def observer(self) -> Observer | None:
        if self.metrics is None and self.tracer is None:
            return None
        return Observer(self.metrics, self.tracer, overhead_header=self.telemetry_config.metrics.overheadHeader)

    def attach_audit(self, audit: AuditPipeline | None) -> None:
        """Put the process's audit pipeline (``None``: audit off) on the request path: the audit
        stage goes into every plan of the active root, and of every root published after."""
        self.audit = audit
        recorder = audit.recorder if audit is not None else None
        stage = AuditStage(recorder) if recorder is not None and recorder.enabled else None
        cfg = self.audit_config
        self.pipeline = Pipeline(
            self.holder,
            self.admission,
            self.gateway,
            audit=stage,
            hold_done=cfg.durability == "local-durable" and cfg.terminalCommitBeforeDone,
            observer=self.observer,
        )
        self.publisher.stages = stage_compiler(self.gateway.governor, stage, self.pii, self.content)
        self.holder.swap(self.publisher.restage(self.holder.root))

    def usage_ledger(self) -> UsageLedger | None:
        """The usage ledger ``GET /v1/usage`` reads (``$TOLLWAY_TABLE_USAGE_LEDGER``), built on first use."""
        if self._usage_ledger is None and os.environ.get("TOLLWAY_TABLE_USAGE_LEDGER"):
            from tollway.metering import DynamoDBUsageLedger

            self._usage_ledger = DynamoDBUsageLedger.from_env()
        return self._usage_ledger

    async def warm(self) -> None:
        """Start-up work that would otherwise land on the first requests: the lease store's client."""
        store = self.governor.ledger.store
        if isinstance(store, DynamoDBLeaseStore):
            try:
                await store.warm()
            except Exception as exc:  # a store that is down now fails closed per request later
                log.warning("quota-leases store not reachable at start: %s", type(exc).__name__)

    @property
    def governor(self) -> Governor:
        governor = self.gateway.governor
        assert governor is not None
        return governor

    async def watch_pricing(self) -> None:
        """Poll the pricing store's pointer; install a new snapshot as a pricing-only root."""
        pricing = self.governance_config.pricing
        if not pricing.bucket:
            return
        from tollway.pricing import SnapshotLoader
        from tollway.pricing.store import S3SnapshotStore, StoreSettings

        settings = StoreSettings(
            bucket=pricing.bucket,
            prefix=pricing.prefix,
            endpoint=os.environ.get("AWS_ENDPOINT_URL") or None,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        )
        loader: SnapshotLoader | None = None
        while True:
            try:
                if loader is None:
                    loader = SnapshotLoader(
                        await asyncio.to_thread(S3SnapshotStore.from_settings, settings), prefix=pricing.prefix
                    )
                if await asyncio.to_thread(loader.reload) and loader.current is not None:
                    async with self._reload_lock:
                        self.holder.swap(self.publisher.with_pricing(self.holder.root, loader.current))
                    log.info("pricing snapshot %s active", loader.current.version)
            except TollwayError as exc:
                log.warning("pricing refresh failed; the last valid snapshot stays active: %s", type(exc).__name__)
            await asyncio.sleep(pricing.refreshIntervalMs / 1000)

    @staticmethod
    def _stat(path: Path) -> tuple[float, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def _file_stamp(self) -> tuple[float, int] | None:
        return self._stat(self.config_path)

    async def reload(self) -> bool:
        """Compile the file again; swap on success, keep the active root on any failure."""
        async with self._reload_lock:
            return await self._reload()

    async def _reload(self) -> bool:
        applied = await self._reload_once()
        if self.metrics is not None:
            self.metrics.config_reloads.child(applied).inc()
        return applied in ("applied", "unchanged")

    async def _reload_once(self) -> str:
        """``applied``, ``unchanged``, ``rejected`` (invalid) or ``unreadable``."""
        active = self.holder.root
        try:
            cfg, warnings = await asyncio.to_thread(load_config_with_warnings, self.config_path)
            candidate = await self._publish(cfg)
        except ConfigError as exc:
            log.error(
                "config reload rejected; generation %d stays active: %s",
                active.generation,
                "; ".join(str(i) for i in exc.issues),
            )
            return "rejected"
        except OSError as exc:
            log.error(
                "config reload failed to read the file (%s); generation %d stays active",
                exc.strerror,
                active.generation,
            )
            return "unreadable"
        if self.content is None and any(plan.content is not None for plan in candidate.aliases.values()):
            # The content writer and its store start with the process: a reload cannot start them.
            await self._discard()
            log.error(
                "config reload rejected; generation %d stays active: an alias's contentMode now captures "
                "content, which starts with the process: restart it to turn capture on",
                active.generation,
            )
            return "rejected"
        if candidate.digest == active.digest and candidate.pricing.version == active.pricing.version:
            await self._discard()
            return "unchanged"
        old = self.holder.swap(candidate)
        self.publisher.commit()
        log.info("config generation %d active (digest %s)", candidate.generation, candidate.digest[:12])
        _log_warnings(warnings)
        stale = self.publisher.detach(old, candidate)  # before the lock goes: the next publication builds anew
        if stale:
            task = asyncio.ensure_future(self.publisher.close_later(stale))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return "applied"

    async def _discard(self) -> None:
        """The candidate stays out: close what its publication built (no request used it) and give
        the providers their cached transports back, so the next reload reuses the active ones."""
        for transport in self.publisher.discard():
            await transport.aclose()

    async def _publish(self, cfg: RouterConfig) -> PublishedRoot:
        """Publish ``cfg`` in a thread: publication blocks (AWS credential chains, Google token and
        secret fetches, conformance results, a Presidio model's first load), and on the event loop
        it stalled every open stream for as long. The reload lock keeps one publication at a time;
        the stages are compiled again here, on the loop, in case the audit stage was attached while
        it ran (pricing updates take the reload lock). A publication that fails is discarded here:
        what it built is closed, and the cache is as it was."""
        abandoned = self._publishing
        if abandoned is not None:  # a cancelled reload's publication still runs: one at a time
            await asyncio.wait([abandoned])
            if not abandoned.cancelled():
                abandoned.exception()  # retrieved: it was never going to be reported
            self._publishing = None
            await self._discard()  # its root never went live
        future = self._publishing = asyncio.ensure_future(asyncio.to_thread(self.publisher.publish, cfg))
        try:
            candidate = await asyncio.shield(future)  # a cancelled reload leaves it to finish: aclose waits
        except Exception:
            await self._discard()  # it failed: nothing it built goes live
            raise
        finally:
            if future.done():
                self._publishing = None
        return self.publisher.restage(candidate)

    async def watch(self, interval_s: float = 1.0) -> None:
        """Poll the file's mtime and size; reload when they change."""
        while True:
            await asyncio.sleep(interval_s)
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                await self.reload()

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        publishing = self._publishing
        if publishing is not None:  # its transports must be in the publisher's list when it closes
            await asyncio.wait([publishing])
            if not publishing.cancelled():
                publishing.exception()  # retrieved: a reload cancelled while it ran logs nothing
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)
        await self.governor.ledger.aclose()  # gives unused lease units back to the shared store
        store = self.governor.ledger.store
        if isinstance(store, DynamoDBLeaseStore):
            store.close()
        await self.pii.aclose()
        if self.content_writer is not None:
            await self.content_writer.aclose(timeout_s=5.0)  # what is queued goes to the store first
            await self.content_writer.store.aclose()
        await self.publisher.aclose()


def _content_store(cfg: ContentConfig) -> ContentStore:
    """The ``content.store`` the config names; the S3 store's bucket and key default to the environment's."""
    store = cfg.store
    assert store is not None
    if store.type == "memory":
        from tollway.content.memory import MemoryContentStore

        return MemoryContentStore()
    from tollway.content.s3 import ContentStoreSettings, S3ContentStore

    settings = ContentStoreSettings.from_env(bucket=store.bucket or None, kms_key_id=store.kmsKeyId or None)
    return S3ContentStore(settings)


def _vault_factory(cfg: PiiVaultConfig | None) -> Callable[[], PiiVault] | None:
    """How the PII stage builds its vault on first use (``None``: no durable scope is configured).
    The DynamoDB vault reads its table and key from the config, else the environment."""
    if cfg is None:
        return None
    if cfg.type == "memory":
        from tollway.pii.vault.memory import MemoryPiiVault

        return MemoryPiiVault

    def dynamodb() -> PiiVault:
        from tollway.pii.vault.dynamodb import DynamoDBPiiVault, DynamoDBVaultSettings

        settings = DynamoDBVaultSettings.from_env(table=cfg.table or None, kms_key_id=cfg.kmsKeyId or None)
        return DynamoDBPiiVault(settings)

    return dynamodb


def _log_warnings(warnings: list[ConfigIssue]) -> None:
    for issue in warnings:
        log.warning("config warning: %s", issue)


def _lease_store(gov: GovernanceConfig) -> LeaseStore:
    if gov.store == "dynamodb":
        return DynamoDBLeaseStore(LeaseStoreSettings.from_env(table=gov.table or None))
    return MemoryLeaseStore()
