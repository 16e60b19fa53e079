"""The dataset-export function's settings, read from its environment on each invocation.

- ``TOLLWAY_EXPORTS_BUCKET`` (else ``TOLLWAY_BUCKET_EXPORTS``, the topology's name): where shards
  and manifests are written.
- ``TOLLWAY_CONTENT_BUCKET`` (else ``TOLLWAY_BUCKET_CONTENT``) and ``TOLLWAY_CONTENT_KMS_KEY_ID``:
  the content store it reads (``tollway.content.s3``).
- ``TOLLWAY_TABLE_AUDIT``: the audit table it scans for the source range.
- ``TOLLWAY_QUEUE_AUDIT``: the audit queue (its name) the ``export_finished`` event goes to.
- ``TOLLWAY_CONTENT_RETENTION_DAYS`` (optional): ``<retention class>=<days>`` pairs, comma
  separated; content older than its class's retention is excluded as ``expired`` even while
  its object still exists.
- ``TOLLWAY_EXPORT_FETCH_CONCURRENCY`` (optional, default 8): content objects fetched at once.
- ``AWS_ENDPOINT_URL`` and ``AWS_REGION``: a local cloud, the region.

The export queue itself is the function's trigger (an event source mapping), not a setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tollway.audit.store import StoreSettings
from tollway.content import ContentStoreSettings
from tollway.exceptions import TollwayError
from tollway.export import ExportError, SinkSettings

__all__ = ["RETENTION_ENV", "ExportSettings", "SettingsError", "parse_retention"]

RETENTION_ENV: Final = "TOLLWAY_CONTENT_RETENTION_DAYS"
CONCURRENCY_ENV: Final = "TOLLWAY_EXPORT_FETCH_CONCURRENCY"
AUDIT_QUEUE_ENV: Final = "TOLLWAY_QUEUE_AUDIT"


class SettingsError(ExportError):
    """The function is misconfigured: a deployment problem, raised so the invocation fails loudly."""


def parse_retention(text: str) -> tuple[tuple[str, int], ...]:
    """``"standard=30,short=7"`` as sorted ``(class, days)`` pairs; raises :class:`SettingsError`."""
    pairs: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, days = part.partition("=")
        if not sep or not name.strip() or not days.strip().isdigit() or int(days) < 1:
            raise SettingsError(f"{RETENTION_ENV} must be <class>=<days> pairs, comma separated")
        pairs[name.strip()] = int(days)
    return tuple(sorted(pairs.items()))


class ExportSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    sink: SinkSettings
    content: ContentStoreSettings
    audit_store: StoreSettings
    audit_queue: str = Field(min_length=1, max_length=80)
    retention_days: tuple[tuple[str, int], ...] = ()
    fetch_concurrency: int = Field(default=8, ge=1, le=64)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExportSettings:
        """Raises :class:`SettingsError` naming what is missing or invalid (never a value)."""
        env = os.environ if environ is None else environ
        try:
            sink = SinkSettings.from_env(env)
            content = ContentStoreSettings.from_env(env)
            audit_store = StoreSettings.from_env(env)
        except TollwayError as exc:
            raise SettingsError(str(exc)) from None
        queue = env.get(AUDIT_QUEUE_ENV, "").strip()
        if not queue:
            raise SettingsError(f"{AUDIT_QUEUE_ENV} is not set: it names the audit queue")
        concurrency = env.get(CONCURRENCY_ENV, "").strip() or "8"
        if not concurrency.isdigit():
            raise SettingsError(f"{CONCURRENCY_ENV} must be a whole number")
        try:
            return cls(
                sink=sink,
                content=content,
                audit_store=audit_store,
                audit_queue=queue,
                retention_days=parse_retention(env.get(RETENTION_ENV, "")),
                fetch_concurrency=int(concurrency),
            )
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
            raise SettingsError(f"invalid dataset export settings: {fields}") from None
