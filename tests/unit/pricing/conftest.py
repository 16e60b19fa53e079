from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tollway.pricing import PricingSnapshot, compile_snapshot, parse_models_dev, parse_overrides

DATA = Path(__file__).parent / "data"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def catalog_bytes() -> bytes:
    return (DATA / "models_dev.json").read_bytes()


@pytest.fixture
def overrides_bytes() -> bytes:
    return (DATA / "overrides.yml").read_bytes()


@pytest.fixture
def snapshot(catalog_bytes: bytes, overrides_bytes: bytes) -> PricingSnapshot:
    catalog = parse_models_dev(catalog_bytes, uri="file://models_dev.json")
    overrides = parse_overrides(overrides_bytes, uri="file://overrides.yml")
    return compile_snapshot([catalog], overrides, now=NOW)
