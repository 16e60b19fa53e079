"""The gateway picks a new pricing snapshot up from S3 off the request path, as a pricing-only root."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from tollway.cloud.local import LocalCloud
from tollway.pricing import ModelPrice, PricingSnapshot, Rates, publish
from tollway.pricing.store import S3SnapshotStore
from tollway.server.app import create_app

pytestmark = pytest.mark.local_cloud


def snapshot(input_usd_per_mtok: int) -> PricingSnapshot:
    micro = input_usd_per_mtok * 1_000_000
    rates = Rates(micro, micro * 3, micro, micro, micro * 3)
    return PricingSnapshot.build([ModelPrice("openai", "phys", rates)], effective_from=datetime(2026, 1, 1, tzinfo=UTC))


def config(bucket: str) -> dict[str, Any]:
    return {
        "providers": {
            "p": {
                "type": "openai-compatible",
                "pricingProvider": "openai",
                "baseUrl": "http://127.0.0.1:9/v1",
                "providerAccountId": "a",
                "quotaGroupId": "a",
                "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_WATCH_PROVIDER_KEY"}],
            }
        },
        "models": [
            {
                "name": "chat",
                "routes": [{"id": "r", "provider": "p", "model": "phys", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            {
                "id": "u",
                "tenant": "t",
                "allowedModels": ["chat"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(b"x").hexdigest()}],
            }
        ],
        "governance": {"pricing": {"bucket": bucket, "refreshIntervalMs": 1000}},
    }


async def wait_for_version(runtime: Any, version: str, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while runtime.holder.root.pricing.version != version:
        assert asyncio.get_running_loop().time() < deadline, f"snapshot {version} never became active"
        await asyncio.sleep(0.05)


async def test_a_published_snapshot_becomes_a_pricing_only_root(
    cloud: LocalCloud, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**cloud.env(), "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOLLWAY_WATCH_PROVIDER_KEY", "sk-watch")
    bucket = f"{prefix}-pricing"
    s3 = boto3.client("s3", endpoint_url=cloud.endpoint, region_name=cloud.region)
    s3.create_bucket(Bucket=bucket)
    store = S3SnapshotStore(bucket, client=s3)
    first = snapshot(10)
    publish(store, first, now=datetime.now(UTC))
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(config(bucket)))
    app = create_app(path, watch_interval_s=None)
    runtime = app.state.runtime
    assert runtime.holder.root.pricing.version is None  # nothing is read from S3 at import
    task = asyncio.ensure_future(runtime.watch_pricing())
    try:
        await wait_for_version(runtime, first.version)
        before = runtime.holder.root
        assert before.pricing.aliases["chat"].reservation(1000, 0) == 10_000
        second = snapshot(20)
        publish(store, second, now=datetime.now(UTC))
        await wait_for_version(runtime, second.version)
        after = runtime.holder.root
        assert after.generation > before.generation
        assert after.pricing.aliases["chat"].reservation(1000, 0) == 20_000
        for name in ("aliases", "keys", "deployments", "governance"):
            assert getattr(after, name) is getattr(before, name), name
        # A broken pointer is refused and the last valid snapshot stays.
        s3.put_object(Bucket=bucket, Key="pricing/current.json", Body=b"{not json")
        await asyncio.sleep(1.5)
        assert runtime.holder.root.pricing.version == second.version
    finally:
        task.cancel()
        await runtime.aclose()
