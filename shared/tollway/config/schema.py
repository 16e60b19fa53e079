"""The typed shape of ``llm-router.yml``: key names and nesting follow the seed's *Configuration Model*.

These pydantic models only check shape and local bounds. Cross-references and policy rules
(duplicate ids, unknown providers, unsafe URLs, capability coverage, ...) live in
``tollway.config.validate`` so every problem is reported at once with its YAML path.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tollway.providers.gemini import vertex_base_url

__all__ = [
    "AdmissionConfig",
    "BudgetConfig",
    "CanaryConfig",
    "CanarySplitConfig",
    "CircuitBreakerConfig",
    "ConformanceConfig",
    "ContentConfig",
    "ContentStoreConfig",
    "CorsConfig",
    "CredentialConfig",
    "GovernanceConfig",
    "KeyConfig",
    "LimitsConfig",
    "MetricsConfig",
    "ModelConfig",
    "OutlierDetectionConfig",
    "PolicyConfig",
    "PricingConfig",
    "PrincipalConfig",
    "ProviderConfig",
    "QuotaGroupConfig",
    "RetentionClassConfig",
    "RouteConfig",
    "RouterConfig",
    "RoutingConfig",
    "TelemetryConfig",
    "TracingConfig",
]

Capability = Literal["streaming", "tools", "vision", "json_object", "json_schema"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CredentialConfig(_Model):
    id: str
    secretRef: str = Field(min_length=1)
    """``env:NAME`` locally; ``aws-sm:<secret-id>[#json-key]`` on AWS."""
    lifecycle: Literal["current", "next", "retiring"] = "current"


class ProviderConfig(_Model):
    type: Literal["openai", "anthropic", "openai-compatible", "gemini", "vertex", "bedrock"]
    baseUrl: str
    """Required, except for ``bedrock`` (default ``https://bedrock-runtime.{awsRegion}.amazonaws.com``)
    and ``vertex`` (default ``https://{gcpLocation}-aiplatform.googleapis.com/v1/projects/{gcpProject}/locations/{gcpLocation}/publishers/google/``)."""
    providerAccountId: str | None = None
    quotaGroupId: str | None = None
    authMode: Literal["api-key", "none"] = "api-key"
    credentials: list[CredentialConfig] = Field(default_factory=list)
    connectTimeoutMs: int = 3000
    requestTimeoutMs: int = 90000
    maxConnections: int = 256
    allowInsecureHttp: bool = False
    """Plain http is refused unless the host is loopback or this is set explicitly."""
    anthropicVersion: str = "2023-06-01"
    maxInFlight: int = Field(default=0, ge=0)
    """Per-process cap on this deployment's requests in flight (a target beyond it is skipped); 0: none."""
    pricingProvider: str | None = None
    """The provider's id in the pricing catalog (``openai``, ``anthropic``); defaults to ``type``."""
    awsRegion: str | None = None
    """``bedrock`` only: the region requests are sent to and signed for; defaults to ``AWS_REGION``,
    else ``AWS_DEFAULT_REGION``, read when the configuration is parsed."""
    awsProfile: str | None = None
    """``bedrock`` only: the shared-config profile whose credentials sign requests; by default
    botocore's chain (environment, shared files, the container's or the instance's role)."""
    gcpProject: str | None = None
    """``vertex`` only: the Google Cloud project whose Vertex AI endpoint serves the models."""
    gcpLocation: str | None = None
    """``vertex`` only: the Vertex AI location (``us-central1``, ``europe-west4``, ``global``)."""
    proxyUrl: str | None = None
    """An HTTPS proxy this provider's connections tunnel through with ``CONNECT``
    (``http://host:port``, or ``https://host:port`` for TLS to the proxy itself). It never carries
    credentials: those come from ``proxyCredentialsSecretRef``."""
    proxyCredentialsSecretRef: str | None = None
    """A secret reference (``env:NAME``, ``aws-sm:<id>[#key]``) whose value is ``user:password``,
    sent to the proxy as ``Proxy-Authorization: Basic`` on ``CONNECT``."""
    caBundle: str | None = None
    """A PEM file of the CA certificates this provider's TLS (and an ``https`` proxy's) is verified
    against, instead of the system's trust store."""

    @model_validator(mode="before")
    @classmethod
    def _bedrock_defaults(cls, data: Any) -> Any:
        """A bedrock provider's region from the environment, and its endpoint from the region.
        Without any region its ``baseUrl`` is left empty, so validation reports ``awsRegion``."""
        if not isinstance(data, dict) or data.get("type") != "bedrock":
            return data
        region = data.get("awsRegion")
        if region is None:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                data = {**data, "awsRegion": region}
        if "baseUrl" not in data:
            endpoint = f"https://bedrock-runtime.{region}.amazonaws.com" if isinstance(region, str) and region else ""
            data = {**data, "baseUrl": endpoint}
        return data

    @model_validator(mode="before")
    @classmethod
    def _vertex_defaults(cls, data: Any) -> Any:
        """A vertex provider's endpoint from its project and location. Without both its ``baseUrl``
        is left empty, so validation reports ``gcpProject`` or ``gcpLocation``; they are checked
        there before the endpoint they made is used."""
        if not isinstance(data, dict) or data.get("type") != "vertex" or "baseUrl" in data:
            return data
        project, location = data.get("gcpProject"), data.get("gcpLocation")
        if isinstance(project, str) and project and isinstance(location, str) and location:
            return {**data, "baseUrl": vertex_base_url(project, location)}
        return {**data, "baseUrl": ""}


class RouteConfig(_Model):
    id: str
    provider: str
    model: str
    providerFormat: str
    priority: int = 0
    weight: int = 100
    regions: list[str] = Field(default_factory=list)
    capabilities: list[str] | None = None
    """Narrows what this route can serve; defaults to everything its provider format can do.
    ``assistantPrefill`` (only ever declared) says the route continues a trailing assistant message."""
    contextWindowTokens: int | None = Field(default=None, ge=1)
    """The deployment's context window; defaults to the alias's. A context-length refusal moves on
    only to routes that declare a larger one."""
    publicModel: str | None = None
    """What a response's ``model`` says under ``responseModel: route``; defaults to the route id."""
    requireConformance: bool | None = None
    """Overrides ``conformance.requireConformance`` for this route."""


class ModelConfig(_Model):
    name: str
    clientFormats: list[str] = Field(
        default_factory=lambda: ["openai-chat-completions", "anthropic-messages", "openai-responses"]
    )
    """The client APIs that may call this alias (``POST /v1/chat/completions``, ``/v1/messages``,
    ``/v1/responses``); every chat format by default."""
    operations: list[str] = Field(default_factory=lambda: ["chat"])
    """``chat`` (the three chat client APIs) or ``embeddings`` (``POST /v1/embeddings``): one per
    alias, since a model that does one does not do the other. An embeddings alias's client
    format is ``openai-embeddings``, and every route's provider format must be able to embed."""
    piiProfileId: str | None = None
    """The PII profile (``pii.profiles``) applied to this alias's requests; none: no tokenization."""
    contentMode: Literal["metadata-only", "disabled", "tokenized-content", "encrypted-raw"] | None = None
    """What is kept of this alias's exchanges (docs/export.md): ``metadata-only`` (the audit record
    alone), ``disabled`` (no audit record), ``tokenized-content`` (also the exchange as the provider
    saw it, placeholders and all) or ``encrypted-raw`` (also what the client sent and got back, under
    a shorter retention). Unset: ``audit.contentMode``."""
    contentSampleRate: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of requests whose content is captured, in the two content modes (by request id)."""
    contentRetentionClass: str | None = None
    """A class of ``content.retentionClasses``; unset: ``standard``, or ``restricted`` for ``encrypted-raw``."""
    contentPurposes: list[Literal["evaluation", "training"]] = Field(default_factory=list)
    """What captured content may be exported for beyond ``audit``: the consent it is captured under.
    ``encrypted-raw`` content is for ``audit`` only."""
    maxEmbeddingInputs: int = Field(default=2048, ge=1, le=100_000)
    """The most inputs one embeddings request may carry (providers cap a batch: OpenAI at 2048)."""
    processingMode: str = "normalized"
    capabilities: list[str] = Field(default_factory=lambda: ["streaming"])
    maxInputTokens: int = 128000
    maxOutputTokens: int = 8192
    defaultMaxOutputTokens: int | None = None
    dataClassifications: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)
    allowedParameters: list[str] = Field(default_factory=list)
    """Pass-through fields this alias accepts beyond the compatibility profile."""
    imageUrlPolicy: Literal["data-only", "https-public", "any"] = "https-public"
    """Which image URLs a request may carry to this alias's providers: ``data-only`` (inline
    ``data:image/`` only), ``https-public`` (also https URLs whose host is not a loopback,
    private, link-local, metadata or otherwise non-public address), ``any`` (also plain http and
    any host). A provider that fetches image URLs must never become a way into this network."""
    unsupportedParameterPolicy: str | None = None
    contextWindowTokens: int | None = Field(default=None, ge=1)
    """The context window of routes that declare none of their own."""
    responseModel: Literal["alias", "route"] = "alias"
    """``alias``: responses name the alias. ``route``: the answering route's ``publicModel``."""
    streamRecovery: Literal["none", "continue"] = "none"
    """``continue``: a text stream cut or stalled after its first token goes on, on a route that
    declares ``assistantPrefill``, from what the client already has."""
    strategy: str | None = None
    """Overrides ``routing.strategy`` for this alias."""
    canary: CanaryConfig | None = None
    """With ``strategy: canary``: the buckets, by basis points of 10,000, and the routes of each."""
    routes: list[RouteConfig]


class CircuitBreakerConfig(_Model):
    failureThreshold: int = 5
    resetTimeoutMs: int = 5000
    halfOpenRequests: int = 1
    failureRateThreshold: float = Field(default=0.5, gt=0)
    """Also open when this share of the verdicts in the window failed (1.0 or more: off)."""
    minRequests: int = Field(default=20, ge=1)
    windowMs: int = Field(default=30000, ge=100)
    maxResetTimeoutMs: int | None = None
    """Each re-open after a failed probe multiplies the cool-down (``backoffMultiplier``), up to this;
    while the deployment stays down it is probed once per this long. Unset: 10000, or
    ``resetTimeoutMs`` if that is longer."""
    backoffMultiplier: float = Field(default=2.0, ge=1)


class OutlierDetectionConfig(_Model):
    """Eject a deployment whose error rate or latency is far behind its priority group's median."""

    enabled: bool = True
    errorRateMargin: float = Field(default=0.3, gt=0, le=1)
    latencyFactor: float = Field(default=3.0, gt=1)
    minRequests: int = Field(default=5, ge=1)
    baseEjectionMs: int = Field(default=30000, ge=1)
    maxEjectionMs: int = Field(default=300000, ge=1)
    maxEjectionFraction: float = Field(default=0.5, ge=0, le=1)


class CanarySplitConfig(_Model):
    name: str = Field(min_length=1, max_length=64)
    basisPoints: int = Field(ge=0, le=10000)
    routes: list[str] = Field(min_length=1)


class CanaryConfig(_Model):
    """A stable, auditable split: a hash of (principal or request id, alias, salt) picks the bucket."""

    salt: str = Field(min_length=1, max_length=128)
    key: Literal["principal", "request"] = "principal"
    splits: list[CanarySplitConfig] = Field(min_length=1, max_length=16)


class RoutingConfig(_Model):
    strategy: str = "priority-weighted"
    maxAttempts: int = 3
    baseBackoffMs: int = 100
    maxBackoffMs: int = 2000
    retryStatuses: list[int] = Field(default_factory=lambda: [408, 429, 500, 502, 503, 504, 529])
    """529 is Anthropic's "overloaded"."""
    sameRouteRetries: int = Field(default=1, ge=0, le=5)
    """How often one route may be retried within a request before only other routes are tried."""
    maxRetryAfterMs: int = Field(default=5000, ge=0, le=600000)
    """The longest provider ``Retry-After`` the gateway waits for; a longer one takes the deployment
    out of rotation for that long instead."""
    circuitBreaker: CircuitBreakerConfig = Field(default_factory=CircuitBreakerConfig)
    outlierDetection: OutlierDetectionConfig = Field(default_factory=OutlierDetectionConfig)
    leastInFlightMaxWeightBias: float = Field(default=4.0, ge=1)
    latencyExploreProbability: float = Field(default=0.1, ge=0, le=0.5)
    latencyTtftWeight: float = Field(default=0.5, ge=0, le=1)
    sessionHeader: str = "X-Tollway-Session-Id"


class AdmissionConfig(_Model):
    maxQueuedRequests: int = 0
    maxQueueWaitMs: int = 0
    overloadStatus: Literal[429, 503] = 503
    maxEventLoopLagMs: int = 50
    """Shed new requests while the process's event loop lags more than this, sustained and from its
    own work (``tollway.pipeline.admission.Admission``); 0 turns it off."""
    streamBufferEvents: int = 32
    streamSetupTimeoutMs: int = 5000
    maxStreamLifetimeMs: int = 120000
    downstreamWriteProgressTimeoutMs: int = 10000
    minStreamDrainBytesPerSecond: int = 256
    """Judged over the time the gateway waited for the client to take frames, after the grace."""
    streamDrainGraceMs: int = Field(default=10000, ge=0)
    bodyReadTimeoutMs: int = 10000
    headerReadTimeoutMs: int = Field(default=10000, ge=100, le=600000)
    """A request's headers must be complete this long after its first byte (server mode; fixed at start)."""
    maxRequestHeaderBytes: int = Field(default=64 * 1024, ge=4096, le=1024 * 1024)
    """The request line and header section, as received, may not exceed this (431; server mode; fixed at start)."""
    maxRequestHeaders: int = Field(default=100, ge=16, le=1000)
    """At most this many header lines per request (431; server mode; fixed at start)."""


class KeyConfig(_Model):
    id: str
    sha256: str | None = None
    secretRef: str | None = None


class PrincipalConfig(_Model):
    id: str
    tenant: str
    team: str | None = None
    kind: Literal["service", "user", "agent"] = "service"
    roles: list[str] = Field(default_factory=list)
    allowedModels: list[str] = Field(default_factory=list)
    keys: list[KeyConfig] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)
    """Where this principal's traffic may be processed. A hard filter on routes (their ``regions``,
    or the alias's): a route that declares none is not eligible. Empty: no restriction."""
    dataClass: str | None = None
    """The classification of this principal's traffic; an alias must list it in ``dataClassifications``."""


class LimitsConfig(_Model):
    """Limits of one scope. Unset means no limit at this scope."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    maxInputTokens: int | None = Field(default=None, ge=1)
    maxOutputTokens: int | None = Field(default=None, ge=1)
    maxConcurrentRequests: int | None = Field(default=None, ge=1)
    """Per gateway process (docs/governance.md): concurrency is not leased across replicas."""
    maxConcurrentStreams: int | None = Field(default=None, ge=1)


class BudgetConfig(_Model):
    window: Literal["minute", "day", "month", "lifetime"]
    usd: float = Field(gt=0, le=1e9)


class PolicyConfig(_Model):
    """Limits and budgets of one scope: ``tenant:<id>``, ``team:<tenant>/<team>``, ``principal:<id>``
    or ``key:<key id>``, optionally narrowed to one alias. Every policy that matches a request applies."""

    scope: str = Field(min_length=3, max_length=256)
    alias: str | None = None
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    budgets: list[BudgetConfig] = Field(default_factory=list, max_length=8)


class QuotaGroupConfig(_Model):
    """A provider account's approved capacity, shared by every credential and deployment in the group."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)


class PricingConfig(_Model):
    """Where prices come from: a catalog and overrides compiled at load (local), or published
    snapshots in S3 (``bucket``) that the pricing-refresh function writes (docs/pricing.md)."""

    catalogFile: str = ""
    """A models.dev-shaped catalog."""
    overridesFile: str = ""
    bucket: str = ""
    """``$TOLLWAY_BUCKET_PRICING`` on AWS; a snapshot there replaces the files' prices when it loads."""
    prefix: str = "pricing"
    refreshIntervalMs: int = Field(default=60000, ge=1000)


class ConformanceConfig(_Model):
    """Conformance results per deployment (docs/conformance.md): what ``tollway conformance run``
    found each provider deployment can actually do, and whether publication requires it."""

    results: str = ""
    """Where results are kept: a directory, or ``s3://bucket/prefix``. Empty: ``$TOLLWAY_CONFORMANCE_RESULTS``
    if set, else ``.tollway/conformance``."""
    requireConformance: bool = False
    """Publication requires, for every route (unless the route says otherwise), a passing result no
    older than ``maxAgeHours`` for each capability the route declares."""
    maxAgeHours: int = Field(default=168, ge=1, le=24 * 366)


class GovernanceConfig(_Model):
    """Token and cost governance (docs/governance.md). No policies and no quota groups: off."""

    store: Literal["memory", "dynamodb"] = "memory"
    """``memory``: counters in this process only (one replica). ``dynamodb``: leases from the shared table."""
    table: str = ""
    """The quota-leases table; empty uses ``$TOLLWAY_TABLE_QUOTA_LEASES``."""
    leaseFraction: float = Field(default=0.02, gt=0, le=1)
    leaseWaitMs: int = Field(default=1000, ge=0, le=30000)
    """How long a request may wait for a lease when the local one is empty; then it fails closed."""
    pricing: PricingConfig = Field(default_factory=PricingConfig)
    policies: list[PolicyConfig] = Field(default_factory=list)
    quotaGroups: dict[str, QuotaGroupConfig] = Field(default_factory=dict)


class AuditSpoolConfig(_Model):
    """The write-ahead log every audit event passes through (one directory per worker process)."""

    path: str = ".tollway/audit-wal"
    persistenceClass: Literal["ephemeral", "persistent"] = "ephemeral"
    """``persistent`` declares a volume that survives process restart (a disk, EFS); local-durable needs it."""
    maxBytes: int = 1024 * 1024 * 1024
    segmentBytes: int = 64 * 1024 * 1024
    maxRecordBytes: int = 64 * 1024
    maxBatchRecords: int = 256
    maxBatchBytes: int = 1024 * 1024
    maxCommitDelayMs: int = 1
    commitTimeoutMs: int = 10000
    asyncWriteDelayMs: int = 10
    """``bounded-async`` in server mode: how long appended events may wait in memory before the
    event loop writes them to the OS, the crash-loss window in time (docs/audit.md)."""


class AuditSinkConfig(_Model):
    """Where the shipper sends WAL records: an SQS queue (default) or a Kafka topic."""

    type: Literal["none", "sqs", "kafka"] = "none"
    queueName: str = ""
    """SQS queue name; empty uses ``$TOLLWAY_QUEUE_AUDIT`` (set by the CDK app and ``tollway up``)."""
    usageQueueName: str = ""
    """Where ``request_finished`` events also go, for the usage reconciler; empty uses
    ``$TOLLWAY_QUEUE_USAGE``, and neither set means no usage fan-out."""
    bootstrapServers: str = ""
    topic: str = "tollway-audit-events"
    batchSize: int = 512
    flushIntervalMs: int = 500
    """How often the shipper drains when it has caught up: fewer, fuller sends against delivery delay."""
    shipPriority: Literal["idle", "low"] = "idle"
    """Server mode's ship process: ``idle`` ships from a ``SCHED_IDLE`` thread on Linux (a core only
    when no ordinary thread wants it, apart from a sliver; the main thread, at niceness 10, takes
    over when that one falls behind), ``low`` at niceness 10 only (docs/audit.md)."""


class AuditConfig(_Model):
    """The metadata-only audit trail (docs/audit.md). ``sink.type: none`` turns it off."""

    durability: Literal["bounded-async", "local-durable"] = "bounded-async"
    contentMode: Literal["metadata-only", "disabled"] = "metadata-only"
    terminalCommitBeforeResponse: bool = True
    terminalCommitBeforeDone: bool = False
    """Streams under ``local-durable``: hold ``data: [DONE]`` until the request's terminal event is
    durable, so a client that saw ``[DONE]`` is never left with an incomplete audit record."""
    spool: AuditSpoolConfig = Field(default_factory=AuditSpoolConfig)
    sink: AuditSinkConfig = Field(default_factory=AuditSinkConfig)


class CorsConfig(_Model):
    """Cross-origin access for browser apps; no ``allowedOrigins`` (the default): no CORS headers at all."""

    allowedOrigins: list[str] = Field(default_factory=list, max_length=64)
    """Exact origins (``https://app.example.com``), or ``*`` for any origin (keys are never cookies)."""
    allowedHeaders: list[str] = Field(default_factory=lambda: ["*"])
    """Request headers a browser may send; ``*`` (the default) allows what the preflight asks for,
    which the SDKs need (they send a family of ``x-stainless-*`` headers). Credentials (cookies)
    are never allowed: a Tollway key travels in a header."""
    maxAgeSeconds: int = Field(default=600, ge=0, le=86400)


class MetricsConfig(_Model):
    """Prometheus metrics (docs/observability.md). Fixed at start: a reload does not change them."""

    enabled: bool = True
    path: str = Field(default="/metrics", pattern=r"^/[A-Za-z0-9/_.-]*$")
    access: Literal["admin", "public"] = "admin"
    """On the gateway's own listener: ``admin`` answers only a key with the admin role (a scraper
    sends it as a bearer token); ``public`` answers anyone who can reach the port."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """A separate listener for the scrape instead (no key; bound to ``host``). The gateway's own
    listener then has no metrics path. In server mode the supervisor serves it, aggregated
    across the worker processes."""
    host: str = "127.0.0.1"
    maxLabelSets: int = Field(default=2000, ge=10, le=100000)
    """The cardinality guard: a metric refuses a new label-value set past this many (each refusal
    is counted on ``tollway_metric_label_sets_refused_total``, and nothing is exported for it)."""
    overheadHeader: bool = False
    """Put ``x-tollway-overhead-ms`` (the time the gateway itself added) on every answer."""


class TracingConfig(_Model):
    """OpenTelemetry traces over OTLP/HTTP; off by default (docs/observability.md). Fixed at start."""

    enabled: bool = False
    endpoint: str = ""
    """The collector's OTLP/HTTP traces URL, e.g. ``http://127.0.0.1:4318/v1/traces``; empty uses
    ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, then ``$OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``."""
    sampleRatio: float = Field(default=0.01, ge=0, le=1)
    """The share of requests traced when no sampled ``traceparent`` decides for them."""
    honourTraceparent: bool = True
    """A client's W3C ``traceparent`` makes the request's span its child and decides the sampling."""
    propagateUpstream: bool = False
    """Send ``traceparent`` to the provider on each traced attempt (off: a provider learns nothing of
    the client's trace)."""
    serviceName: str = Field(default="tollway", min_length=1, max_length=128)
    exportTimeoutMs: int = Field(default=5000, ge=100, le=60000)
    maxQueueSize: int = Field(default=2048, ge=16, le=1_000_000)
    """Spans waiting for export; past it new spans are dropped (and counted), never waited for."""


class TelemetryConfig(_Model):
    """Metrics, traces and logs (docs/observability.md)."""

    environment: str = Field(default="local", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """The ``environment`` label on every metric, and the traces' ``deployment.environment.name``."""
    logFormat: Literal["json", "text"] = "json"
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)


class PiiPatternConfig(_Model):
    """A custom detector: a regular expression whose matches are PII of type ``name``."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    pattern: str = Field(min_length=1, max_length=1000)


class PiiDictionaryConfig(_Model):
    """Literal terms (customer names, project code names) matched as whole words."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    terms: list[str] = Field(min_length=1, max_length=100_000)
    caseSensitive: bool = False


class PiiProfileConfig(_Model):
    """What an alias's requests are scanned for, how placeholders are scoped, and what happens to a
    placeholder that does not come back intact (docs/pii.md)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    detectors: list[str] = Field(default_factory=lambda: ["email", "phone", "card", "iban", "ssn", "ipv4", "ipv6"])
    customPatterns: list[PiiPatternConfig] = Field(default_factory=list, max_length=64)
    dictionaries: list[PiiDictionaryConfig] = Field(default_factory=list, max_length=16)
    engine: Literal["rules", "presidio"] = "rules"
    """``rules``: the local compiled rules only. ``presidio``: those plus Presidio's named-entity
    model for the ``person`` and ``location`` detectors; needs the ``presidio`` extra installed."""
    scope: Literal["request", "session", "host"] = "request"
    """``request``: mappings in the request's memory only. ``session``: in the vault, for the
    principal's session (the session header). ``host``: stable across requests, linkable; refused
    unless ``allowHostScope``."""
    allowHostScope: bool = False
    unresolvedTokenPolicy: Literal["leave-masked", "reject-buffered"] = "leave-masked"
    streaming: bool = True
    """Whether the alias may still stream. ``reject-buffered`` needs ``false``: the whole answer is
    checked before any of it leaves."""
    promptEnrichment: bool = False
    """Add a short server-owned instruction to copy placeholders verbatim."""
    dataClassifications: list[str] = Field(default_factory=list)
    """The data classifications this profile covers; an alias that uses it may not claim others."""
    sessionTtlSeconds: int = Field(default=3600, ge=60, le=7 * 24 * 3600)
    """How long a session or host mapping lives in the vault."""
    minPreservationRate: float | None = Field(default=None, ge=0, le=1)
    """The share of placeholders a deployment must bring back exactly, as measured over the
    preservation corpus (``pii.conformanceFile``), for an alias with this profile to be published
    on it; ``None``: no requirement."""


class PiiVaultConfig(_Model):
    """Where ``session`` and ``host`` mappings live (docs/pii-vault.md)."""

    type: Literal["dynamodb", "memory"] = "dynamodb"
    """``memory`` is one process's, lost on restart: for tests, never a durable scope."""
    table: str = ""
    """Empty uses ``$TOLLWAY_TABLE_PII_VAULT``."""
    kmsKeyId: str = ""
    """Empty uses ``$TOLLWAY_PII_KMS_KEY_ID``."""


class PiiConfig(_Model):
    """Reversible PII tokenization (docs/pii.md): profiles, the placeholder key, the vault."""

    keySecretRef: str | None = None
    """The key that authenticates placeholders (``env:NAME`` or ``aws-sm:<id>``, 32 bytes or more);
    required once an alias uses a profile. Further keys, for rotation, in ``previousKeySecretRefs``."""
    previousKeySecretRefs: list[str] = Field(default_factory=list, max_length=4)
    vault: PiiVaultConfig | None = None
    profiles: list[PiiProfileConfig] = Field(default_factory=list)
    conformanceFile: str = ""
    """The results ``tollway pii conformance`` wrote, read at every publication when a profile sets
    ``minPreservationRate``; a relative path is relative to the config file's folder."""


class ContentStoreConfig(_Model):
    """The content store: an S3 bucket, objects envelope-encrypted under a KMS key's data keys."""

    type: Literal["s3", "memory"] = "s3"
    """``memory``: this process's, lost on exit (tests)."""
    bucket: str = ""
    """Empty uses ``$TOLLWAY_BUCKET_CONTENT``."""
    kmsKeyId: str = ""
    """Empty uses ``$TOLLWAY_CONTENT_KMS_KEY_ID``."""


class RetentionClassConfig(_Model):
    days: int = Field(ge=1, le=3650)


class ContentConfig(_Model):
    """Captured content (``contentMode`` of an alias), where it goes and how long it stays (docs/export.md)."""

    store: ContentStoreConfig | None = None
    retentionClasses: dict[str, RetentionClassConfig] = Field(
        default_factory=lambda: {"standard": RetentionClassConfig(days=30), "restricted": RetentionClassConfig(days=7)}
    )
    """Each class's lifetime; the CDK app gives the content bucket one lifecycle rule per class."""
    maxRawRetentionDays: int = Field(default=7, ge=1)
    """``encrypted-raw`` content may only use a class this short or shorter."""
    noCaptureClassifications: list[str] = Field(default_factory=lambda: ["restricted", "secret"])
    """An alias that lists one of these ``dataClassifications`` may not capture content."""
    maxPending: int = Field(default=1000, ge=1)
    """Captured exchanges waiting for the store; beyond it (or ``maxPendingBytes``) one is dropped,
    counted and recorded, while its metadata is kept."""
    maxPendingBytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    maxRecordBytes: int = Field(default=1024 * 1024, ge=1024)
    """One exchange larger than this is not captured (``too_large``)."""


class RouterConfig(_Model):
    enabled: bool = True
    pathPrefix: str = "/v1"
    maxRequestBodyBytes: int = 4 * 1024 * 1024
    maxResponseBodyBytes: int = 16 * 1024 * 1024
    requestTimeoutMs: int = 120000
    streamIdleTimeoutMs: int = 30000
    maxConcurrentRequests: int = 1024
    maxConcurrentStreams: int = 512
    unsupportedParameterPolicy: str = "reject"
    httpClient: Literal["h1", "aiohttp", "httpx"] = "h1"
    """The upstream HTTP client library (docs/benchmarks.md has the numbers behind the default)."""
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    cors: CorsConfig = Field(default_factory=CorsConfig)
    """Fixed at start: a reload does not change it."""
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: list[ModelConfig] = Field(default_factory=list)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    principals: list[PrincipalConfig] = Field(default_factory=list)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    governance: GovernanceConfig = Field(default_factory=GovernanceConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    content: ContentConfig = Field(default_factory=ContentConfig)
    conformance: ConformanceConfig = Field(default_factory=ConformanceConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """Fixed at start: a reload does not change it."""
