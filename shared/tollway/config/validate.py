"""Semantic validation of a parsed ``RouterConfig``: cross-references, bounds and safety policy.

The schema only checks shape. Everything here is a rule that needs more than one field, or a
policy the seed's *Configuration Model* says a gateway must refuse to run with. ``validate``
never stops at the first problem: it returns every issue, each located by its YAML path, so
an operator can fix a config in one pass.

``check`` also returns warnings: settings the user wrote that are valid but can never take
effect (a provider timeout above the request deadline, say). They are reported, never refused,
and only ever about keys present in the file (pydantic's ``model_fields_set``): a default must
never make a valid setting the user wrote invalid, nor warn about a key nobody wrote.

Messages never echo secret material: secret references, key digests and base URLs (which may
carry ``user:pass@``) are described, not quoted.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Final, NamedTuple
from urllib.parse import urlsplit

from tollway.config.schema import (
    AdmissionConfig,
    AuditConfig,
    ModelConfig,
    PrincipalConfig,
    ProviderConfig,
    RouteConfig,
    RouterConfig,
    RoutingConfig,
)
from tollway.exceptions import ConfigIssue

__all__ = ["Findings", "check", "validate", "yaml_path"]

CAPABILITIES = frozenset({"streaming", "tools", "vision", "json_object", "json_schema"})
ROUTE_CAPABILITIES = CAPABILITIES | {"assistantPrefill"}
"""A route may also declare ``assistantPrefill``, which no alias requires (``streamRecovery``)."""
FORMAT_CAPABILITIES: dict[str, frozenset[str]] = {
    "openai-chat-completions": CAPABILITIES,
    "anthropic-messages": frozenset({"streaming", "tools", "vision"}),
    "bedrock-converse": frozenset({"streaming", "tools", "vision"}),
    "gemini": CAPABILITIES,
}
FORMAT_PROVIDER_TYPES: dict[str, frozenset[str]] = {
    "openai-chat-completions": frozenset({"openai", "openai-compatible"}),
    "anthropic-messages": frozenset({"anthropic"}),
    "bedrock-converse": frozenset({"bedrock"}),
    "gemini": frozenset({"gemini", "vertex"}),
}
CLIENT_FORMATS = frozenset({"openai-chat-completions", "anthropic-messages", "openai-responses", "openai-embeddings"})
OPERATIONS = frozenset({"chat", "embeddings"})
EMBEDDING_FORMATS = frozenset({"openai-chat-completions"})
"""Provider formats whose providers embed (``tollway.providers.embeddings_codec_for``)."""
PARAMETER_POLICIES = frozenset({"reject", "ignore"})
STRATEGIES = frozenset({"priority-weighted", "ordered", "least-in-flight", "latency-aware", "sticky", "canary"})
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
MAX_ATTEMPTS = 10

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_PUBLIC_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_ENV_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
_AWS_SM_REF = re.compile(r"aws-sm:[A-Za-z0-9/_+=.@:-]+(#[A-Za-z0-9_.-]+)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HEADER_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")
_METADATA_HOSTS = frozenset({"metadata.google.internal"})
_METADATA_IPS = frozenset({ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")})
_SECRET_REF_HINT = "use env:NAME or aws-sm:<secret-id>[#json-key]"


def yaml_path(*parts: str | int) -> str:
    """Render a location as ``models[0].routes[1].priority`` or ``providers.openai-primary.baseUrl``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _SEGMENT.fullmatch(part):
            out += f".{part}" if out else part
        else:
            escaped = part.replace("\\", "\\\\").replace('"', '\\"')
            out += f'["{escaped}"]'
    return out


class Findings(NamedTuple):
    errors: list[ConfigIssue]
    """A config with any of these must not be published."""
    warnings: list[ConfigIssue]
    """Accepted, but the setting can never take effect as written."""


class _Issues:
    def __init__(self) -> None:
        self.items: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(ConfigIssue(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(ConfigIssue(path, message))

    def positive(self, path: str, value: int, why: str = "") -> None:
        if value <= 0:
            self.add(path, "must be positive" + (f" ({why})" if why else ""))

    def not_blank(self, path: str, value: str) -> bool:
        if not value.strip():
            self.add(path, "must not be empty")
            return False
        return True

    def members(self, path: str, values: Iterable[str], known: frozenset[str], what: str) -> None:
        for i, value in enumerate(values):
            if value not in known:
                self.add(f"{path}[{i}]", f"unknown {what} {value!r}; known: {_quoted(known)}")


def validate(cfg: RouterConfig) -> list[ConfigIssue]:
    """Every semantic problem in ``cfg``; an empty list means the config may be published."""
    return check(cfg).errors


def check(cfg: RouterConfig) -> Findings:
    """Every semantic problem in ``cfg``, and every warning."""
    issues = _Issues()
    _check_gateway(cfg, issues)
    _check_admission(cfg.admission, issues)
    _check_routing(cfg.routing, issues)
    for name, provider in cfg.providers.items():
        _check_provider(yaml_path("providers", name), provider, cfg.requestTimeoutMs, issues)
    _check_models(cfg, issues)
    _check_principals(cfg, issues)
    _check_audit(cfg.audit, issues)
    _check_governance(cfg, issues)
    _check_pii(cfg, issues)
    _check_content(cfg, issues)
    _check_telemetry(cfg, issues)
    return Findings(issues.items, issues.warnings)


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(repr(v) for v in sorted(values))


def _check_gateway(cfg: RouterConfig, issues: _Issues) -> None:
    prefix = cfg.pathPrefix
    if not prefix.startswith("/") or prefix.endswith("/"):
        issues.add("pathPrefix", "must start with '/' and must not end with '/' (for example '/v1')")
    elif any(ch.isspace() or ch in "?#%" for ch in prefix):
        issues.add("pathPrefix", "must be a plain path without whitespace, '?', '#' or '%'")
    if cfg.maxRequestBodyBytes <= 0 or cfg.maxRequestBodyBytes > MAX_REQUEST_BODY_BYTES:
        issues.add("maxRequestBodyBytes", f"must be between 1 and {MAX_REQUEST_BODY_BYTES} (64 MiB)")
    issues.positive("maxResponseBodyBytes", cfg.maxResponseBodyBytes)
    issues.positive("requestTimeoutMs", cfg.requestTimeoutMs)
    issues.positive("streamIdleTimeoutMs", cfg.streamIdleTimeoutMs)
    issues.positive("maxConcurrentRequests", cfg.maxConcurrentRequests, "concurrency must be bounded")
    issues.positive("maxConcurrentStreams", cfg.maxConcurrentStreams, "concurrency must be bounded")
    lifetime = cfg.admission.maxStreamLifetimeMs
    if 0 < lifetime < cfg.streamIdleTimeoutMs:
        issues.add(
            "streamIdleTimeoutMs",
            f"must not exceed admission.maxStreamLifetimeMs ({lifetime}); the idle deadline could never fire",
        )
    if cfg.unsupportedParameterPolicy not in PARAMETER_POLICIES:
        issues.add(
            "unsupportedParameterPolicy",
            f"unknown policy {cfg.unsupportedParameterPolicy!r}; known: {_quoted(PARAMETER_POLICIES)}",
        )


def _check_admission(adm: AdmissionConfig, issues: _Issues) -> None:
    if adm.maxQueuedRequests < 0:
        issues.add("admission.maxQueuedRequests", "must not be negative (0 disables queueing)")
    if adm.maxQueueWaitMs < 0:
        issues.add("admission.maxQueueWaitMs", "must not be negative")
    elif adm.maxQueuedRequests > 0 and adm.maxQueueWaitMs == 0:
        issues.add("admission.maxQueueWaitMs", "must be positive when maxQueuedRequests > 0 (a queue needs a deadline)")
    issues.positive("admission.streamBufferEvents", adm.streamBufferEvents, "stream buffers must be bounded")
    issues.positive("admission.streamSetupTimeoutMs", adm.streamSetupTimeoutMs)
    issues.positive("admission.maxStreamLifetimeMs", adm.maxStreamLifetimeMs)
    issues.positive("admission.downstreamWriteProgressTimeoutMs", adm.downstreamWriteProgressTimeoutMs)
    issues.positive("admission.bodyReadTimeoutMs", adm.bodyReadTimeoutMs)
    if adm.minStreamDrainBytesPerSecond < 0:
        issues.add("admission.minStreamDrainBytesPerSecond", "must not be negative")
    if not 0 <= adm.maxEventLoopLagMs <= 60000:
        issues.add("admission.maxEventLoopLagMs", "must be between 0 (off) and 60000")


def _check_routing(routing: RoutingConfig, issues: _Issues) -> None:
    if routing.strategy not in STRATEGIES:
        issues.add("routing.strategy", f"unknown strategy {routing.strategy!r}; known: {_quoted(STRATEGIES)}")
    if not 1 <= routing.maxAttempts <= MAX_ATTEMPTS:
        issues.add("routing.maxAttempts", f"must be between 1 and {MAX_ATTEMPTS}")
    if routing.baseBackoffMs < 0:
        issues.add("routing.baseBackoffMs", "must not be negative")
    if routing.maxBackoffMs < routing.baseBackoffMs:
        issues.add("routing.maxBackoffMs", f"must be at least baseBackoffMs ({routing.baseBackoffMs})")
    for i, status in enumerate(routing.retryStatuses):
        if not 400 <= status <= 599:
            issues.add(f"routing.retryStatuses[{i}]", "must be an HTTP error status between 400 and 599")
    breaker = routing.circuitBreaker
    issues.positive("routing.circuitBreaker.failureThreshold", breaker.failureThreshold)
    issues.positive("routing.circuitBreaker.resetTimeoutMs", breaker.resetTimeoutMs)
    issues.positive("routing.circuitBreaker.halfOpenRequests", breaker.halfOpenRequests)
    if breaker.maxResetTimeoutMs is not None and breaker.maxResetTimeoutMs < breaker.resetTimeoutMs:
        issues.add(
            "routing.circuitBreaker.maxResetTimeoutMs", f"must be at least resetTimeoutMs ({breaker.resetTimeoutMs})"
        )
    outlier = routing.outlierDetection
    if outlier.maxEjectionMs < outlier.baseEjectionMs:
        issues.add(
            "routing.outlierDetection.maxEjectionMs", f"must be at least baseEjectionMs ({outlier.baseEjectionMs})"
        )
    if routing.strategy == "canary":
        issues.add("routing.strategy", "canary is set per model (models[].strategy with models[].canary)")
    if not _HEADER_TOKEN.fullmatch(routing.sessionHeader):
        issues.add("routing.sessionHeader", "must be a valid HTTP header name")


def _check_provider(path: str, provider: ProviderConfig, request_timeout_ms: int, issues: _Issues) -> None:
    for kind, (keys, what, check) in _CLOUD_SETTINGS.items():
        if provider.type == kind:
            check(path, provider, issues)
            continue
        for key in keys:
            if key in provider.model_fields_set:
                issues.add(f"{path}.{key}", f"only a provider of type '{kind}' takes {what}")
    # no region (bedrock), project or location (vertex): reported there
    unset = provider.type in _CLOUD_SETTINGS and not provider.baseUrl
    problem = None if unset else _base_url_problem(provider.baseUrl, provider.allowInsecureHttp)
    if problem:
        issues.add(f"{path}.baseUrl", problem)
    for field, value in (("providerAccountId", provider.providerAccountId), ("quotaGroupId", provider.quotaGroupId)):
        if value is None or not value.strip():
            issues.add(
                f"{path}.{field}", "required: every deployment needs a provider account and quota group identity"
            )
    _check_credentials(path, provider, issues)
    _check_egress(path, provider, issues)
    issues.positive(f"{path}.connectTimeoutMs", provider.connectTimeoutMs)
    issues.positive(f"{path}.requestTimeoutMs", provider.requestTimeoutMs)
    issues.positive(f"{path}.maxConnections", provider.maxConnections, "the connection pool must be bounded")
    written = provider.model_fields_set
    if "connectTimeoutMs" in written and 0 < provider.requestTimeoutMs < provider.connectTimeoutMs:
        issues.add(
            f"{path}.connectTimeoutMs",
            f"must not exceed this provider's requestTimeoutMs ({provider.requestTimeoutMs})",
        )
    if "requestTimeoutMs" in written and 0 < request_timeout_ms < provider.requestTimeoutMs:
        issues.warn(
            f"{path}.requestTimeoutMs",
            f"exceeds the global requestTimeoutMs ({request_timeout_ms}), which bounds every attempt: "
            f"the per-read timeout in effect is {request_timeout_ms}",
        )


def _check_egress(path: str, provider: ProviderConfig, issues: _Issues) -> None:
    """The proxy and CA bundle. Whether the bundle's file exists and loads is known only where the
    gateway runs: publication checks it (``tollway.config.root``)."""
    if provider.proxyUrl is not None:
        problem = _proxy_url_problem(provider.proxyUrl)
        if problem:
            issues.add(f"{path}.proxyUrl", problem)
    ref = provider.proxyCredentialsSecretRef
    if ref is not None:
        problem = _secret_ref_problem(ref)
        if problem:
            issues.add(f"{path}.proxyCredentialsSecretRef", problem)
        if provider.proxyUrl is None:
            issues.add(f"{path}.proxyCredentialsSecretRef", "requires proxyUrl: there is no proxy to send them to")
    if provider.caBundle is not None and not provider.caBundle.strip():
        issues.add(f"{path}.caBundle", "must be the path of a PEM file of CA certificates")


_AWS_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}")


def _check_bedrock(path: str, provider: ProviderConfig, issues: _Issues) -> None:
    """Bedrock signs each request (SigV4) with credentials from botocore's chain, never a secret of
    this file, and needs the region it signs for."""
    if provider.awsRegion is None:
        issues.add(f"{path}.awsRegion", "required: set awsRegion, or AWS_REGION or AWS_DEFAULT_REGION")
    elif not _AWS_REGION.fullmatch(provider.awsRegion):
        issues.add(f"{path}.awsRegion", "must be an AWS region name such as us-east-1")
    if provider.awsProfile is not None:
        issues.not_blank(f"{path}.awsProfile", provider.awsProfile)
    if provider.credentials:
        issues.add(
            f"{path}.credentials",
            "not used by bedrock: requests are signed with AWS credentials (the environment, awsProfile or a role)",
        )


_GCP_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_GCP_LOCATION = re.compile(r"global|[a-z]+(?:-[a-z]+[0-9]+)?")


def _check_vertex(path: str, provider: ProviderConfig, issues: _Issues) -> None:
    """Vertex AI takes OAuth2 tokens from Google credentials (a service account key named by
    ``GOOGLE_APPLICATION_CREDENTIALS``, or Application Default Credentials), never a secret of this
    file; its endpoint is made of the project and location, so both must be plain names."""
    if provider.gcpProject is None:
        issues.add(f"{path}.gcpProject", "required: the Google Cloud project whose Vertex AI serves the models")
    elif not _GCP_PROJECT.fullmatch(provider.gcpProject):
        issues.add(f"{path}.gcpProject", "must be a Google Cloud project id such as my-project-123")
    if provider.gcpLocation is None:
        issues.add(f"{path}.gcpLocation", "required: the Vertex AI location, such as us-central1 or global")
    elif not _GCP_LOCATION.fullmatch(provider.gcpLocation):
        issues.add(f"{path}.gcpLocation", "must be a Vertex AI location such as us-central1, europe-west4 or global")
    if provider.credentials:
        issues.add(
            f"{path}.credentials",
            "not used by vertex: requests carry OAuth2 tokens from Google credentials "
            "(GOOGLE_APPLICATION_CREDENTIALS or Application Default Credentials)",
        )


_CLOUD_SETTINGS: Final[dict[str, tuple[tuple[str, ...], str, Callable[[str, ProviderConfig, _Issues], None]]]] = {
    "bedrock": (("awsRegion", "awsProfile"), "AWS settings", _check_bedrock),
    "vertex": (("gcpProject", "gcpLocation"), "Google Cloud settings", _check_vertex),
}
"""The provider types that sign each request with the gateway's own cloud credentials: the keys
only they take, what those are called, and their checks. They take no ``credentials[]``, and their
default ``baseUrl`` comes from those keys."""


def _check_credentials(path: str, provider: ProviderConfig, issues: _Issues) -> None:
    creds = provider.credentials
    if provider.type in _CLOUD_SETTINGS:
        return
    if provider.authMode == "api-key" and not creds:
        issues.add(f"{path}.credentials", "authMode 'api-key' needs at least one credential")
    seen: dict[str, int] = {}
    current: int | None = None
    for i, cred in enumerate(creds):
        cpath = f"{path}.credentials[{i}]"
        if issues.not_blank(f"{cpath}.id", cred.id):
            if cred.id in seen:
                issues.add(f"{cpath}.id", f"duplicate credential id {cred.id!r} (also credentials[{seen[cred.id]}])")
            seen.setdefault(cred.id, i)
        problem = _secret_ref_problem(cred.secretRef)
        if problem:
            issues.add(f"{cpath}.secretRef", problem)
        if cred.lifecycle == "current":
            if current is not None:
                issues.add(
                    f"{cpath}.lifecycle",
                    f"only one credential may be 'current' (also credentials[{current}]); "
                    "rotating keys inside one quota group must not add capacity",
                )
            else:
                current = i
    if creds and current is None:
        issues.add(f"{path}.credentials", "no credential has lifecycle 'current'")


def _secret_ref_problem(ref: str) -> str | None:
    if ":" not in ref:
        return f"looks like a literal secret, not a reference; {_SECRET_REF_HINT}"
    scheme = ref.split(":", 1)[0]
    if scheme == "env":
        return None if _ENV_REF.fullmatch(ref) else "env: reference must name a variable like env:TOLLWAY_OPENAI_KEY"
    if scheme == "aws-sm":
        return None if _AWS_SM_REF.fullmatch(ref) else "aws-sm: reference must look like aws-sm:<secret-id>[#json-key]"
    return f"unsupported secret reference scheme; {_SECRET_REF_HINT}"


def _base_url_problem(url: str, allow_insecure_http: bool) -> str | None:
    """Why ``url`` is not a fixed, operator-owned upstream endpoint, or None. Never quotes the URL."""
    if any(ch in "{}$" or ch.isspace() for ch in url):
        return "contains '{', '}', '$' or whitespace; base URLs must be fixed, never templated or client-controlled"
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return "is not a valid URL"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return "scheme must be https (plain http only for loopback hosts)"
    if "@" in parts.netloc:
        return "must not contain user info (user:pass@); put secrets in credentials[].secretRef"
    if "#" in url:
        return "must not contain a fragment"
    if "?" in url:
        return "must not contain a query string"
    host = (parts.hostname or "").rstrip(".").lower()
    problem = _host_problem(host)
    if problem:
        return problem
    ip = _host_ip(host)
    loopback = host == "localhost" or (ip is not None and ip.is_loopback)
    if scheme == "http" and not loopback and not allow_insecure_http:
        return "plain http is only allowed for loopback hosts; use https or set allowInsecureHttp: true"
    return None


def _host_problem(host: str) -> str | None:
    """Why ``host`` is no host to connect to, or None."""
    if not host:
        return "has no host"
    ip = _host_ip(host)
    if ip is None and _NUMERIC_HOST.fullmatch(host) and _inet_aton_accepts(host):
        return "numeric hosts must be written as a canonical IP address"
    if host in _METADATA_HOSTS or (ip is not None and (ip.is_link_local or ip in _METADATA_IPS)):
        return "points at a link-local or cloud metadata address"
    if ip is not None and ip.is_unspecified:
        return "points at an unspecified address"
    return None


def _proxy_url_problem(url: str) -> str | None:
    """Why ``url`` is not ``http(s)://host:port`` of a proxy, or None. Never quotes the URL: a
    mistaken one may carry a password."""
    if any(ch in "{}$" or ch.isspace() for ch in url):
        return "contains '{', '}', '$' or whitespace; a proxy URL is fixed, never templated"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme.lower() not in ("http", "https"):
        return "scheme must be http or https (https: TLS to the proxy itself)"
    if "@" in parts.netloc:
        return "must not contain user info (user:pass@); put the credentials in proxyCredentialsSecretRef"
    if parts.path not in ("", "/") or "?" in url or "#" in url:
        return "must be only scheme, host and port (no path, query string or fragment)"
    problem = _host_problem((parts.hostname or "").rstrip(".").lower())
    if problem:
        return problem
    if port is None:
        return "must name the proxy's port (http://host:port)"
    return None


def _host_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _inet_aton_accepts(host: str) -> bool:
    """Legacy forms (``0x7f.1``, ``2130706433``) that resolvers still turn into addresses."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def _check_models(cfg: RouterConfig, issues: _Issues) -> None:
    aliases: dict[str, int] = {}
    routes: dict[str, str] = {}
    for i, model in enumerate(cfg.models):
        path = f"models[{i}]"
        if issues.not_blank(f"{path}.name", model.name):
            if model.name in aliases:
                issues.add(f"{path}.name", f"duplicate alias {model.name!r} (also models[{aliases[model.name]}])")
            aliases.setdefault(model.name, i)
        _check_alias(path, model, issues)
        if not model.routes:
            issues.add(f"{path}.routes", "alias has no routes")
        for j, route in enumerate(model.routes):
            rpath = f"{path}.routes[{j}]"
            if issues.not_blank(f"{rpath}.id", route.id):
                if route.id in routes:
                    issues.add(f"{rpath}.id", f"duplicate route id {route.id!r} (also {routes[route.id]})")
                routes.setdefault(route.id, rpath)
            _check_route(rpath, route, model, cfg.providers.get(route.provider), issues)
        _check_priority_groups(path, model.routes, issues)
        if model.streamRecovery == "continue" and not any(
            "assistantPrefill" in (r.capabilities or ()) for r in model.routes
        ):
            issues.add(f"{path}.streamRecovery", "continue needs a route that declares the assistantPrefill capability")


def _check_alias(path: str, model: ModelConfig, issues: _Issues) -> None:
    if not model.clientFormats:
        issues.add(f"{path}.clientFormats", "must list at least one client format")
    issues.members(f"{path}.clientFormats", model.clientFormats, CLIENT_FORMATS, "client format")
    if not model.operations:
        issues.add(f"{path}.operations", "must list at least one operation")
    issues.members(f"{path}.operations", model.operations, OPERATIONS, "operation")
    if "embeddings" in model.operations:
        _check_embeddings_alias(path, model, issues)
    elif "openai-embeddings" in model.clientFormats:
        issues.add(
            f"{path}.clientFormats", "'openai-embeddings' is served only by an alias with operations [embeddings]"
        )
    if model.processingMode in ("detect", "opaque"):
        issues.add(f"{path}.processingMode", f"{model.processingMode!r} is not supported yet; use 'normalized'")
    elif model.processingMode != "normalized":
        issues.add(f"{path}.processingMode", f"unknown processing mode {model.processingMode!r}; use 'normalized'")
    issues.members(f"{path}.capabilities", model.capabilities, CAPABILITIES, "capability")
    issues.positive(f"{path}.maxInputTokens", model.maxInputTokens)
    issues.positive(f"{path}.maxOutputTokens", model.maxOutputTokens)
    default_out = model.defaultMaxOutputTokens
    if default_out is not None:
        if default_out <= 0:
            issues.add(f"{path}.defaultMaxOutputTokens", "must be positive")
        elif default_out > model.maxOutputTokens:
            issues.add(f"{path}.defaultMaxOutputTokens", f"must not exceed maxOutputTokens ({model.maxOutputTokens})")
    policy = model.unsupportedParameterPolicy
    if policy is not None and policy not in PARAMETER_POLICIES:
        issues.add(
            f"{path}.unsupportedParameterPolicy", f"unknown policy {policy!r}; known: {_quoted(PARAMETER_POLICIES)}"
        )
    _check_strategy(path, model, issues)


def _check_strategy(path: str, model: ModelConfig, issues: _Issues) -> None:
    if model.strategy is not None and model.strategy not in STRATEGIES:
        issues.add(f"{path}.strategy", f"unknown strategy {model.strategy!r}; known: {_quoted(STRATEGIES)}")
    if (model.strategy == "canary") != (model.canary is not None):
        issues.add(f"{path}.canary", "strategy canary and a canary block go together")
    if model.canary is None:
        return
    splits = model.canary.splits
    if sum(sp.basisPoints for sp in splits) != 10000:
        issues.add(f"{path}.canary.splits", "the basis points must add up to 10000")
    routes = {r.id for r in model.routes}
    names: set[str] = set()
    for i, sp in enumerate(splits):
        if sp.name in names:
            issues.add(f"{path}.canary.splits[{i}].name", f"duplicate bucket {sp.name!r}")
        names.add(sp.name)
        for k, rid in enumerate(sp.routes):
            if rid not in routes:
                issues.add(f"{path}.canary.splits[{i}].routes[{k}]", f"unknown route {rid!r} of this model")


def _check_embeddings_alias(path: str, model: ModelConfig, issues: _Issues) -> None:
    """An embeddings alias embeds and does nothing else, on routes whose provider format embeds."""
    if len(set(model.operations)) > 1:
        issues.add(f"{path}.operations", "an alias serves chat or embeddings, not both: declare one alias for each")
    if "clientFormats" in model.model_fields_set and set(model.clientFormats) != {"openai-embeddings"}:
        issues.add(f"{path}.clientFormats", "an embeddings alias is served over 'openai-embeddings' only")
    chat_capabilities = set(model.capabilities) - {"streaming"}
    if chat_capabilities:
        issues.add(f"{path}.capabilities", f"chat capabilities on an embeddings alias: {_quoted(chat_capabilities)}")
    if model.streamRecovery != "none":
        issues.add(f"{path}.streamRecovery", "an embeddings alias does not stream")
    for j, route in enumerate(model.routes):
        if route.providerFormat in FORMAT_CAPABILITIES and route.providerFormat not in EMBEDDING_FORMATS:
            issues.add(
                f"{path}.routes[{j}].providerFormat",
                f"{route.providerFormat!r} cannot embed; an embeddings route needs {_quoted(EMBEDDING_FORMATS)}",
            )


def _check_route(
    path: str, route: RouteConfig, model: ModelConfig, provider: ProviderConfig | None, issues: _Issues
) -> None:
    issues.not_blank(f"{path}.model", route.model)
    if provider is None:
        issues.add(f"{path}.provider", f"unknown provider {route.provider!r}; it must be a key of providers")
    format_caps = FORMAT_CAPABILITIES.get(route.providerFormat)
    if format_caps is None:
        issues.add(
            f"{path}.providerFormat",
            f"unknown provider format {route.providerFormat!r}; known: {_quoted(FORMAT_CAPABILITIES)}",
        )
    elif provider is not None and provider.type not in FORMAT_PROVIDER_TYPES[route.providerFormat]:
        issues.add(
            f"{path}.providerFormat",
            f"{route.providerFormat!r} cannot be served by a provider of type {provider.type!r}; "
            f"expected type {_quoted(FORMAT_PROVIDER_TYPES[route.providerFormat])}",
        )
    if route.capabilities is not None:
        issues.members(f"{path}.capabilities", route.capabilities, ROUTE_CAPABILITIES, "capability")
    if route.publicModel is not None and not _PUBLIC_MODEL.fullmatch(route.publicModel):
        issues.add(f"{path}.publicModel", "must be 1-128 letters, digits or ._:/- and start with a letter or digit")
    if route.priority < 0:
        issues.add(f"{path}.priority", "must not be negative")
    if route.weight < 0:
        issues.add(f"{path}.weight", "must not be negative")
    required = CAPABILITIES.intersection(model.capabilities)
    if format_caps is not None and not required <= format_caps:
        missing = _quoted(required - format_caps)
        issues.add(f"{path}.providerFormat", f"{route.providerFormat!r} cannot serve the alias's capability {missing}")
    if format_caps is not None and route.capabilities is not None:
        missing_here = (required & format_caps) - set(route.capabilities)
        if missing_here:
            issues.add(f"{path}.capabilities", f"route lacks the alias's required capability {_quoted(missing_here)}")
    if route.regions and not set(model.regions) <= set(route.regions):
        missing_regions = _quoted(set(model.regions) - set(route.regions))
        issues.add(f"{path}.regions", f"does not cover the alias's region {missing_regions}")


def _check_priority_groups(path: str, routes: Sequence[RouteConfig], issues: _Issues) -> None:
    groups: dict[int, list[int]] = {}
    for route in routes:
        groups.setdefault(route.priority, []).append(route.weight)
    for priority, weights in sorted(groups.items()):
        if all(w == 0 for w in weights):
            issues.add(f"{path}.routes", f"every route with priority {priority} has weight 0; one must be positive")


def _check_principals(cfg: RouterConfig, issues: _Issues) -> None:
    aliases = {m.name for m in cfg.models}
    principals: dict[str, int] = {}
    keys: dict[str, str] = {}
    digests: dict[str, str] = {}
    for i, principal in enumerate(cfg.principals):
        path = f"principals[{i}]"
        if issues.not_blank(f"{path}.id", principal.id):
            if principal.id in principals:
                issues.add(
                    f"{path}.id",
                    f"duplicate principal id {principal.id!r} (also principals[{principals[principal.id]}])",
                )
            principals.setdefault(principal.id, i)
        issues.not_blank(f"{path}.tenant", principal.tenant)
        if principal.dataClass is not None:
            issues.not_blank(f"{path}.dataClass", principal.dataClass)
        for k, region in enumerate(principal.regions):
            issues.not_blank(f"{path}.regions[{k}]", region)
        for k, alias in enumerate(principal.allowedModels):
            if alias not in aliases:
                issues.add(f"{path}.allowedModels[{k}]", f"unknown model alias {alias!r}")
        _check_keys(path, principal, keys, digests, issues)


def _check_keys(
    path: str, principal: PrincipalConfig, keys: dict[str, str], digests: dict[str, str], issues: _Issues
) -> None:
    if not principal.keys:
        issues.add(f"{path}.keys", "principal has no keys, so nobody could authenticate as it")
    for k, key in enumerate(principal.keys):
        kpath = f"{path}.keys[{k}]"
        if issues.not_blank(f"{kpath}.id", key.id):
            if key.id in keys:
                issues.add(f"{kpath}.id", f"duplicate key id {key.id!r} (also {keys[key.id]})")
            keys.setdefault(key.id, kpath)
        if (key.sha256 is None) == (key.secretRef is None):
            issues.add(kpath, "set exactly one of sha256 or secretRef")
        if key.sha256 is not None:
            if not _SHA256.fullmatch(key.sha256):
                issues.add(f"{kpath}.sha256", "must be 64 lowercase hex characters (the SHA-256 of the key)")
            elif key.sha256 in digests:
                issues.add(f"{kpath}.sha256", f"same digest as {digests[key.sha256]}; every key must be distinct")
            else:
                digests[key.sha256] = kpath
        if key.secretRef is not None:
            problem = _secret_ref_problem(key.secretRef)
            if problem:
                issues.add(f"{kpath}.secretRef", problem)


def _check_audit(audit: AuditConfig, issues: _Issues) -> None:
    spool, sink = audit.spool, audit.sink
    if not spool.path.strip():
        issues.add("audit.spool.path", "must name a directory")
    for key in ("maxBytes", "segmentBytes", "maxRecordBytes", "maxBatchRecords", "maxBatchBytes", "commitTimeoutMs"):
        issues.positive(f"audit.spool.{key}", getattr(spool, key), "the WAL must be bounded")
    if spool.maxCommitDelayMs < 0:
        issues.add("audit.spool.maxCommitDelayMs", "must not be negative")
    if not 0 <= spool.asyncWriteDelayMs <= 1000:
        issues.add("audit.spool.asyncWriteDelayMs", "must be between 0 and 1000")
    if spool.maxRecordBytes > spool.segmentBytes // 2:
        issues.add("audit.spool.maxRecordBytes", f"must be at most half of segmentBytes ({spool.segmentBytes})")
    if spool.maxBytes < 2 * spool.segmentBytes:
        issues.add(
            "audit.spool.maxBytes",
            f"must be at least twice segmentBytes ({spool.segmentBytes}): the newest segment is never deleted",
        )
    if spool.maxBatchBytes < spool.maxRecordBytes:
        issues.add(
            "audit.spool.maxBatchBytes", f"must hold at least one record of maxRecordBytes ({spool.maxRecordBytes})"
        )
    if audit.durability == "local-durable" and spool.persistenceClass != "persistent":
        issues.add(
            "audit.spool.persistenceClass",
            "local-durable needs a persistent volume: declare persistenceClass: persistent for a directory"
            " that survives process restart (an ephemeral one cannot keep the durability promise)",
        )
    if sink.type == "kafka" and not sink.bootstrapServers.strip():
        issues.add("audit.sink.bootstrapServers", "is required when sink.type is kafka")
    if sink.type == "kafka" and not sink.topic.strip():
        issues.add("audit.sink.topic", "is required when sink.type is kafka")
    issues.positive("audit.sink.batchSize", sink.batchSize)
    if not 1 <= sink.flushIntervalMs <= 60000:
        issues.add("audit.sink.flushIntervalMs", "must be between 1 and 60000")


_FIXED_PATHS = ("/healthz", "/admin/v1/routes")


def _check_telemetry(cfg: RouterConfig, issues: _Issues) -> None:
    metrics, tracing = cfg.telemetry.metrics, cfg.telemetry.tracing
    path = metrics.path
    if path in _FIXED_PATHS or path == cfg.pathPrefix or path.startswith(cfg.pathPrefix + "/"):
        issues.add("telemetry.metrics.path", f"{path!r} is taken by the gateway's own routes; choose another")
    if metrics.port is not None and metrics.host not in ("127.0.0.1", "::1", "localhost") and metrics.access == "admin":
        issues.warn(
            "telemetry.metrics.port",
            f"the metrics listener on {metrics.host} answers without a key; restrict who can reach it",
        )
    if tracing.endpoint and not tracing.endpoint.startswith(("http://", "https://")):
        issues.add("telemetry.tracing.endpoint", "must be an http:// or https:// URL (OTLP over HTTP)")


_SCOPE_KINDS = ("tenant", "team", "principal", "key")


def _known_scopes(cfg: RouterConfig) -> set[str]:
    scopes: set[str] = set()
    for p in cfg.principals:
        scopes.add(f"tenant:{p.tenant}")
        scopes.add(f"principal:{p.id}")
        if p.team:
            scopes.add(f"team:{p.tenant}/{p.team}")
        scopes.update(f"key:{k.id}" for k in p.keys)
    return scopes


def _check_governance(cfg: RouterConfig, issues: _Issues) -> None:
    gov = cfg.governance
    aliases = {m.name for m in cfg.models}
    known = _known_scopes(cfg)
    seen: dict[tuple[str, str | None], int] = {}
    for i, policy in enumerate(gov.policies):
        path = f"governance.policies[{i}]"
        kind = policy.scope.partition(":")[0]
        if kind not in _SCOPE_KINDS or ":" not in policy.scope or "#" in policy.scope:
            issues.add(f"{path}.scope", f"must be one of {', '.join(k + ':<id>' for k in _SCOPE_KINDS)}")
        elif policy.scope not in known:
            issues.add(f"{path}.scope", f"{policy.scope!r} matches no configured principal, team, tenant or key")
        if policy.alias is not None and policy.alias not in aliases:
            issues.add(f"{path}.alias", f"unknown model alias {policy.alias!r}")
        where = (policy.scope, policy.alias)
        if where in seen:
            issues.add(path, f"a second policy for the same scope and alias (also governance.policies[{seen[where]}])")
        seen.setdefault(where, i)
        windows = [b.window for b in policy.budgets]
        if len(set(windows)) != len(windows):
            issues.add(f"{path}.budgets", "at most one budget per window")
    groups = {p.quotaGroupId or name for name, p in cfg.providers.items()}
    for name in gov.quotaGroups:
        if name not in groups:
            issues.add(yaml_path("governance", "quotaGroups", name), "no provider declares this quotaGroupId")
    accounts: dict[str, str] = {}
    for name, p in cfg.providers.items():
        group, account = p.quotaGroupId or name, p.providerAccountId or name
        if accounts.setdefault(group, account) != account:
            issues.add(
                yaml_path("providers", name, "quotaGroupId"),
                f"quota group {group!r} already belongs to account {accounts[group]!r}: "
                "a group is one account's capacity",
            )
    pricing = gov.pricing
    if pricing.bucket and (pricing.catalogFile or pricing.overridesFile):
        issues.add("governance.pricing", "set either bucket or the catalog/overrides files, not both")


CAPTURING_MODES = frozenset({"tokenized-content", "encrypted-raw"})


def content_retention_class(model: ModelConfig) -> str:
    """The retention class an alias's captured content is kept under."""
    if model.contentRetentionClass:
        return model.contentRetentionClass
    return "restricted" if model.contentMode == "encrypted-raw" else "standard"


def _check_content(cfg: RouterConfig, issues: _Issues) -> None:
    """The content modes' rules (docs/export.md): a store and a key to capture into, an audit trail
    to reference it from, a known and short enough retention class, and no capture of a data
    classification that forbids it."""
    content = cfg.content
    for name in content.retentionClasses:
        if not _SEGMENT.fullmatch(name):
            issues.add(f"content.retentionClasses.{name}", "must be letters, digits, '-' or '_' (an S3 key segment)")
    forbidden = set(content.noCaptureClassifications)
    for j, model in enumerate(cfg.models):
        path = f"models[{j}]"
        mode = model.contentMode
        if mode not in CAPTURING_MODES:
            if model.contentPurposes:
                issues.warn(f"{path}.contentPurposes", "has no effect: nothing is captured under this contentMode")
            continue
        if content.store is None:
            issues.add(
                f"{path}.contentMode", f"{mode} needs a content store: set content.store (an S3 bucket and KMS key)"
            )
        if cfg.audit.sink.type == "none":
            issues.add(
                f"{path}.contentMode", f"{mode} needs the audit trail (audit.sink), which holds each object's reference"
            )
        clash = sorted(forbidden & set(model.dataClassifications))
        if clash:
            issues.add(
                f"{path}.contentMode",
                f"{mode} is not allowed for data classified {_quoted(clash)} (content.noCaptureClassifications)",
            )
        retention = content_retention_class(model)
        known = content.retentionClasses.get(retention)
        if known is None:
            issues.add(
                f"{path}.contentRetentionClass",
                f"unknown retention class {retention!r}; known: {_quoted(content.retentionClasses)}",
            )
        elif mode == "encrypted-raw" and known.days > content.maxRawRetentionDays:
            issues.add(
                f"{path}.contentRetentionClass",
                f"encrypted-raw content keeps at most {content.maxRawRetentionDays} days "
                f"(content.maxRawRetentionDays); {retention!r} keeps {known.days}",
            )
        if mode == "encrypted-raw" and model.contentPurposes:
            issues.add(f"{path}.contentPurposes", "encrypted-raw content is for audit only: it holds the raw values")
    store = content.store
    if store is not None and store.type == "s3" and not any(m.contentMode in CAPTURING_MODES for m in cfg.models):
        issues.warn("content.store", "no alias captures content (contentMode): the store is unused")


def _check_pii(cfg: RouterConfig, issues: _Issues) -> None:  # noqa: C901 - one flat list of the seed's rules
    """PII profiles: each referenced, each reference known, and no combination the seed refuses (a
    streaming profile that would fail an answer after output, a durable scope without a durable vault,
    host scope without approval)."""
    pii = cfg.pii
    if not pii.profiles and not any(m.piiProfileId for m in cfg.models) and pii.keySecretRef is None:
        return
    from tollway.pii.detectors import BUILTIN_KINDS as PII_KINDS
    from tollway.pii.detectors import CustomPattern, DetectorConfigError, Dictionary, build_detector
    from tollway.pii.presidio import PRESIDIO_KINDS, missing_modules

    ids: dict[str, int] = {}
    for i, profile in enumerate(pii.profiles):
        path = f"pii.profiles[{i}]"
        if profile.id in ids:
            issues.add(f"{path}.id", f"duplicate PII profile id {profile.id!r} (also pii.profiles[{ids[profile.id]}])")
        ids.setdefault(profile.id, i)
        presidio = profile.engine == "presidio"
        known = PII_KINDS | PRESIDIO_KINDS if presidio else PII_KINDS
        unknown = [d for d in profile.detectors if d not in known]
        if unknown and set(unknown) <= PRESIDIO_KINDS:
            issues.add(f"{path}.detectors", f"detector {_quoted(unknown)} needs engine: presidio")
        elif unknown:
            issues.add(f"{path}.detectors", f"unknown detector {_quoted(unknown)}; known: {_quoted(known)}")
        if presidio and not PRESIDIO_KINDS & set(profile.detectors):
            issues.add(
                f"{path}.engine", f"engine presidio adds only the detectors {_quoted(PRESIDIO_KINDS)}: list one of them"
            )
        if presidio and (missing := missing_modules()):
            issues.add(
                f"{path}.engine",
                f"engine presidio needs the presidio extra: install tollway[presidio] (missing {_quoted(missing)})",
            )
        if not profile.detectors and not profile.customPatterns and not profile.dictionaries:
            issues.add(
                f"{path}.detectors", "a profile must detect something: list detectors, customPatterns or dictionaries"
            )
        try:
            build_detector(
                [d for d in profile.detectors if d in PII_KINDS],
                [CustomPattern(c.name, c.pattern) for c in profile.customPatterns],
                [Dictionary(d.name, tuple(d.terms), d.caseSensitive) for d in profile.dictionaries],
            )
        except DetectorConfigError as exc:
            issues.add(f"{path}.customPatterns", str(exc))
        if profile.streaming and profile.unresolvedTokenPolicy == "reject-buffered":
            issues.add(
                f"{path}.unresolvedTokenPolicy",
                "reject-buffered checks the whole answer before any of it leaves: set streaming: false",
            )
        if profile.scope == "host" and not profile.allowHostScope:
            issues.add(f"{path}.scope", "host scope makes placeholders linkable across requests; set allowHostScope")
        if profile.scope != "request" and (pii.vault is None or pii.vault.type != "dynamodb"):
            issues.add(f"{path}.scope", f"{profile.scope!r} scope needs a durable vault (pii.vault.type: dynamodb)")
    used: set[str] = set()
    for j, model in enumerate(cfg.models):
        ref = model.piiProfileId
        if ref is None:
            continue
        used.add(ref)
        if ref not in ids:
            issues.add(f"models[{j}].piiProfileId", f"unknown PII profile {ref!r}; it must be an id in pii.profiles")
            continue
        profile = pii.profiles[ids[ref]]
        if profile.dataClassifications:
            outside = set(model.dataClassifications) - set(profile.dataClassifications)
            if outside:
                issues.add(
                    f"models[{j}].dataClassifications",
                    f"PII profile {ref!r} does not cover {_quoted(outside)}",
                )
    for i, profile in enumerate(pii.profiles):
        if profile.id not in used:
            issues.add(f"pii.profiles[{i}].id", f"PII profile {profile.id!r} is used by no alias")
    if used:
        if pii.keySecretRef is None:
            issues.add("pii.keySecretRef", "required: placeholders are authenticated with this key")
        gated = [p.id for p in pii.profiles if p.id in used and p.minPreservationRate is not None]
        if gated and not pii.conformanceFile:
            issues.add(
                "pii.conformanceFile",
                f"required: PII profile {gated[0]!r} sets minPreservationRate, measured by `tollway pii conformance`",
            )
    for k, ref in enumerate([pii.keySecretRef, *pii.previousKeySecretRefs]):
        if ref is None:
            continue
        problem = _secret_ref_problem(ref)
        if problem:
            issues.add("pii.keySecretRef" if k == 0 else f"pii.previousKeySecretRefs[{k - 1}]", problem)
