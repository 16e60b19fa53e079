"""The pricing-refresh function's settings, read from its environment on each invocation.

- ``TOLLWAY_BUCKET_PRICING``: the bucket snapshots are published to (every function of the stage
  gets it from the topology); ``TOLLWAY_PRICING_PREFIX`` (default ``pricing``) the key prefix.
- ``TOLLWAY_PRICING_SOURCES``: comma-separated ``s3://bucket/key`` or ``file://path`` URIs of
  models.dev-shaped catalogs, lowest precedence first.
- ``TOLLWAY_PRICING_OVERRIDES``: one ``s3://`` or ``file://`` URI of the operator's overrides
  file, which wins over every catalog.
- ``AWS_ENDPOINT_URL``: a local cloud.

When neither source variable is set, the catalog is ``pricing/sources/catalog.json`` in the stage's
config bucket (``TOLLWAY_BUCKET_CONFIG``, which the topology gives every function): the deployed
function needs no account-specific setting. Without that too, the function is misconfigured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from tollway.pricing import PricingError
from tollway.pricing.store import StoreSettings

__all__ = ["DEFAULT_CATALOG_KEY", "MAX_SOURCES", "RefreshSettings", "SettingsError", "check_uri"]

MAX_SOURCES: Final = 16
DEFAULT_CATALOG_KEY: Final = "pricing/sources/catalog.json"
_SCHEMES: Final = ("s3://", "file://")


class SettingsError(PricingError):
    """The function is misconfigured: a deployment problem, raised so the invocation fails loudly."""


def check_uri(uri: str, name: str) -> str:
    """``uri`` if it is an ``s3://bucket/key`` or ``file://path``; :class:`SettingsError` naming ``name`` otherwise."""
    if uri.startswith("s3://"):
        bucket, _, key = uri[5:].partition("/")
        if bucket and key:
            return uri
    elif uri.startswith("file://") and len(uri) > len("file://"):
        return uri
    raise SettingsError(f"{name}: {uri!r} is not an s3://bucket/key or file://path URI")


class RefreshSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    store: StoreSettings
    sources: tuple[str, ...] = Field(default=(), max_length=MAX_SOURCES)
    """Catalog URIs, lowest precedence first."""
    overrides: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RefreshSettings:
        env = os.environ if environ is None else environ
        raw = env.get("TOLLWAY_PRICING_SOURCES", "")
        sources = tuple(check_uri(u.strip(), "TOLLWAY_PRICING_SOURCES") for u in raw.split(",") if u.strip())
        if len(sources) > MAX_SOURCES:
            raise SettingsError(f"TOLLWAY_PRICING_SOURCES: at most {MAX_SOURCES} sources")
        overrides = env.get("TOLLWAY_PRICING_OVERRIDES", "").strip() or None
        if overrides is not None:
            check_uri(overrides, "TOLLWAY_PRICING_OVERRIDES")
        if not sources and overrides is None and env.get("TOLLWAY_BUCKET_CONFIG"):
            sources = (f"s3://{env['TOLLWAY_BUCKET_CONFIG']}/{DEFAULT_CATALOG_KEY}",)
        if not sources and overrides is None:
            raise SettingsError("neither TOLLWAY_PRICING_SOURCES nor TOLLWAY_PRICING_OVERRIDES is set")
        try:
            store = StoreSettings.from_env(env)
        except PricingError as exc:
            raise SettingsError(str(exc)) from None
        return cls(store=store, sources=sources, overrides=overrides)
