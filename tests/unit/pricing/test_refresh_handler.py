"""The pricing-refresh handler with an in-memory store and file sources."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from functions.pricing_refresh.handler import build_handler
from functions.pricing_refresh.reader import UriReader
from functions.pricing_refresh.settings import RefreshSettings, SettingsError
from tollway.pricing import MemorySnapshotStore, SnapshotStore, SnapshotStoreError, load_current

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data"
EVENT = {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


def settings_for(catalog: Path, overrides: Path | None = None) -> RefreshSettings:
    env = {"TOLLWAY_BUCKET_PRICING": "pricing-bucket", "TOLLWAY_PRICING_SOURCES": f"file://{catalog}"}
    if overrides is not None:
        env["TOLLWAY_PRICING_OVERRIDES"] = f"file://{overrides}"
    return RefreshSettings.from_env(env)


def run(store: SnapshotStore, settings: RefreshSettings) -> dict[str, object]:
    handler = build_handler(lambda _: store, settings=lambda: settings, reader=lambda _: UriReader(), clock=lambda: NOW)
    return handler(EVENT, None)


def test_a_valid_refresh_publishes_and_reports_the_version() -> None:
    store = MemorySnapshotStore()
    outcome = run(store, settings_for(DATA / "models_dev.json", DATA / "overrides.yml"))
    assert outcome["status"] == "published"
    assert (outcome["prices"], outcome["contracts"], outcome["previous"]) == (4, 4, None)
    loaded = load_current(store)
    assert loaded is not None and loaded.version == outcome["version"] == outcome["current"]


def test_a_second_run_on_the_same_sources_is_unchanged() -> None:
    store = MemorySnapshotStore()
    settings = settings_for(DATA / "models_dev.json")
    first = run(store, settings)
    writes = len(store.puts)
    second = run(store, settings)
    assert second["status"] == "unchanged"
    assert second["version"] == first["version"]
    assert len(store.puts) == writes


def test_a_bad_source_keeps_the_last_valid_snapshot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemorySnapshotStore()
    good = run(store, settings_for(DATA / "models_dev.json"))
    bad = tmp_path / "bad.json"
    # A value no temporary path can contain: pytest's directories are numbered (pytest-5, ...).
    bad.write_text('{"acme": {"models": {"m": {"cost": {"input": -987654.25, "output": 1}}}}}')
    writes = list(store.puts)
    with caplog.at_level(logging.WARNING, logger="tollway.pricing_refresh"):
        outcome = run(store, settings_for(bad))
    assert outcome["status"] == "rejected"
    assert outcome["current"] == good["version"]
    assert outcome["issues"] == ["acme.models.m.cost.input: Input should be greater than or equal to 0"]
    assert store.puts == writes
    assert "rejected" in caplog.text and "987654" not in caplog.text


def test_a_missing_source_is_rejected_not_raised(tmp_path: Path) -> None:
    store = MemorySnapshotStore()
    outcome = run(store, settings_for(tmp_path / "absent.json"))
    assert (outcome["status"], outcome["current"], outcome["issues"]) == ("rejected", None, ["<root>: does not exist"])
    assert store.puts == []


def test_a_bad_overrides_file_rejects_the_whole_refresh(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yml"
    overrides.write_text("version: 2\n")
    outcome = run(MemorySnapshotStore(), settings_for(DATA / "models_dev.json", overrides))
    assert outcome["status"] == "rejected"
    assert outcome["source"] == f"file://{overrides}"


class FailingStore(MemorySnapshotStore):
    def put(self, key: str, body: bytes) -> None:
        raise SnapshotStoreError(f"s3://pricing-bucket/{key}: PutObject failed: ServiceUnavailable")


def test_a_store_outage_raises_so_the_schedule_retries() -> None:
    with pytest.raises(SnapshotStoreError, match="ServiceUnavailable"):
        run(FailingStore(), settings_for(DATA / "models_dev.json"))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TOLLWAY_BUCKET_PRICING": "b"}, "neither TOLLWAY_PRICING_SOURCES nor TOLLWAY_PRICING_OVERRIDES"),
        ({"TOLLWAY_BUCKET_PRICING": "b", "TOLLWAY_PRICING_SOURCES": "https://models.dev/api.json"}, "not an s3://"),
        ({"TOLLWAY_BUCKET_PRICING": "b", "TOLLWAY_PRICING_OVERRIDES": "s3://bucket-only"}, "not an s3://"),
        ({"TOLLWAY_PRICING_SOURCES": "file:///x.json"}, "TOLLWAY_BUCKET_PRICING is not set"),
        (
            {"TOLLWAY_BUCKET_PRICING": "b", "TOLLWAY_PRICING_SOURCES": "file:///x.json"},
            "invalid pricing store settings",
        ),
    ],
)
def test_misconfiguration_raises_a_settings_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        RefreshSettings.from_env(env)


def test_sources_are_read_in_declared_order() -> None:
    settings = RefreshSettings.from_env(
        {"TOLLWAY_BUCKET_PRICING": "bkt", "TOLLWAY_PRICING_SOURCES": " s3://a/one.json , file:///two.json ,"}
    )
    assert settings.sources == ("s3://a/one.json", "file:///two.json")
    assert settings.store.prefix == "pricing"


def test_the_stage_config_bucket_is_the_default_catalog_source() -> None:
    settings = RefreshSettings.from_env({"TOLLWAY_BUCKET_PRICING": "bkt", "TOLLWAY_BUCKET_CONFIG": "cfg"})
    assert settings.sources == ("s3://cfg/pricing/sources/catalog.json",)
    assert settings.overrides is None
    explicit = RefreshSettings.from_env(
        {"TOLLWAY_BUCKET_PRICING": "bkt", "TOLLWAY_BUCKET_CONFIG": "cfg", "TOLLWAY_PRICING_OVERRIDES": "s3://o/k.yml"}
    )
    assert (explicit.sources, explicit.overrides) == ((), "s3://o/k.yml")
