"""The conformance function's settings, read from its environment on each invocation.

- ``TOLLWAY_CONFIG``: the ``llm-router.yml`` bundled with the function (the gateway's own), whose
  providers are tested with the credentials it references.
- ``TOLLWAY_CONFORMANCE_DEPLOYMENTS``: comma-separated provider ids to test; empty: every provider
  that serves a chat alias. A scheduled event's ``deployments`` list, when given, wins.
- ``TOLLWAY_CONFORMANCE_RESULTS``: where results go; else the config's ``conformance.results`` when
  it is an ``s3://`` URI; else ``s3://$TOLLWAY_BUCKET_CONFIG/conformance`` (the prefix of the
  config bucket the function may write to).
- ``TOLLWAY_CONFORMANCE_TIMEOUT_S``: seconds per case (default 60).
- ``AWS_ENDPOINT_URL``: a local cloud.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pydantic import BaseModel, ConfigDict, Field

from tollway.exceptions import TollwayError

if TYPE_CHECKING:
    from tollway.config.schema import RouterConfig

__all__ = ["DEFAULT_PREFIX", "ConformanceSettings", "SettingsError"]

DEFAULT_PREFIX: Final = "conformance"


class SettingsError(TollwayError):
    """The function is misconfigured: a deployment problem, raised so the invocation fails loudly."""


class ConformanceSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    config: Path
    deployments: tuple[str, ...] = ()
    results: str = ""
    config_bucket: str = ""
    timeout_s: float = Field(default=60.0, gt=0, le=600)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConformanceSettings:
        env = os.environ if environ is None else environ
        config = env.get("TOLLWAY_CONFIG", "").strip()
        if not config:
            raise SettingsError("TOLLWAY_CONFIG is not set")
        raw = env.get("TOLLWAY_CONFORMANCE_DEPLOYMENTS", "")
        try:
            timeout = float(env.get("TOLLWAY_CONFORMANCE_TIMEOUT_S", "") or 60.0)
        except ValueError:
            raise SettingsError("TOLLWAY_CONFORMANCE_TIMEOUT_S is not a number") from None
        return cls(
            config=Path(config),
            deployments=tuple(d.strip() for d in raw.split(",") if d.strip()),
            results=env.get("TOLLWAY_CONFORMANCE_RESULTS", "").strip(),
            config_bucket=env.get("TOLLWAY_BUCKET_CONFIG", "").strip(),
            timeout_s=timeout,
        )

    def results_for(self, cfg: RouterConfig) -> str:
        """Where this run writes (see the module docstring)."""
        if self.results:
            return self.results
        if cfg.conformance.results.startswith("s3://"):
            return cfg.conformance.results
        if self.config_bucket:
            return f"s3://{self.config_bucket}/{DEFAULT_PREFIX}"
        raise SettingsError("no results location: set TOLLWAY_CONFORMANCE_RESULTS or TOLLWAY_BUCKET_CONFIG")
