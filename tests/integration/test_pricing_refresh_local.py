"""The pricing refresh on the local cloud: S3 sources → the deployed handler → snapshot and pointer in S3.

Each test bootstraps the ``pricing`` and ``config`` buckets of a fresh stage from ``topology()``
and sets the environment the function gets on Lambda, so :data:`functions.pricing_refresh.handler.handler`
builds its S3 store and reader from it, as deployed. The public catalog is read from the config
bucket (``s3://``), the overrides file from the filesystem (``file://``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from functions.pricing_refresh import handler as handler_module
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import topology
from tollway.pricing import Cost, load_current, pointer_key, price, snapshot_key
from tollway.pricing.store import S3SnapshotStore

pytestmark = pytest.mark.local_cloud

DATA = Path(__file__).parent.parent / "unit" / "pricing" / "data"
EVENT = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
CATALOG_KEY = "pricing-sources/models_dev.json"


@dataclass
class Rig:
    s3: Any
    pricing_bucket: str
    config_bucket: str

    def upload_catalog(self, body: bytes) -> None:
        self.s3.put_object(Bucket=self.config_bucket, Key=CATALOG_KEY, Body=body)

    def pointer_versions(self) -> int:
        found = self.s3.list_object_versions(Bucket=self.pricing_bucket, Prefix=pointer_key())
        return len([v for v in found.get("Versions", []) if v["Key"] == pointer_key()])

    def store(self) -> S3SnapshotStore:
        return S3SnapshotStore(self.pricing_bucket, client=self.s3)


@pytest.fixture
def rig(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    full = topology(prefix)
    topo = dataclasses.replace(
        full,
        queues=(),
        tables=(),
        buckets=(full.bucket("pricing"), full.bucket("config")),
        secrets=(),
        functions=(),
    )
    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    env = topo.environment(report.account, cloud.region)
    for key, value in {**cloud.env(), **env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TOLLWAY_PRICING_SOURCES", f"s3://{env['TOLLWAY_BUCKET_CONFIG']}/{CATALOG_KEY}")
    monkeypatch.setenv("TOLLWAY_PRICING_OVERRIDES", f"file://{DATA / 'overrides.yml'}")
    clients = Clients(cloud.endpoint, cloud.region, cloud.env())
    rig = Rig(clients.client("s3"), env["TOLLWAY_BUCKET_PRICING"], env["TOLLWAY_BUCKET_CONFIG"])
    rig.upload_catalog((DATA / "models_dev.json").read_bytes())
    yield rig


def test_a_refresh_publishes_a_snapshot_the_gateway_loader_reads_back(rig: Rig) -> None:
    outcome = handler_module.handler(EVENT, None)

    assert outcome["status"] == "published"
    version = str(outcome["version"])
    head = rig.s3.head_object(Bucket=rig.pricing_bucket, Key=snapshot_key(version))
    assert head["ContentType"] == "application/json"
    loaded = load_current(rig.store())
    assert loaded is not None
    assert loaded.version == version
    cost = price(loaded, "anthropic", "claude-sonnet-4", _Usage(prompt_tokens=1000), account="acct-acme")
    assert isinstance(cost, Cost)
    assert (cost.amount_micro_usd, cost.contract, cost.pricing_version) == (2250, "acme-sonnet", version)


def test_running_again_on_the_same_sources_writes_no_new_pointer(rig: Rig) -> None:
    first = handler_module.handler(EVENT, None)
    second = handler_module.handler(EVENT, None)

    assert (first["status"], second["status"]) == ("published", "unchanged")
    assert second["version"] == first["version"]
    assert rig.pointer_versions() == 1


def test_a_bad_source_leaves_the_pointer_on_the_last_valid_snapshot(rig: Rig) -> None:
    good = handler_module.handler(EVENT, None)
    pointer_before = rig.s3.get_object(Bucket=rig.pricing_bucket, Key=pointer_key())["Body"].read()

    rig.upload_catalog(orjson.dumps({"openai": {"models": {"gpt-4.1": {"cost": {"input": "free", "output": 8}}}}}))
    rejected = handler_module.handler(EVENT, None)

    assert rejected["status"] == "rejected"
    assert rejected["current"] == good["version"]
    assert rejected["issues"] == ['openai.models."gpt-4.1".cost.input: Input should be a valid number']
    assert rig.s3.get_object(Bucket=rig.pricing_bucket, Key=pointer_key())["Body"].read() == pointer_before
    assert rig.pointer_versions() == 1


def test_a_missing_source_object_is_rejected_without_publishing(rig: Rig) -> None:
    rig.s3.delete_object(Bucket=rig.config_bucket, Key=CATALOG_KEY)

    outcome = handler_module.handler(EVENT, None)

    assert (outcome["status"], outcome["current"], outcome["issues"]) == ("rejected", None, ["<root>: does not exist"])
    assert load_current(rig.store()) is None


def test_changed_rates_publish_a_new_version_and_keep_the_old_snapshot(rig: Rig) -> None:
    first = handler_module.handler(EVENT, None)
    rig.upload_catalog(orjson.dumps({"openai": {"models": {"gpt-4.1": {"cost": {"input": 2.5, "output": 10}}}}}))

    second = handler_module.handler(EVENT, None)

    assert second["status"] == "published"
    assert (second["previous"], second["current"]) == (first["version"], second["version"])
    assert rig.store().exists(snapshot_key(str(first["version"])))
    assert rig.pointer_versions() == 2


@dataclass
class _Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_creation_tokens: int = 0
    reasoning_tokens: int = 0
