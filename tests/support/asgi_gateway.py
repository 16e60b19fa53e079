"""An in-process gateway for functional tests: a config file, the app, an httpx client over ASGI."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tollway.server.app import create_app

_AWS_SOURCES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


def one_principal(key: str, aliases: list[str]) -> list[dict[str, Any]]:
    """``principals``: one principal ``p`` of tenant ``t``, allowed ``aliases``, holding ``key``."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return [{"id": "p", "tenant": "t", "allowedModels": aliases, "keys": [{"id": "k", "sha256": digest}]}]


def isolate_aws(
    monkeypatch: pytest.MonkeyPatch, folder: Path, access_key: str | None = "testing", secret_key: str = "testing"
) -> None:
    """No AWS credentials but these static keys (none with ``access_key=None``): no profile, file,
    container, web identity or instance metadata source is left for botocore's chain to find."""
    for name in _AWS_SOURCES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(folder / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if access_key is not None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key)


@contextlib.asynccontextmanager
async def asgi_gateway(
    folder: Path, config: Mapping[str, Any], timeout: float = 20
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway serving ``config`` (written to ``folder/llm-router.yml``, not watched),
    closed with the gateway's runtime on exit."""
    path = folder / "llm-router.yml"
    path.write_text(yaml.safe_dump(dict(config)))
    app = create_app(path, watch_interval_s=None)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=timeout)
    try:
        yield client
    finally:
        await client.aclose()
        await app.state.runtime.aclose()
