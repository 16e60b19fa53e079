"""The immutable published root and the publisher that compiles it.

A request captures ``holder.root`` once at admission and keeps that object to its end.
``Publisher.publish`` compiles a validated ``RouterConfig`` into a new root off the request
path; ``RootHolder.swap`` installs it with a single assignment. Transports whose settings did
not change are carried over, so a reload does not drop warm connection pools, and health
state lives in the ``HealthRegistry`` outside every root.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

import orjson

from tollway.config.governance import compile_governance, compile_pricing, load_pricing_files, route_prices
from tollway.config.pii import compile_pii_profiles, pii_keys
from tollway.config.schema import ModelConfig, ProviderConfig, RouterConfig
from tollway.config.validate import CAPTURING_MODES, content_retention_class
from tollway.conformance import check_config
from tollway.exceptions import ConfigError, ConfigIssue, UpstreamError
from tollway.governance.policy import GovernanceSnapshot, PricingView
from tollway.governance.principals import Principal, key_digest
from tollway.pii.policy import PiiKeys, PiiProfile
from tollway.pricing import PricingSnapshot
from tollway.providers import FORMAT_CAPABILITIES, codec_for, embeddings_codec_for, provider_name
from tollway.providers.base import AnyCodec, ProviderFormat, Target
from tollway.providers.gemini import VertexGeminiCodec
from tollway.providers.gemini.vertex_auth import VertexTokenSigner, google_credentials
from tollway.routing.health import CircuitPolicy, HealthRegistry, OutlierPolicy
from tollway.routing.plan import AliasPlan, ContentPolicy, Deployment, RetryPolicy, RouteTarget
from tollway.routing.strategies import (
    Canary,
    CanarySplit,
    LatencyAware,
    LeastInFlight,
    Ordered,
    Sticky,
    Strategy,
    WeightedRandom,
)
from tollway.secrets import SecretResolver
from tollway.transport import Transport, TransportSettings, build_transport
from tollway.transport.base import ProxySettings, TransportFactory, basic_proxy_authorization
from tollway.transport.sigv4 import RequestSigner, Signer, botocore_credentials

if TYPE_CHECKING:
    from tollway.pipeline.stage import Stage

__all__ = [
    "ASSISTANT_PREFILL",
    "DEFAULT_MAX_RESET_TIMEOUT_MS",
    "GatewayLimits",
    "PublishedRoot",
    "Publisher",
    "RootHolder",
]

ASSISTANT_PREFILL = "assistantPrefill"
"""The route capability ``streamRecovery: continue`` needs: the provider continues a trailing
assistant message instead of answering it."""
DEFAULT_MAX_RESET_TIMEOUT_MS = 10000
"""``circuitBreaker.maxResetTimeoutMs`` when unset: a recovered deployment is back within 10 s."""


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    max_request_body_bytes: int
    request_timeout_s: float
    max_concurrent_requests: int
    max_concurrent_streams: int
    overload_status: int
    body_read_timeout_s: float
    max_stream_lifetime_s: float
    downstream_write_timeout_s: float
    session_header: str
    path_prefix: str = "/v1"
    max_loop_lag_s: float = float("inf")
    """Shed new requests while the event loop's sustained lag of its own making is over this
    (``inf``: never); ``Admission`` has the rule."""
    stream_setup_timeout_s: float = 5.0
    """From dispatch to a stream's first semantic event; past it the attempt fails as a timeout."""
    min_drain_bytes_per_s: float = 0.0
    """A client that drains slower than this while the gateway waits on it is cut off (0: never)."""
    drain_grace_s: float = 10.0
    """How long a client may wait-drain before its rate is judged."""
    max_queued_requests: int = 0
    """Requests that may wait for a request permit (0: fail fast)."""
    max_queue_wait_s: float = 0.0


@dataclass(frozen=True, slots=True, eq=False)
class PublishedRoot:
    generation: int
    digest: str
    limits: GatewayLimits
    aliases: Mapping[str, AliasPlan]
    keys: Mapping[str, Principal]
    """Principal by SHA-256 key digest."""
    deployments: Mapping[str, Deployment]
    governance: GovernanceSnapshot = field(default_factory=GovernanceSnapshot)
    """Limits per key and alias, capacity per quota group (tollway.governance.policy)."""
    pricing: PricingView = field(default_factory=lambda: PricingView(None, MappingProxyType({}), MappingProxyType({})))
    """The pricing sub-snapshot: replaced alone by a pricing-only update."""
    pii_keys: PiiKeys | None = None
    """The placeholder keys, when some alias has a PII profile (``pii.keySecretRef``)."""

    def __repr__(self) -> str:
        return f"PublishedRoot(generation={self.generation}, digest={self.digest[:12]})"


StageCompiler: TypeAlias = "Callable[[PublishedRoot, AliasPlan], tuple[Stage, ...]]"
"""What ``Publisher.stages`` is: an alias plan's stages, in order, for the root being published."""


class RootHolder:
    """The one mutable reference to the active root. Reads are a plain attribute load."""

    __slots__ = ("root",)

    def __init__(self, root: PublishedRoot) -> None:
        self.root = root

    def swap(self, root: PublishedRoot) -> PublishedRoot:
        old, self.root = self.root, root
        return old


_DEFAULT_FORMAT: Final = {
    "anthropic": ProviderFormat.ANTHROPIC_MESSAGES,
    "bedrock": ProviderFormat.BEDROCK_CONVERSE,
    "gemini": ProviderFormat.GEMINI,
    "vertex": ProviderFormat.GEMINI,
}
"""The wire format of a provider no route names (its transport still needs auth headers)."""


def _auth_headers(provider: ProviderConfig, fmt: ProviderFormat, resolver: SecretResolver, path: str) -> dict[str, str]:
    if provider.authMode == "none" or not provider.credentials or provider.type in ("bedrock", "vertex"):
        return {}  # bedrock, vertex: no static credential, each request is signed (``_signer``)
    current = [c for c in provider.credentials if c.lifecycle == "current"] or list(provider.credentials)
    cred = current[0]
    secret = resolver.resolve(cred.secretRef, f"{path}.credentials[{provider.credentials.index(cred)}].secretRef")
    if fmt is ProviderFormat.ANTHROPIC_MESSAGES:
        return {"x-api-key": secret.reveal(), "anthropic-version": provider.anthropicVersion}
    if fmt is ProviderFormat.GEMINI:
        return {"x-goog-api-key": secret.reveal()}
    return {"authorization": f"Bearer {secret.reveal()}"}


_VERTEX_CODEC: Final = VertexGeminiCodec()


def _codec(provider: ProviderConfig, fmt: ProviderFormat) -> AnyCodec:
    """The format's shared codec; Vertex AI speaks Gemini's bodies under its own paths."""
    return _VERTEX_CODEC if provider.type == "vertex" else codec_for(fmt)


def _signer(provider: ProviderConfig, path: str) -> Signer | None:
    """A bedrock provider's SigV4 signer: credentials from botocore's chain (``awsProfile``, else the
    environment, shared files or role), read now so that none found fails the publication. A vertex
    provider's bearer-token signer: Google credentials (``GOOGLE_APPLICATION_CREDENTIALS``, else
    Application Default Credentials), read now too; its first token is fetched by ``_prime``."""
    if provider.authMode == "none":
        return None
    if provider.type == "vertex":
        return VertexTokenSigner(google_credentials(path=path))
    if provider.type != "bedrock" or provider.awsRegion is None:
        return None
    where = f"{path}.awsProfile" if provider.awsProfile else path
    return RequestSigner(botocore_credentials(provider.awsProfile, path=where), provider.awsRegion)


def _prime_aws(signer: RequestSigner, path: str) -> None:
    """Temporary AWS credentials (a role's), fetched when a transport is built (not on a reload that
    keeps it): a role that cannot give them fails the publication, and requests find them ready.
    The issue names the failure's type, never its text."""
    try:
        signer.prime()
    except Exception as exc:
        raise ConfigError([ConfigIssue(path, f"no AWS credentials: {type(exc).__name__}")]) from None


def _prime(signer: VertexTokenSigner, path: str) -> None:
    """The first access token, fetched when a transport is built (not on a reload that keeps it):
    credentials the token endpoint refuses fail the publication, and requests find a token ready."""
    try:
        signer.prime()
    except UpstreamError as exc:
        raise ConfigError([ConfigIssue(path, f"no Google access token: {exc.detail}")]) from None


def _proxy(provider: ProviderConfig, resolver: SecretResolver, path: str) -> ProxySettings | None:
    """The provider's proxy, with its ``Proxy-Authorization`` value when it has credentials."""
    if provider.proxyUrl is None:
        return None
    ref = provider.proxyCredentialsSecretRef
    if ref is None:
        return ProxySettings(provider.proxyUrl)
    where = f"{path}.proxyCredentialsSecretRef"
    credentials = resolver.resolve(ref, where).reveal()
    user, colon, _ = credentials.partition(":")
    if not colon or not user:
        raise ConfigError([ConfigIssue(where, "the secret must have the form user:password")])
    return ProxySettings(provider.proxyUrl, basic_proxy_authorization(credentials))


def _ca_bundle(provider: ProviderConfig, config_dir: Path | None, path: str) -> tuple[str, ssl.SSLContext, str] | None:
    """The provider's CA bundle: its path, the verifying context built from it once, here, and a
    digest of its bytes (a reload after the file changed builds a new transport)."""
    if provider.caBundle is None:
        return None
    where = f"{path}.caBundle"
    bundle = Path(provider.caBundle).expanduser()
    if not bundle.is_absolute() and config_dir is not None:
        bundle = config_dir / bundle
    try:
        digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
        context = ssl.create_default_context(cafile=str(bundle))
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            raise ConfigError([ConfigIssue(where, f"{bundle} holds no PEM CA certificate that loads")]) from None
        raise ConfigError([ConfigIssue(where, f"{bundle} cannot be read ({type(exc).__name__})")]) from None
    return str(bundle), context, digest


def _content_policy(model: ModelConfig, cfg: RouterConfig) -> ContentPolicy | None:
    """The alias's capture, when its content mode (its own, else the audit block's) stores content."""
    if model.contentMode not in CAPTURING_MODES:
        return None
    return ContentPolicy(
        mode=model.contentMode or "",
        sample_rate=model.contentSampleRate,
        retention_class=content_retention_class(model),
        purposes=("audit", *model.contentPurposes),
        max_record_bytes=cfg.content.maxRecordBytes,
    )


def _client_formats(model: ModelConfig) -> frozenset[str]:
    """The client APIs an alias is served over: as configured, else by its operation (an
    embeddings alias over ``openai-embeddings``, a chat alias over the three chat APIs)."""
    if "embeddings" in model.operations and "clientFormats" not in model.model_fields_set:
        return frozenset({"openai-embeddings"})
    return frozenset(model.clientFormats)


def _strategy(model: ModelConfig, cfg: RouterConfig) -> Strategy:
    name = model.strategy or cfg.routing.strategy
    routing = cfg.routing
    if name == "canary" and model.canary is not None:
        splits = tuple(CanarySplit(s.name, s.basisPoints, frozenset(s.routes)) for s in model.canary.splits)
        return Canary(alias=model.name, salt=model.canary.salt, splits=splits, key=model.canary.key)
    if name == "least-in-flight":
        return LeastInFlight(max_weight_bias=routing.leastInFlightMaxWeightBias)
    if name == "latency-aware":
        return LatencyAware(
            explore_probability=routing.latencyExploreProbability, ttft_weight=routing.latencyTtftWeight
        )
    if name == "sticky":
        return Sticky()
    if name == "ordered":
        return Ordered()
    return WeightedRandom()


def _outlier(cfg: RouterConfig) -> OutlierPolicy | None:
    o = cfg.routing.outlierDetection
    if not o.enabled:
        return None
    return OutlierPolicy(
        error_rate_margin=o.errorRateMargin,
        latency_factor=o.latencyFactor,
        min_requests=o.minRequests,
        base_ejection_s=o.baseEjectionMs / 1000,
        max_ejection_s=o.maxEjectionMs / 1000,
        max_ejection_fraction=o.maxEjectionFraction,
    )


@dataclass
class Publisher:
    """Compiles configs into roots; owns what must outlive one root (health, warm transports)."""

    resolver: SecretResolver = field(default_factory=SecretResolver)
    health: HealthRegistry = field(default_factory=HealthRegistry)
    transport_factory: TransportFactory = build_transport
    """Builds each provider's pooled client; tests pass one whose deployments answer from a script."""
    _transports: dict[str, tuple[str, Transport]] = field(default_factory=dict)
    _open: list[Transport] = field(default_factory=list)
    """Every transport built and not yet closed, including ones a newer root replaced."""
    _undo: list[tuple[str, tuple[str, Transport] | None, Transport]] = field(default_factory=list)
    """What the last publication changed in the cache, until it is committed or discarded: each
    provider id, its previous entry, and the transport built in its place."""
    _generation: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    config_dir: Path | None = None
    """Where relative pricing file paths resolve (the config file's folder)."""
    published_pricing: PricingSnapshot | None = None
    """The last snapshot loaded from the pricing store; it wins over the config's files on reload."""
    stages: StageCompiler | None = None
    """Compiles each alias plan's request stages (``tollway.pipeline.compile``); ``None``: none."""

    def with_pricing(self, root: PublishedRoot, snapshot: PricingSnapshot) -> PublishedRoot:
        """A pricing-only update: a new root sharing every other sub-snapshot object with ``root``."""
        self.published_pricing = snapshot
        view = compile_pricing(snapshot, root.aliases, root.pricing.routes)
        return self.restage(dataclasses.replace(root, generation=next(self._generation), pricing=view))

    def restage(self, root: PublishedRoot) -> PublishedRoot:
        """``root`` with its plans' stages compiled again: after a pricing update (which may turn
        the governance stage on), or once the process's audit recorder is open."""
        compile_stages = self.stages
        if compile_stages is None:
            return root
        staged = {name: compile_stages(root, plan) for name, plan in root.aliases.items()}
        if all(staged[name] == plan.stages for name, plan in root.aliases.items()):
            return root  # nothing changed: the root keeps sharing its plans (a pricing-only update)
        aliases = {name: dataclasses.replace(plan, stages=staged[name]) for name, plan in root.aliases.items()}
        return dataclasses.replace(root, aliases=MappingProxyType(aliases))

    def commit(self) -> None:
        """The last publication's root went live: the transports it built stay."""
        self._undo.clear()

    def discard(self) -> list[Transport]:
        """The last publication's root will not go live (it failed, was rejected or changed
        nothing): the cache is as it was before it, and the transports it built, which no request
        has used, are returned to be closed."""
        built: list[Transport] = []
        for pid, previous, transport in reversed(self._undo):
            if previous is None:
                self._transports.pop(pid, None)
            else:
                self._transports[pid] = previous
            if transport in self._open:
                self._open.remove(transport)
            built.append(transport)
        self._undo.clear()
        return built

    def publish(self, cfg: RouterConfig) -> PublishedRoot:
        """Compile ``cfg`` (already validated) into a new root. Raises ``ConfigError``. Until
        :meth:`commit` or :meth:`discard`, the transports it builds replace their providers' cached
        ones, and the next publication starts a new record."""
        self._undo.clear()
        issues = check_config(cfg, self.config_dir)  # reads results only when a route requires them
        if issues:
            raise ConfigError(issues)
        digest = hashlib.sha256(orjson.dumps(cfg.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()
        limits = GatewayLimits(
            max_request_body_bytes=cfg.maxRequestBodyBytes,
            request_timeout_s=cfg.requestTimeoutMs / 1000,
            max_concurrent_requests=cfg.maxConcurrentRequests,
            max_concurrent_streams=cfg.maxConcurrentStreams,
            overload_status=cfg.admission.overloadStatus,
            body_read_timeout_s=cfg.admission.bodyReadTimeoutMs / 1000,
            max_stream_lifetime_s=cfg.admission.maxStreamLifetimeMs / 1000,
            downstream_write_timeout_s=cfg.admission.downstreamWriteProgressTimeoutMs / 1000,
            stream_setup_timeout_s=cfg.admission.streamSetupTimeoutMs / 1000,
            min_drain_bytes_per_s=float(cfg.admission.minStreamDrainBytesPerSecond),
            drain_grace_s=cfg.admission.streamDrainGraceMs / 1000,
            max_queued_requests=cfg.admission.maxQueuedRequests,
            max_queue_wait_s=cfg.admission.maxQueueWaitMs / 1000,
            session_header=cfg.routing.sessionHeader.lower(),
            path_prefix=cfg.pathPrefix,
            max_loop_lag_s=cfg.admission.maxEventLoopLagMs / 1000 if cfg.admission.maxEventLoopLagMs else float("inf"),
        )
        cb = cfg.routing.circuitBreaker
        circuit = CircuitPolicy(
            failure_threshold=cb.failureThreshold,
            reset_timeout_s=cb.resetTimeoutMs / 1000,
            half_open_requests=cb.halfOpenRequests,
            failure_rate_threshold=cb.failureRateThreshold,
            min_requests=cb.minRequests,
            window_s=cb.windowMs / 1000,
            max_reset_timeout_s=(cb.maxResetTimeoutMs or max(DEFAULT_MAX_RESET_TIMEOUT_MS, cb.resetTimeoutMs)) / 1000,
            backoff_multiplier=cb.backoffMultiplier,
        )
        retry = RetryPolicy(
            max_attempts=cfg.routing.maxAttempts,
            base_backoff_s=cfg.routing.baseBackoffMs / 1000,
            max_backoff_s=cfg.routing.maxBackoffMs / 1000,
            retry_statuses=frozenset(cfg.routing.retryStatuses),
            max_retry_after_s=cfg.routing.maxRetryAfterMs / 1000,
            same_route_retries=cfg.routing.sameRouteRetries,
        )
        deployments = self._deployments(cfg)
        profiles = compile_pii_profiles(cfg, self.config_dir)
        aliases = {m.name: self._plan(m, cfg, deployments, retry, circuit, profiles) for m in cfg.models}
        keys = self._keys(cfg)
        snapshot = self.published_pricing or load_pricing_files(cfg, self.config_dir)
        return self.restage(
            PublishedRoot(
                generation=next(self._generation),
                digest=digest,
                limits=limits,
                aliases=MappingProxyType(aliases),
                keys=MappingProxyType(keys),
                deployments=MappingProxyType(deployments),
                governance=compile_governance(cfg, os.environ.get("TOLLWAY_TABLE_QUOTA_LEASES", "")),
                pricing=compile_pricing(snapshot, aliases, route_prices(cfg)),
                pii_keys=pii_keys(cfg, self.resolver) if any(p.pii for p in aliases.values()) else None,
            )
        )

    def _deployments(self, cfg: RouterConfig) -> dict[str, Deployment]:
        formats: dict[str, ProviderFormat] = {}
        for model in cfg.models:
            for route in model.routes:
                formats.setdefault(route.provider, ProviderFormat(route.providerFormat))
        out: dict[str, Deployment] = {}
        for pid, provider in cfg.providers.items():
            fmt = formats.get(pid) or _DEFAULT_FORMAT.get(provider.type, ProviderFormat.OPENAI_CHAT)
            path = f"providers.{pid}"
            auth = _auth_headers(provider, fmt, self.resolver, path)
            proxy = _proxy(provider, self.resolver, path)
            bundle = _ca_bundle(provider, self.config_dir, path)
            settings = TransportSettings(
                base_url=provider.baseUrl,
                connect_timeout_s=provider.connectTimeoutMs / 1000,
                # a per-read timeout can never outlast the request deadline that bounds the attempt
                request_timeout_s=min(provider.requestTimeoutMs, cfg.requestTimeoutMs) / 1000,
                stream_idle_timeout_s=cfg.streamIdleTimeoutMs / 1000,
                max_connections=provider.maxConnections,
                max_response_bytes=cfg.maxResponseBodyBytes,
                trace_connect=cfg.audit.sink.type != "none",  # per-attempt connect timing is audit data
                proxy=proxy,
                ca_bundle=bundle[0] if bundle is not None else None,
                ssl_context=bundle[1] if bundle is not None else None,
            )
            signer = _signer(provider, path)
            signing: tuple[str | None, ...] | None = None
            if isinstance(signer, VertexTokenSigner):
                signing = ("vertex", os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"))
            elif signer is not None:
                signing = (provider.awsRegion, provider.awsProfile)
            # The settings' repr names the proxy and the bundle's path; what they hold enters as
            # digests: the proxy credential's, and the bundle's bytes.
            proxy_auth = proxy.authorization if proxy is not None else None
            egress = (
                hashlib.sha256(proxy_auth.encode()).hexdigest() if proxy_auth is not None else None,
                bundle[2] if bundle is not None else None,
            )
            fingerprint = hashlib.sha256(
                repr((cfg.httpClient, settings, sorted(auth.items()), signing, egress)).encode()
            ).hexdigest()
            cached = self._transports.get(pid)
            if cached is not None and cached[0] == fingerprint:
                transport = cached[1]
            else:
                if isinstance(signer, VertexTokenSigner):
                    _prime(signer, path)
                elif isinstance(signer, RequestSigner):
                    _prime_aws(signer, path)
                if signer is not None:  # only then: a factory for unsigned providers need not take one
                    transport = self.transport_factory(cfg.httpClient, settings, auth, signer=signer)
                else:
                    transport = self.transport_factory(cfg.httpClient, settings, auth)
                self._open.append(transport)
                self._undo.append((pid, cached, transport))
                self._transports[pid] = (fingerprint, transport)
            out[pid] = Deployment(
                id=pid,
                format=fmt,
                codec=_codec(provider, fmt),
                embeddings=embeddings_codec_for(fmt),
                transport=transport,
                provider_account_id=provider.providerAccountId or pid,
                quota_group_id=provider.quotaGroupId or pid,
                provider_name=provider_name(provider.type, fmt),
            )
        return out

    def _plan(
        self,
        model: ModelConfig,
        cfg: RouterConfig,
        deployments: Mapping[str, Deployment],
        retry: RetryPolicy,
        circuit: CircuitPolicy,
        profiles: Mapping[str, PiiProfile],
    ) -> AliasPlan:
        default_out = model.defaultMaxOutputTokens or min(model.maxOutputTokens, 4096)
        by_priority: dict[int, list[RouteTarget]] = {}
        for route in model.routes:
            dep = deployments[route.provider]
            by_priority.setdefault(route.priority, []).append(
                RouteTarget(
                    route_id=route.id,
                    deployment=dep,
                    target=Target(model=route.model, default_max_output_tokens=default_out),
                    weight=route.weight,
                    priority=route.priority,
                    health=self.health.get(
                        route.provider, circuit, max_in_flight=cfg.providers[route.provider].maxInFlight
                    ),
                    regions=frozenset(route.regions or model.regions),
                    public_model=route.publicModel or route.id,
                    context_window=route.contextWindowTokens or model.contextWindowTokens,
                    prefill=ASSISTANT_PREFILL in (route.capabilities or ()),
                )
            )
        capabilities = frozenset(model.capabilities)
        for group in by_priority.values():
            for t in group:
                if not capabilities <= FORMAT_CAPABILITIES[t.deployment.format]:
                    raise ConfigError(
                        [ConfigIssue(f"models.{model.name}", "a route cannot serve the alias's capabilities")]
                    )
        policy = model.unsupportedParameterPolicy or cfg.unsupportedParameterPolicy
        return AliasPlan(
            name=model.name,
            capabilities=capabilities,
            max_input_tokens=model.maxInputTokens,
            max_output_tokens=model.maxOutputTokens,
            default_max_output_tokens=default_out,
            allowed_parameters=frozenset(model.allowedParameters),
            client_formats=_client_formats(model),
            operation="embeddings" if "embeddings" in model.operations else "chat",
            max_embedding_inputs=model.maxEmbeddingInputs,
            reject_unknown_parameters=policy != "ignore",
            groups=tuple(tuple(by_priority[p]) for p in sorted(by_priority)),
            retry=retry,
            strategy=_strategy(model, cfg),
            outlier=_outlier(cfg),
            data_classes=frozenset(model.dataClassifications),
            image_url_policy=model.imageUrlPolicy,
            response_model=model.responseModel,
            stream_recovery=model.streamRecovery,
            pii=profiles[model.piiProfileId] if model.piiProfileId else None,
            content=_content_policy(model, cfg),
            content_mode=model.contentMode,
        )

    def _keys(self, cfg: RouterConfig) -> dict[str, Principal]:
        out: dict[str, Principal] = {}
        for i, p in enumerate(cfg.principals):
            for j, key in enumerate(p.keys):
                if key.sha256:
                    digest = key.sha256.lower()
                else:
                    assert key.secretRef is not None
                    secret = self.resolver.resolve(key.secretRef, f"principals[{i}].keys[{j}].secretRef")
                    digest = key_digest(secret.reveal())
                out[digest] = Principal(
                    id=p.id,
                    tenant=p.tenant,
                    team=p.team,
                    kind=p.kind,
                    roles=frozenset(p.roles),
                    allowed_aliases=frozenset(p.allowedModels),
                    key_id=key.id,
                    regions=frozenset(p.regions),
                    data_class=p.dataClass,
                )
        return out

    def detach(self, old: PublishedRoot, new: PublishedRoot) -> list[Transport]:
        """The transports ``old`` used and ``new`` does not, no longer offered to a publication.
        Called as ``new`` is swapped in, before another publication can start."""
        keep = {id(d.transport) for d in new.deployments.values()}
        stale = {id(d.transport): d.transport for d in old.deployments.values() if id(d.transport) not in keep}
        for pid, (_, t) in list(self._transports.items()):
            if id(t) in stale:
                del self._transports[pid]
        return list(stale.values())

    async def close_later(self, stale: list[Transport], grace_s: float = 60.0) -> None:
        """Close ``stale`` (:meth:`detach`) after in-flight requests had time to end."""
        await asyncio.sleep(grace_s)
        for t in stale:
            if t in self._open:
                self._open.remove(t)
            await t.aclose()

    async def aclose(self) -> None:
        for t in self._open:
            await t.aclose()
        self._open.clear()
        self._transports.clear()
