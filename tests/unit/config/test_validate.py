"""Semantic validation: one case per rejection rule, each asserting the exact YAML path reported."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tollway.config import RouterConfig, parse_config, validate
from tollway.config.loader import load_yaml
from tollway.exceptions import ConfigError, ConfigIssue

DIGEST_A = "a" * 64
DIGEST_B = "0123456789abcdef" * 4


def base_config() -> dict[str, Any]:
    """A valid configuration touching every section; tests mutate a fresh copy."""
    return {
        "pathPrefix": "/v1",
        "requestTimeoutMs": 120000,
        "streamIdleTimeoutMs": 30000,
        "admission": {"maxQueuedRequests": 0, "maxQueueWaitMs": 0, "maxStreamLifetimeMs": 120000},
        "providers": {
            "openai-primary": {
                "type": "openai",
                "baseUrl": "https://api.openai.com/v1",
                "providerAccountId": "openai-account",
                "quotaGroupId": "openai-tier",
                "credentials": [
                    {"id": "openai-current", "secretRef": "env:TOLLWAY_OPENAI_KEY", "lifecycle": "current"},
                    {"id": "openai-next", "secretRef": "aws-sm:tollway/openai#next", "lifecycle": "next"},
                ],
            },
            "anthropic-primary": {
                "type": "anthropic",
                "baseUrl": "https://api.anthropic.com",
                "providerAccountId": "anthropic-account",
                "quotaGroupId": "anthropic-tier",
                "credentials": [{"id": "anthropic-current", "secretRef": "aws-sm:tollway/anthropic"}],
            },
        },
        "models": [
            {
                "name": "chat-fast-v1",
                "capabilities": ["streaming", "tools", "vision"],
                "regions": ["ca", "us"],
                "routes": [
                    {
                        "id": "openai-fast-primary",
                        "provider": "openai-primary",
                        "model": "physical-a",
                        "providerFormat": "openai-chat-completions",
                        "priority": 0,
                        "weight": 80,
                        "regions": ["ca", "us"],
                    },
                    {
                        "id": "anthropic-fast-fallback",
                        "provider": "anthropic-primary",
                        "model": "physical-b",
                        "providerFormat": "anthropic-messages",
                        "priority": 1,
                        "weight": 100,
                    },
                ],
            }
        ],
        "routing": {
            "strategy": "priority-weighted",
            "maxAttempts": 3,
            "baseBackoffMs": 100,
            "maxBackoffMs": 2000,
            "circuitBreaker": {"failureThreshold": 5, "resetTimeoutMs": 30000, "halfOpenRequests": 1},
        },
        "principals": [
            {
                "id": "svc-checkout",
                "tenant": "acme",
                "allowedModels": ["chat-fast-v1"],
                "keys": [
                    {"id": "checkout-1", "sha256": DIGEST_A},
                    {"id": "checkout-2", "secretRef": "env:TOLLWAY_CHECKOUT_KEY"},
                ],
            }
        ],
    }


_TOKEN = re.compile(r"[^.\[\]]+|\[\d+\]")


def _locate(data: Any, path: str) -> tuple[Any, str | int]:
    tokens = [int(t[1:-1]) if t.startswith("[") else t for t in _TOKEN.findall(path)]
    for token in tokens[:-1]:
        data = data[token]
    return data, tokens[-1]


def put(data: dict[str, Any], path: str, value: Any) -> None:
    parent, last = _locate(data, path)
    parent[last] = value


def drop(data: dict[str, Any], path: str) -> None:
    parent, last = _locate(data, path)
    del parent[last]


def issues_of(data: dict[str, Any]) -> list[ConfigIssue]:
    return validate(parse_config(data))


def with_edits(**edits: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        for path, value in edits.items():
            put(data, path, value)

    return apply


def edit(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: put(data, path, value)


def _duplicate_model(data: dict[str, Any]) -> None:
    clone = copy.deepcopy(data["models"][0])
    for i, route in enumerate(clone["routes"]):
        route["id"] = f"clone-{i}"
    data["models"].append(clone)


def _duplicate_route_id_across_models(data: dict[str, Any]) -> None:
    clone = copy.deepcopy(data["models"][0])
    clone["name"] = "chat-other-v1"
    clone["routes"][0]["id"] = "other-0"
    clone["routes"][1]["id"] = "openai-fast-primary"
    data["models"].append(clone)


def _second_principal(**overrides: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        principal = {"id": "svc-search", "tenant": "acme", "keys": [{"id": "search-1", "sha256": DIGEST_B}]}
        principal.update(overrides)
        data["principals"].append(principal)

    return apply


def _add_credential(**cred: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["providers"]["openai-primary"]["credentials"].append(cred)


def _two_zero_weight_routes(data: dict[str, Any]) -> None:
    for route in data["models"][0]["routes"]:
        route["priority"] = 2
        route["weight"] = 0


def _embeddings_alias(*, drop_anthropic: bool = False, **fields: Any) -> Callable[[dict[str, Any]], None]:
    """models[0] as an embeddings alias (its second route is Anthropic-format, which cannot embed)."""

    def apply(data: dict[str, Any]) -> None:
        model = data["models"][0]
        model.update({"operations": ["embeddings"], "capabilities": ["streaming"], **fields})
        if drop_anthropic:
            model["routes"] = model["routes"][:1]

    return apply


P = "providers.openai-primary"
R0 = "models[0].routes[0]"
R1 = "models[0].routes[1]"

CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    # duplicates
    ("duplicate-alias", _duplicate_model, "models[1].name", "duplicate alias 'chat-fast-v1'"),
    ("duplicate-route-id-global", _duplicate_route_id_across_models, "models[1].routes[1].id", "duplicate route id"),
    ("duplicate-principal-id", _second_principal(id="svc-checkout"), "principals[1].id", "duplicate principal id"),
    (
        "duplicate-key-id-global",
        _second_principal(keys=[{"id": "checkout-1", "sha256": DIGEST_B}]),
        "principals[1].keys[0].id",
        "duplicate key id",
    ),
    (
        "duplicate-credential-id",
        _add_credential(id="openai-current", secretRef="env:OTHER", lifecycle="retiring"),
        f"{P}.credentials[2].id",
        "duplicate credential id",
    ),
    (
        "duplicate-sha256",
        _second_principal(keys=[{"id": "search-1", "sha256": DIGEST_A}]),
        "principals[1].keys[0].sha256",
        "same digest as principals[0].keys[0]",
    ),
    # routes and providers
    ("unknown-route-provider", edit(f"{R0}.provider", "nope"), f"{R0}.provider", "unknown provider 'nope'"),
    ("unknown-provider-format", edit(f"{R0}.providerFormat", "cohere"), f"{R0}.providerFormat", "unknown provider"),
    (
        "provider-type-format-mismatch",
        edit(f"{R1}.providerFormat", "openai-chat-completions"),
        f"{R1}.providerFormat",
        "provider of type 'anthropic'",
    ),
    ("openai-compatible-cannot-speak-anthropic", edit(f"{P}.type", "anthropic"), f"{R0}.providerFormat", "type"),
    # credentials and deployment identity
    ("api-key-without-credentials", edit(f"{P}.credentials", []), f"{P}.credentials", "at least one credential"),
    ("literal-secret-ref", edit(f"{P}.credentials[0].secretRef", "sk-abc"), f"{P}.credentials[0].secretRef", "literal"),
    (
        "unsupported-secret-scheme",
        edit(f"{P}.credentials[0].secretRef", "vault:kv/openai"),
        f"{P}.credentials[0].secretRef",
        "unsupported",
    ),
    ("bad-env-ref", edit(f"{P}.credentials[0].secretRef", "env:1X"), f"{P}.credentials[0].secretRef", "env:"),
    ("bad-aws-sm-ref", edit(f"{P}.credentials[0].secretRef", "aws-sm:"), f"{P}.credentials[0].secretRef", "aws-sm:"),
    (
        "two-current-credentials",
        edit(f"{P}.credentials[1].lifecycle", "current"),
        f"{P}.credentials[1].lifecycle",
        "only one credential may be 'current'",
    ),
    ("no-current-credential", edit(f"{P}.credentials[0].lifecycle", "retiring"), f"{P}.credentials", "'current'"),
    ("missing-account", lambda d: drop(d, f"{P}.providerAccountId"), f"{P}.providerAccountId", "required"),
    ("blank-quota-group", edit(f"{P}.quotaGroupId", " "), f"{P}.quotaGroupId", "required"),
    # aliases and capabilities
    (
        "unknown-alias-capability",
        edit("models[0].capabilities", ["streaming", "telepathy"]),
        "models[0].capabilities[1]",
        "unknown capability 'telepathy'",
    ),
    (
        "unknown-route-capability",
        edit(f"{R0}.capabilities", ["streaming", "tools", "vision", "smell"]),
        f"{R0}.capabilities[3]",
        "unknown capability 'smell'",
    ),
    ("unknown-client-format", edit("models[0].clientFormats", ["anthropic"]), "models[0].clientFormats[0]", "unknown"),
    ("unknown-operation", edit("models[0].operations", ["rerank"]), "models[0].operations[0]", "unknown"),
    ("embeddings-on-a-route-that-cannot-embed", _embeddings_alias(), f"{R1}.providerFormat", "cannot embed"),
    (
        "chat-and-embeddings-on-one-alias",
        _embeddings_alias(operations=["chat", "embeddings"], drop_anthropic=True),
        "models[0].operations",
        "not both",
    ),
    (
        "chat-capability-on-an-embeddings-alias",
        _embeddings_alias(capabilities=["streaming", "tools"], drop_anthropic=True),
        "models[0].capabilities",
        "'tools'",
    ),
    (
        "chat-format-on-an-embeddings-alias",
        _embeddings_alias(clientFormats=["openai-chat-completions"], drop_anthropic=True),
        "models[0].clientFormats",
        "'openai-embeddings' only",
    ),
    (
        "embeddings-format-on-a-chat-alias",
        edit("models[0].clientFormats", ["openai-embeddings"]),
        "models[0].clientFormats",
        "operations [embeddings]",
    ),
    ("opaque-processing", edit("models[0].processingMode", "opaque"), "models[0].processingMode", "not supported yet"),
    ("detect-processing", edit("models[0].processingMode", "detect"), "models[0].processingMode", "not supported yet"),
    ("unknown-processing", edit("models[0].processingMode", "raw"), "models[0].processingMode", "unknown"),
    (
        "fallback-format-lacks-capability",
        edit("models[0].capabilities", ["streaming", "json_schema"]),
        f"{R1}.providerFormat",
        "'json_schema'",
    ),
    (
        "route-capabilities-narrow-too-far",
        edit(f"{R0}.capabilities", ["streaming", "tools"]),
        f"{R0}.capabilities",
        "'vision'",
    ),
    ("route-misses-alias-region", edit(f"{R0}.regions", ["ca"]), f"{R0}.regions", "'us'"),
    # token bounds and route weights
    ("max-input-tokens", edit("models[0].maxInputTokens", 0), "models[0].maxInputTokens", "positive"),
    ("max-output-tokens", edit("models[0].maxOutputTokens", -1), "models[0].maxOutputTokens", "positive"),
    (
        "default-output-above-max",
        edit("models[0].defaultMaxOutputTokens", 9000),
        "models[0].defaultMaxOutputTokens",
        "must not exceed maxOutputTokens (8192)",
    ),
    ("default-output-zero", edit("models[0].defaultMaxOutputTokens", 0), "models[0].defaultMaxOutputTokens", "pos"),
    ("alias-without-routes", edit("models[0].routes", []), "models[0].routes", "no routes"),
    ("negative-weight", edit(f"{R0}.weight", -1), f"{R0}.weight", "negative"),
    ("all-zero-weights", _two_zero_weight_routes, "models[0].routes", "priority 2 has weight 0"),
    ("negative-priority", edit(f"{R0}.priority", -1), f"{R0}.priority", "negative"),
    # timeouts and bounds
    ("request-timeout", edit("requestTimeoutMs", 0), "requestTimeoutMs", "positive"),
    ("stream-idle-timeout", edit("streamIdleTimeoutMs", 0), "streamIdleTimeoutMs", "positive"),
    ("provider-connect-timeout", edit(f"{P}.connectTimeoutMs", 0), f"{P}.connectTimeoutMs", "positive"),
    ("provider-request-timeout", edit(f"{P}.requestTimeoutMs", -5), f"{P}.requestTimeoutMs", "positive"),
    ("stream-setup-timeout", edit("admission.streamSetupTimeoutMs", 0), "admission.streamSetupTimeoutMs", "pos"),
    ("stream-lifetime", edit("admission.maxStreamLifetimeMs", 0), "admission.maxStreamLifetimeMs", "positive"),
    (
        "write-progress-timeout",
        edit("admission.downstreamWriteProgressTimeoutMs", 0),
        "admission.downstreamWriteProgressTimeoutMs",
        "positive",
    ),
    ("body-read-timeout", edit("admission.bodyReadTimeoutMs", 0), "admission.bodyReadTimeoutMs", "positive"),
    ("negative-base-backoff", edit("routing.baseBackoffMs", -1), "routing.baseBackoffMs", "negative"),
    (
        "max-backoff-below-base",
        with_edits(**{"routing.baseBackoffMs": 500, "routing.maxBackoffMs": 100}),
        "routing.maxBackoffMs",
        "at least baseBackoffMs (500)",
    ),
    (
        "breaker-threshold",
        edit("routing.circuitBreaker.failureThreshold", 0),
        "routing.circuitBreaker.failureThreshold",
        "",
    ),
    ("breaker-reset", edit("routing.circuitBreaker.resetTimeoutMs", 0), "routing.circuitBreaker.resetTimeoutMs", ""),
    (
        "breaker-half-open",
        edit("routing.circuitBreaker.halfOpenRequests", 0),
        "routing.circuitBreaker.halfOpenRequests",
        "",
    ),
    (
        "connect-above-request-timeout",
        with_edits(**{f"{P}.connectTimeoutMs": 5000, f"{P}.requestTimeoutMs": 4000}),
        f"{P}.connectTimeoutMs",
        "requestTimeoutMs (4000)",
    ),
    (
        "idle-above-stream-lifetime",
        edit("streamIdleTimeoutMs", 200000),
        "streamIdleTimeoutMs",
        "admission.maxStreamLifetimeMs (120000)",
    ),
    ("body-bytes-zero", edit("maxRequestBodyBytes", 0), "maxRequestBodyBytes", "64 MiB"),
    ("body-bytes-above-64mib", edit("maxRequestBodyBytes", 64 * 1024 * 1024 + 1), "maxRequestBodyBytes", "64 MiB"),
    ("response-bytes-zero", edit("maxResponseBodyBytes", 0), "maxResponseBodyBytes", "positive"),
    ("concurrent-requests", edit("maxConcurrentRequests", 0), "maxConcurrentRequests", "bounded"),
    ("concurrent-streams", edit("maxConcurrentStreams", -1), "maxConcurrentStreams", "bounded"),
    ("max-connections", edit(f"{P}.maxConnections", 0), f"{P}.maxConnections", "bounded"),
    ("stream-buffer", edit("admission.streamBufferEvents", 0), "admission.streamBufferEvents", "bounded"),
    ("drain-rate", edit("admission.minStreamDrainBytesPerSecond", -1), "admission.minStreamDrainBytesPerSecond", "neg"),
    ("max-attempts-zero", edit("routing.maxAttempts", 0), "routing.maxAttempts", "between 1 and 10"),
    ("max-attempts-eleven", edit("routing.maxAttempts", 11), "routing.maxAttempts", "between 1 and 10"),
    ("retry-status-3xx", edit("routing.retryStatuses", [429, 302]), "routing.retryStatuses[1]", "400 and 599"),
    ("session-header", edit("routing.sessionHeader", "X Session"), "routing.sessionHeader", "header name"),
    # policies and strategy
    ("global-parameter-policy", edit("unsupportedParameterPolicy", "warn"), "unsupportedParameterPolicy", "'warn'"),
    (
        "alias-parameter-policy",
        edit("models[0].unsupportedParameterPolicy", "drop"),
        "models[0].unsupportedParameterPolicy",
        "'drop'",
    ),
    ("routing-strategy", edit("routing.strategy", "random"), "routing.strategy", "unknown strategy 'random'"),
    # admission
    ("negative-queue", edit("admission.maxQueuedRequests", -1), "admission.maxQueuedRequests", "negative"),
    ("queue-without-deadline", edit("admission.maxQueuedRequests", 10), "admission.maxQueueWaitMs", "deadline"),
    ("negative-queue-wait", edit("admission.maxQueueWaitMs", -1), "admission.maxQueueWaitMs", "negative"),
    # principals and keys
    ("key-with-neither", edit("principals[0].keys[0]", {"id": "k"}), "principals[0].keys[0]", "exactly one"),
    (
        "key-with-both",
        edit("principals[0].keys[0]", {"id": "k", "sha256": DIGEST_B, "secretRef": "env:K"}),
        "principals[0].keys[0]",
        "exactly one",
    ),
    ("sha256-uppercase", edit("principals[0].keys[0].sha256", "A" * 64), "principals[0].keys[0].sha256", "lowercase"),
    ("sha256-short", edit("principals[0].keys[0].sha256", "ab12"), "principals[0].keys[0].sha256", "64"),
    ("key-literal-secret", edit("principals[0].keys[1].secretRef", "tw-123"), "principals[0].keys[1].secretRef", "lit"),
    (
        "allowed-model-unknown",
        edit("principals[0].allowedModels", ["chat-fast-v1", "chat-huge"]),
        "principals[0].allowedModels[1]",
        "unknown model alias 'chat-huge'",
    ),
    ("principal-without-keys", edit("principals[0].keys", []), "principals[0].keys", "no keys"),
    ("empty-tenant", edit("principals[0].tenant", ""), "principals[0].tenant", "empty"),
    ("blank-principal-id", edit("principals[0].id", "  "), "principals[0].id", "empty"),
    ("blank-route-id", edit(f"{R0}.id", ""), f"{R0}.id", "empty"),
    ("blank-route-model", edit(f"{R0}.model", ""), f"{R0}.model", "empty"),
    # pathPrefix
    ("prefix-without-slash", edit("pathPrefix", "v1"), "pathPrefix", "must start with '/'"),
    ("prefix-trailing-slash", edit("pathPrefix", "/v1/"), "pathPrefix", "must not end with '/'"),
    ("prefix-root", edit("pathPrefix", "/"), "pathPrefix", "must not end with '/'"),
    # audit
    (
        "audit-local-durable-on-ephemeral",
        lambda d: d.update(audit={"durability": "local-durable"}),
        "audit.spool.persistenceClass",
        "local-durable needs a persistent volume",
    ),
    (
        "audit-wal-smaller-than-two-segments",
        lambda d: d.update(audit={"spool": {"maxBytes": 100 * 2**20, "segmentBytes": 64 * 2**20}}),
        "audit.spool.maxBytes",
        "at least twice segmentBytes",
    ),
    (
        "audit-record-larger-than-half-a-segment",
        lambda d: d.update(audit={"spool": {"maxRecordBytes": 2**20, "segmentBytes": 2**20, "maxBytes": 2**22}}),
        "audit.spool.maxRecordBytes",
        "at most half of segmentBytes",
    ),
    (
        "audit-unbounded-commit-timeout",
        lambda d: d.update(audit={"spool": {"commitTimeoutMs": 0}}),
        "audit.spool.commitTimeoutMs",
        "must be positive",
    ),
    (
        "audit-loop-write-delay-over-a-second",
        lambda d: d.update(audit={"spool": {"asyncWriteDelayMs": 1001}}),
        "audit.spool.asyncWriteDelayMs",
        "between 0 and 1000",
    ),
    (
        "audit-negative-loop-write-delay",
        lambda d: d.update(audit={"spool": {"asyncWriteDelayMs": -1}}),
        "audit.spool.asyncWriteDelayMs",
        "between 0 and 1000",
    ),
    (
        "audit-kafka-without-servers",
        lambda d: d.update(audit={"sink": {"type": "kafka"}}),
        "audit.sink.bootstrapServers",
        "required when sink.type is kafka",
    ),
]


def test_baseline_config_is_valid() -> None:
    assert issues_of(base_config()) == []


@pytest.mark.parametrize(("mutate", "path", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejection_reports_exact_path(mutate: Callable[[dict[str, Any]], None], path: str, fragment: str) -> None:
    data = base_config()
    mutate(data)
    issues = issues_of(data)
    assert [i.path for i in issues] == [path], issues
    assert fragment in issues[0].message


UNSAFE_URLS = {
    "plain-http-remote": "http://api.example.com/v1",
    "user-info": "https://user:hunter2@api.example.com/v1",
    "query": "https://api.example.com/v1?api-version=1",
    "empty-query": "https://api.example.com/v1?",
    "fragment": "https://api.example.com/v1#x",
    "empty-host": "https:///v1",
    "template-host": "https://{tenant}.example.com/v1",
    "placeholder": "https://api.example.com/$region/v1",
    "whitespace": "https://api.example.com/v1 ",
    "metadata-ipv4": "https://169.254.169.254/latest",
    "link-local-ipv6": "https://[fe80::1]/v1",
    "metadata-ipv4-mapped": "https://[::ffff:169.254.169.254]/",
    "metadata-hostname": "http://metadata.google.internal/computeMetadata/v1",
    "metadata-hostname-tls": "https://Metadata.Google.Internal./computeMetadata/v1",
    "aws-ipv6-metadata": "https://[fd00:ec2::254]/",
    "legacy-numeric-host": "https://0xa9fea9fe/",
    "decimal-host": "https://2852039166/",
    "unspecified": "https://0.0.0.0:8080/",
    "ftp": "ftp://files.example.com/",
    "file": "file:///etc/passwd",
    "no-scheme": "api.openai.com/v1",
    "bad-port": "https://api.example.com:99999/",
}


@pytest.mark.parametrize("url", UNSAFE_URLS.values(), ids=UNSAFE_URLS.keys())
def test_unsafe_base_url_is_rejected_without_echoing_it(url: str) -> None:
    data = base_config()
    put(data, f"{P}.baseUrl", url)
    issues = issues_of(data)
    assert [i.path for i in issues] == [f"{P}.baseUrl"]
    assert url.strip() not in issues[0].message
    assert "hunter2" not in issues[0].message


@pytest.mark.parametrize(
    ("url", "insecure"),
    [
        ("http://127.0.0.1:8080/v1", False),
        ("http://127.8.9.10:8080", False),
        ("http://localhost:9000", False),
        ("http://[::1]:9000/v1", False),
        ("http://mock.internal:9000/v1", True),
        ("https://example.openai.azure.com/openai/v1", False),
        ("https://10.0.0.5:8443", False),
    ],
)
def test_safe_base_url_is_accepted(url: str, insecure: bool) -> None:
    data = base_config()
    put(data, f"{P}.baseUrl", url)
    put(data, f"{P}.allowInsecureHttp", insecure)
    assert issues_of(data) == []


def test_auth_mode_none_needs_no_credentials() -> None:
    data = base_config()
    put(data, f"{P}.authMode", "none")
    put(data, f"{P}.credentials", [])
    assert issues_of(data) == []


def test_route_without_regions_or_capabilities_serves_everything_its_format_can() -> None:
    data = base_config()
    put(data, "models[0].capabilities", ["streaming", "json_schema", "json_object"])
    drop(data, "models[0].routes[1]")
    put(data, f"{R0}.regions", [])
    assert issues_of(data) == []


def test_weights_are_checked_per_priority_group() -> None:
    data = base_config()
    put(data, f"{R0}.weight", 0)
    put(data, f"{R1}.priority", 0)
    assert issues_of(data) == []


def test_openai_compatible_provider_serves_openai_format() -> None:
    data = base_config()
    put(data, f"{P}.type", "openai-compatible")
    assert issues_of(data) == []


def test_aws_secret_arn_reference_is_accepted() -> None:
    data = base_config()
    arn = "aws-sm:arn:aws:secretsmanager:ca-central-1:123456789012:secret:tollway/openai-AbCdEf#apiKey"
    put(data, f"{P}.credentials[0].secretRef", arn)
    assert issues_of(data) == []


def test_every_issue_is_reported_at_once() -> None:
    data = base_config()
    put(data, "pathPrefix", "v1")
    put(data, "routing.maxAttempts", 0)
    put(data, "admission.maxQueuedRequests", 3)
    put(data, f"{P}.baseUrl", "http://api.example.com")
    put(data, f"{R1}.provider", "missing")
    put(data, "principals[0].tenant", "")
    paths = {i.path for i in issues_of(data)}
    assert paths == {
        "pathPrefix",
        "routing.maxAttempts",
        "admission.maxQueueWaitMs",
        f"{P}.baseUrl",
        f"{R1}.provider",
        "principals[0].tenant",
    }


def test_provider_names_that_are_not_identifiers_are_quoted_in_paths() -> None:
    data = base_config()
    data["providers"]["openai.eu"] = data["providers"].pop("openai-primary")
    put(data, f"{R0}.provider", "openai.eu")
    data["providers"]["openai.eu"]["maxConnections"] = 0
    assert [i.path for i in issues_of(data)] == ['providers["openai.eu"].maxConnections']


def test_no_secret_value_or_digest_appears_in_any_message() -> None:
    secret = "sk-live-S3CR3T-value-0123456789"
    data = base_config()
    put(data, f"{P}.credentials[0].secretRef", secret)
    put(data, f"{P}.credentials[1].secretRef", f"vault:{secret}")
    put(data, f"{P}.baseUrl", f"https://svc:{secret}@api.example.com/v1")
    put(data, "principals[0].keys[1].secretRef", f"env:{secret}")
    put(data, "principals[0].keys[0].sha256", DIGEST_A.upper())
    data["principals"].append({"id": "p2", "tenant": "t", "keys": [{"id": "k2", "sha256": DIGEST_B}]})
    data["principals"].append({"id": "p3", "tenant": "t", "keys": [{"id": "k3", "sha256": DIGEST_B}]})
    issues = issues_of(data)
    assert len(issues) == 6
    rendered = str(ConfigError(issues))
    for forbidden in (secret, "S3CR3T", DIGEST_A, DIGEST_A.upper(), DIGEST_B):
        assert forbidden not in rendered


def test_secret_interpolated_from_env_never_appears_in_messages(tmp_path: Any) -> None:
    secret = "sk-proj-FAKE-ENV-SECRET-42"
    path = tmp_path / "llm-router.yml"
    path.write_text(
        "providers:\n"
        "  p:\n"
        "    type: openai\n"
        "    baseUrl: https://api.openai.com/v1\n"
        "    providerAccountId: a\n"
        "    quotaGroupId: q\n"
        "    credentials:\n"
        "      - id: c\n"
        "        secretRef: ${TOLLWAY_LEAKY}\n",
        encoding="utf-8",
    )
    data = load_yaml(path, {"TOLLWAY_LEAKY": secret})
    issues = issues_of(data)
    assert [i.path for i in issues] == ["providers.p.credentials[0].secretRef"]
    assert secret not in str(ConfigError(issues))


def test_validate_accepts_a_model_instance_built_directly() -> None:
    cfg = RouterConfig()
    assert validate(cfg) == []
