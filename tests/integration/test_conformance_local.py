"""The scheduled conformance function on the local cloud: the mock providers → results in the config bucket.

The stage opts into the function (``conformance_schedule``); its ``config`` bucket is bootstrapped
from the topology and the function gets the environment it gets on Lambda, so the deployed
:data:`functions.conformance.handler.handler` writes through ``tollway.aws``'s S3 client to
``s3://<config bucket>/conformance/``, where the publication policy then reads the results back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from functions.conformance import handler as handler_module
from tollway import aws
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import CONFORMANCE_PREFIX, topology
from tollway.cloud.runner import EventSourceRunner
from tollway.config import load_config
from tollway.conformance import check_config
from tollway.mock.server import MockServerThread

pytestmark = pytest.mark.local_cloud

EVENT = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServerThread]:
    with MockServerThread() as server:
        yield server


def _config(url: str, results: str) -> dict[str, Any]:
    def provider(kind: str, base: str, name: str) -> dict[str, Any]:
        creds = [{"id": "k", "secretRef": "env:CONFORMANCE_TEST_KEY"}]
        return {"type": kind, "baseUrl": base, "providerAccountId": name, "quotaGroupId": name, "credentials": creds}

    return {
        "providers": {
            "mock-openai": provider("openai-compatible", f"{url}/v1", "openai"),
            "mock-anthropic": provider("anthropic", url, "anthropic"),
            "broken-anthropic": provider("anthropic", f"{url}/_fault/midstream_error=0", "broken"),
        },
        "conformance": {"requireConformance": True, "results": results},
        "models": [
            {
                "name": "chat",
                "capabilities": ["streaming", "tools"],
                "routes": [
                    {
                        "id": "o",
                        "provider": "mock-openai",
                        "model": "gpt-mock",
                        "providerFormat": "openai-chat-completions",
                    },
                    {
                        "id": "a",
                        "provider": "mock-anthropic",
                        "model": "claude-mock",
                        "providerFormat": "anthropic-messages",
                    },
                    {
                        "id": "b",
                        "provider": "broken-anthropic",
                        "model": "claude-mock",
                        "providerFormat": "anthropic-messages",
                    },
                ],
            }
        ],
    }


@dataclasses.dataclass
class Rig:
    s3: Any
    bucket: str
    config: Path


@pytest.fixture
def rig(
    cloud: LocalCloud, prefix: str, mock: MockServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    full = topology(prefix, conformance_schedule="rate(1 day)")
    topo = dataclasses.replace(full, queues=(), tables=(), buckets=(full.bucket("config"),), secrets=(), keys=())
    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    env = topo.environment(report.account, cloud.region)
    for key, value in {**cloud.env(), **env}.items():
        monkeypatch.setenv(key, value)
    bucket = env["TOLLWAY_BUCKET_CONFIG"]
    config = tmp_path / "llm-router.yml"
    config.write_text(yaml.safe_dump(_config(mock.base_url, f"s3://{bucket}/{CONFORMANCE_PREFIX}")))
    monkeypatch.setenv("TOLLWAY_CONFIG", str(config))
    monkeypatch.setenv("CONFORMANCE_TEST_KEY", "mock-provider-key")
    monkeypatch.delenv("TOLLWAY_CONFORMANCE_RESULTS", raising=False)
    monkeypatch.delenv("TOLLWAY_CONFORMANCE_DEPLOYMENTS", raising=False)
    aws.cache_clear()
    yield Rig(Clients(cloud.endpoint, cloud.region, cloud.env()).client("s3"), bucket, config)
    aws.cache_clear()


def _keys(rig: Rig) -> list[str]:
    found = rig.s3.list_objects_v2(Bucket=rig.bucket, Prefix=CONFORMANCE_PREFIX).get("Contents", [])
    return sorted(o["Key"] for o in found)


def test_a_scheduled_run_writes_each_deployments_result_to_the_config_bucket(rig: Rig) -> None:
    outcome = handler_module.handler(EVENT, None)

    assert outcome["status"] == "failed"  # the broken deployment fails the streamed cases
    assert outcome["location"] == f"s3://{rig.bucket}/conformance"
    failing = {(p["deployment"], p["model"]): p["failing"] for p in outcome["pairs"]}
    assert failing == {
        ("mock-openai", "gpt-mock"): [],
        ("mock-anthropic", "claude-mock"): [],
        ("broken-anthropic", "claude-mock"): ["usage", "streaming", "tools"],
    }
    keys = _keys(rig)
    assert "conformance/mock-openai/gpt-mock.json" in keys
    assert len(keys) == 6  # the latest and the history of each pair
    stored = orjson.loads(
        rig.s3.get_object(Bucket=rig.bucket, Key="conformance/mock-anthropic/claude-mock.json")["Body"].read()
    )
    assert stored["capabilities"]["tools"] == "pass"

    issues = check_config(load_config(rig.config), rig.config.parent)
    assert [i.path for i in issues] == ["models[0].routes[2]"] * 3
    assert "capability 'streaming' (case chat.stream failed:" in issues[1].message


def test_the_event_or_the_environment_chooses_the_deployments(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOLLWAY_CONFORMANCE_DEPLOYMENTS", "mock-anthropic")
    from_env = handler_module.handler(EVENT, None)
    from_event = handler_module.handler({**EVENT, "deployments": ["mock-openai", "unknown"]}, None)

    assert [p["deployment"] for p in from_env["pairs"]] == ["mock-anthropic"]
    assert from_env["status"] == "passed"
    assert [p["deployment"] for p in from_event["pairs"]] == ["mock-openai"]
    assert from_event["errors"] == [{"deployment": "unknown", "error": "not a provider with chat routes"}]
    assert from_event["status"] == "failed"


def test_the_local_runner_schedules_the_function_of_a_stage_that_opts_in(cloud: LocalCloud, rig: Rig) -> None:
    spec = topology("local", conformance_schedule="rate(1 day)").function("conformance")
    runner = EventSourceRunner(
        topology("local"), endpoint=cloud.endpoint, region=cloud.region, env=cloud.env(), load_functions=False
    )
    binding = runner.add_function(spec)

    (rule,) = binding.schedules
    assert rule.trigger.expression == "rate(1 day)"
    assert rule.handler is not None
