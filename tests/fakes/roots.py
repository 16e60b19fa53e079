"""Real published roots whose deployments all send through one ``MockTransport``.

``MockRoots.publish`` takes a config dict through the same shape check and validation as a file
(``tollway.config.loader``), then the real ``Publisher``: plans, health, retry policy and codecs
are the production ones, and only the transport is scripted. ``router_config`` writes the small
configs most gateway tests need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakes.transport import Handler, MockRequest, MockTransport
from tollway.config.loader import parse_config
from tollway.config.root import PublishedRoot, Publisher
from tollway.config.validate import check
from tollway.exceptions import ConfigError
from tollway.governance.principals import Principal
from tollway.secrets import SecretResolver

__all__ = ["ALIAS", "ENV", "PRINCIPAL", "MockRoots", "base_url", "router_config"]

ALIAS = "a"
ENV: Mapping[str, str] = {"KEY": "sk-test"}
"""What ``env:KEY``, every provider's credential in ``router_config``, resolves to."""
PRINCIPAL = Principal("svc", "tenant", None, "service", frozenset(), frozenset({ALIAS}), "key-1")


def base_url(provider: str) -> str:
    return f"https://{provider}.example.test/v1"


def router_config(
    *priorities: int,
    routing: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    routes: Mapping[int, Mapping[str, Any]] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """One alias, ``a``, with a route ``r{i}`` to model ``m{i}`` on provider ``p{i}`` (its own
    account and quota group) at each priority given. ``routing``, ``model`` and ``routes[i]``
    add keys to the routing block, the alias and route ``i``; ``top`` adds top-level keys. Backoff
    is 1-5 ms, which tests do not wait for anyway: they pass ``Gateway`` a recording ``sleep``."""
    providers = {
        f"p{i}": {
            "type": "openai-compatible",
            "baseUrl": base_url(f"p{i}"),
            "providerAccountId": f"acct{i}",
            "quotaGroupId": f"q{i}",
            "credentials": [{"id": f"c{i}", "secretRef": "env:KEY"}],
        }
        for i in range(len(priorities))
    }
    route_list = [
        {
            "id": f"r{i}",
            "provider": f"p{i}",
            "model": f"m{i}",
            "providerFormat": "openai-chat-completions",
            "priority": priority,
            **(routes or {}).get(i, {}),
        }
        for i, priority in enumerate(priorities)
    ]
    return {
        "providers": providers,
        "models": [{"name": ALIAS, "routes": route_list, **(model or {})}],
        "routing": {"baseBackoffMs": 1, "maxBackoffMs": 5, **(routing or {})},
        **top,
    }


class MockRoots:
    """A ``Publisher`` whose transports are bound from one ``MockTransport``; each request the
    handler sees names its provider (by the base URL the config gave it)."""

    def __init__(self, handler: Handler | MockTransport, *, env: Mapping[str, str] = ENV) -> None:
        self.transport = handler if isinstance(handler, MockTransport) else MockTransport(handler)
        self._names: dict[str, str] = {}
        self.publisher = Publisher(
            resolver=SecretResolver(env=dict(env)), transport_factory=self.transport.factory(self._names)
        )

    @property
    def requests(self) -> list[MockRequest]:
        """Every call the published deployments sent, in order."""
        return self.transport.requests

    def publish(self, data: dict[str, Any]) -> PublishedRoot:
        """Check, validate and publish ``data``; raises ``ConfigError`` as loading a file would."""
        cfg = parse_config(data)
        errors = check(cfg).errors
        if errors:
            raise ConfigError(errors)
        names = {p.baseUrl: pid for pid, p in cfg.providers.items()}
        assert len(names) == len(cfg.providers), "MockRoots tells providers apart by base URL: give each its own"
        self._names.update(names)
        return self.publisher.publish(cfg)

    async def aclose(self) -> None:
        await self.publisher.aclose()
