"""A provider's enterprise egress: ``proxyUrl``, ``proxyCredentialsSecretRef`` and ``caBundle``.

Validation checks their shape, naming the YAML path and never quoting a credential; publication
resolves the proxy's secret, loads the bundle once, and builds a new transport only when one of
them changed.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.support.tls_upstream import ThrowawayCa
from tollway.config import parse_config, validate
from tollway.config.root import Publisher
from tollway.exceptions import ConfigError, ConfigIssue
from tollway.secrets import SecretResolver
from tollway.transport import TransportSettings

PROXY_ENV = "TOLLWAY_EGRESS_PROXY"
PASSWORD = "pr0xy-pa55word"


def config(**provider: Any) -> dict[str, Any]:
    return {
        "providers": {
            "p": {
                "type": "openai",
                "baseUrl": "https://api.example.com/v1",
                "providerAccountId": "acct",
                "quotaGroupId": "group",
                "credentials": [{"id": "c", "secretRef": "env:KEY"}],
                **provider,
            }
        },
        "models": [
            {
                "name": "m",
                "routes": [{"id": "r", "provider": "p", "model": "x", "providerFormat": "openai-chat-completions"}],
            }
        ],
    }


def issues(**provider: Any) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in validate(parse_config(config(**provider))) if isinstance(i, ConfigIssue)]


def test_a_proxy_with_credentials_and_a_bundle_is_valid() -> None:
    assert (
        issues(
            proxyUrl="http://proxy.corp.example:3128",
            proxyCredentialsSecretRef=f"env:{PROXY_ENV}",
            caBundle="/etc/ssl/corp-ca.pem",
        )
        == []
    )
    assert issues(proxyUrl="https://proxy.corp.example:8443/") == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("socks5://proxy.corp.example:1080", "scheme must be http or https"),
        ("proxy.corp.example:3128", "scheme must be http or https"),
        ("http://proxy.corp.example", "must name the proxy's port"),
        ("http://:3128", "has no host"),
        ("http://proxy.corp.example:3128/path", "no path, query string or fragment"),
        ("http://proxy.corp.example:3128?x=1", "no path, query string or fragment"),
        ("http://proxy.corp.example:99999", "is not a valid URL"),
        ("http://169.254.169.254:80", "link-local or cloud metadata"),
        ("http://${PROXY}:3128", "never templated"),
    ],
)
def test_a_proxy_url_must_be_scheme_host_and_port(url: str, message: str) -> None:
    [(path, text)] = issues(proxyUrl=url)
    assert path == "providers.p.proxyUrl"
    assert message in text


def test_a_proxy_url_with_a_password_is_refused_without_repeating_it() -> None:
    [(path, text)] = issues(proxyUrl=f"http://user:{PASSWORD}@proxy.corp.example:3128")
    assert path == "providers.p.proxyUrl"
    assert "proxyCredentialsSecretRef" in text
    assert PASSWORD not in text


def test_proxy_credentials_must_be_a_secret_reference() -> None:
    [(path, text)] = issues(proxyUrl="http://proxy.corp.example:3128", proxyCredentialsSecretRef=f"user:{PASSWORD}")
    assert path == "providers.p.proxyCredentialsSecretRef"
    assert PASSWORD not in text


def test_proxy_credentials_need_a_proxy() -> None:
    assert issues(proxyCredentialsSecretRef=f"env:{PROXY_ENV}") == [
        ("providers.p.proxyCredentialsSecretRef", "requires proxyUrl: there is no proxy to send them to")
    ]


def test_a_blank_ca_bundle_is_refused() -> None:
    [(path, _)] = issues(caBundle="  ")
    assert path == "providers.p.caBundle"


def test_a_proxy_does_not_relax_the_plain_http_rule() -> None:
    found = issues(baseUrl="http://api.example.com/v1", proxyUrl="http://proxy.corp.example:3128")
    assert [path for path, _ in found] == ["providers.p.baseUrl"]


# publication


def publisher(tmp_path: Path, **env: str) -> Publisher:
    return Publisher(resolver=SecretResolver(env={"KEY": "sk", **env}), config_dir=tmp_path)


def settings_of(publisher: Publisher, **provider: Any) -> TransportSettings:
    root = publisher.publish(parse_config(config(**provider)))
    settings = root.deployments["p"].transport.settings  # type: ignore[attr-defined]
    assert isinstance(settings, TransportSettings)
    return settings


def test_publication_resolves_the_proxy_credentials_and_loads_the_bundle_once(tmp_path: Path) -> None:
    ca = ThrowawayCa.create(tmp_path)
    pub = publisher(tmp_path, **{PROXY_ENV: f"egress:{PASSWORD}"})
    settings = settings_of(
        pub,
        proxyUrl="http://proxy.corp.example:3128",
        proxyCredentialsSecretRef=f"env:{PROXY_ENV}",
        caBundle=ca.bundle.name,  # relative: to the config file's folder
    )
    assert settings.proxy is not None and settings.proxy.url == "http://proxy.corp.example:3128"
    assert settings.proxy.authorization == "Basic " + base64.b64encode(f"egress:{PASSWORD}".encode()).decode()
    assert settings.ca_bundle == str(ca.bundle)
    assert settings.ssl_context is not None
    assert settings.ssl_context.get_ca_certs()[0]["subject"] == ((("commonName", "Tollway test CA"),),)
    assert PASSWORD not in repr(settings) and "Basic" not in repr(settings)


def test_a_missing_or_unparsable_bundle_fails_publication_at_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        settings_of(publisher(tmp_path), caBundle="absent.pem")
    [issue] = missing.value.issues
    assert issue.path == "providers.p.caBundle" and "cannot be read (FileNotFoundError)" in issue.message
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError) as junk:
        settings_of(publisher(tmp_path), caBundle="junk.pem")
    [issue] = junk.value.issues
    assert issue.path == "providers.p.caBundle" and "no PEM CA certificate" in issue.message


@pytest.mark.parametrize("value", ["", "no-colon", ":only-password"])
def test_proxy_credentials_that_are_not_user_and_password_fail_publication_unquoted(tmp_path: Path, value: str) -> None:
    pub = publisher(tmp_path, **{PROXY_ENV: value})
    with pytest.raises(ConfigError) as info:
        settings_of(pub, proxyUrl="http://proxy.corp.example:3128", proxyCredentialsSecretRef=f"env:{PROXY_ENV}")
    [issue] = info.value.issues
    assert issue.path == "providers.p.proxyCredentialsSecretRef"
    assert not value or value not in issue.message


def test_a_reload_rebuilds_the_transport_only_when_the_egress_changed(tmp_path: Path) -> None:
    ca = ThrowawayCa.create(tmp_path)
    env = {PROXY_ENV: f"egress:{PASSWORD}"}
    resolver_env = {"KEY": "sk", **env}
    pub = Publisher(resolver=SecretResolver(env=resolver_env), config_dir=tmp_path)
    egress = {
        "proxyUrl": "http://proxy.corp.example:3128",
        "proxyCredentialsSecretRef": f"env:{PROXY_ENV}",
        "caBundle": str(ca.bundle),
    }

    def transport(**provider: Any) -> object:
        return pub.publish(parse_config(config(**provider))).deployments["p"].transport

    first = transport(**egress)
    assert transport(**egress) is first, "unchanged egress keeps the warm pool"
    moved = transport(**{**egress, "proxyUrl": "http://proxy2.corp.example:3128"})
    assert moved is not first
    resolver_env[PROXY_ENV] = f"egress:{PASSWORD}-rotated"
    rotated = transport(**{**egress, "proxyUrl": "http://proxy2.corp.example:3128"})
    assert rotated is not moved, "a rotated proxy password builds a new transport"
    (tmp_path / "other").mkdir()
    ca.bundle.write_bytes(ca.bundle.read_bytes() + ThrowawayCa.create(tmp_path / "other").bundle.read_bytes())
    assert transport(**{**egress, "proxyUrl": "http://proxy2.corp.example:3128"}) is not rotated, (
        "a changed CA bundle builds a new transport"
    )
