"""The topology's content-capture and dataset-export specs, and what the local cloud makes of them.

The CDK side is proven in ``tests/infra`` (``test_content_export.py``); the bootstrap side on a
real moto server in ``tests/integration`` (``test_local_bootstrap.py``,
``test_cdk_matches_bootstrap.py``). Here: the specs themselves, the shape the bootstrap renders
them in, the dataset export's settings read from the environment the topology gives every
function, and the runner's mapping for it (against a stand-in SQS).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest

from functions.dataset_export import handler as export_handler
from functions.dataset_export.settings import ExportSettings
from tollway.cloud import runner as runner_module
from tollway.cloud.bootstrap import expected_state
from tollway.cloud.resources import (
    CONTENT_RETENTION_DAYS,
    BucketSpec,
    Grant,
    QueueTrigger,
    expiry_rule_id,
    topology,
)
from tollway.cloud.runner import EventSourceRunner, RunnerError
from tollway.config.schema import ContentConfig

ACCOUNT = "123456789012"
REGION = "eu-west-1"


def test_the_retention_classes_are_the_config_defaults() -> None:
    defaults = {name: c.days for name, c in ContentConfig().retentionClasses.items()}
    assert dict(CONTENT_RETENTION_DAYS) == defaults == {"standard": 30, "restricted": 7}


def test_the_content_bucket_expires_each_class_under_its_prefix_with_the_longest_as_backstop() -> None:
    content = topology().bucket("content")
    assert content.prefix_expiry == (("content/standard/", 30), ("content/restricted/", 7))
    assert content.expire_after_days == 30 == max(days for _, days in CONTENT_RETENTION_DAYS)
    assert not content.versioned and content.noncurrent_expire_after_days is None


def test_the_exports_bucket_keeps_exports_a_year_and_old_versions_a_month() -> None:
    exports = topology().bucket("exports")
    assert (exports.versioned, exports.expire_after_days, exports.noncurrent_expire_after_days) == (True, 365, 30)


def test_the_content_key_and_the_export_queue_are_in_the_topology() -> None:
    topo = topology("stage")
    key = topo.kms_key("content")
    assert (key.alias, key.environment_variable) == ("alias/stage-content", "TOLLWAY_CONTENT_KMS_KEY_ID")
    assert key.rotation
    queue = topo.queue("exports")
    assert (queue.name, queue.dlq_name) == ("stage-export-requests", "stage-export-requests-dlq")
    assert queue.visibility_timeout_s == 5400


def test_the_dataset_export_consumes_the_export_queue_and_deletes_nothing() -> None:
    topo = topology("stage")
    spec = topo.function("dataset-export")
    assert (spec.name, spec.handler, spec.source_dir) == (
        "stage-dataset-export",
        "functions.dataset_export.handler.handler",
        "functions/dataset_export",
    )
    assert (spec.timeout_s, spec.memory_mb) == (900, 1024)
    assert spec.triggers == (QueueTrigger("exports", batch_size=1, max_batching_window_s=0),)
    assert set(spec.grants) == {
        Grant("queue", "exports", "consume"),
        Grant("table", "audit", "read"),
        Grant("bucket", "content", "read"),
        Grant("key", "content", "decrypt"),
        Grant("bucket", "exports", "read"),
        Grant("bucket", "exports", "write"),
        Grant("queue", "audit", "send"),
    }
    assert topo.queue("exports").visibility_timeout_s >= 6 * spec.timeout_s


def test_the_gateway_only_puts_content_and_seals_with_the_content_key() -> None:
    grants = topology().gateway.grants
    on_content = {g for g in grants if g.key == "content" or g.key == "exports"}
    assert on_content == {Grant("bucket", "content", "write"), Grant("key", "content", "encrypt")}


def test_the_roles_and_their_grants() -> None:
    topo = topology("stage")
    assert {r.key: (r.name, set(r.grants)) for r in topo.roles} == {
        "auditor": ("stage-auditor", {Grant("table", "audit", "read"), Grant("bucket", "exports", "read")}),
        "content-deleter": (
            "stage-content-deleter",
            {
                Grant("bucket", "content", "delete"),
                Grant("bucket", "content", "read"),
                Grant("table", "audit", "read"),
                Grant("queue", "audit", "send"),
            },
        ),
        "export-requester": (
            "stage-export-requester",
            {Grant("queue", "exports", "send"), Grant("bucket", "exports", "read")},
        ),
    }
    assert topo.role("auditor").description


def test_every_grant_names_a_resource_of_the_topology() -> None:
    topo = topology()
    lookup = {"queue": topo.queue, "table": topo.table, "bucket": topo.bucket, "key": topo.kms_key}
    grants = [
        *topo.gateway.grants,
        *(g for f in topo.functions for g in f.grants),
        *(g for r in topo.roles for g in r.grants),
    ]
    for grant in grants:
        if grant.kind == "secret":
            topo.secret(grant.key)
        elif grant.kind == "bedrock":  # the one grant on what the stack does not create: models
            assert (grant.key, grant.access) == ("models", "invoke")
        else:
            lookup[grant.kind](grant.key)


def test_the_dataset_export_settings_read_what_the_topology_gives_it() -> None:
    topo = topology("stage")
    spec = topo.function("dataset-export")
    env = {**topo.environment(ACCOUNT, REGION), **dict(spec.environment), "AWS_REGION": REGION}
    settings = ExportSettings.from_env(env)
    assert settings.sink.bucket == topo.bucket("exports").name(ACCOUNT, REGION)
    assert settings.content.bucket == topo.bucket("content").name(ACCOUNT, REGION)
    assert settings.content.kms_key_id == topo.kms_key("content").alias
    assert settings.audit_store.table == topo.table("audit").name
    assert settings.audit_queue == topo.queue("audit").name
    assert dict(settings.retention_days) == dict(CONTENT_RETENTION_DAYS)


def test_the_bootstrap_renders_lifecycle_rules_by_prefix_and_creates_no_roles() -> None:
    topo = topology("stage")
    state = expected_state(topo, account=ACCOUNT, region=REGION)
    assert set(state) == {"queues", "tables", "buckets", "lifecycle", "keys", "secrets"}, "no roles: moto skips IAM"
    assert state["lifecycle"]["content"] == [
        {"prefix": "", "expire_after_days": 30, "noncurrent_expire_after_days": None},
        {"prefix": "content/restricted/", "expire_after_days": 7, "noncurrent_expire_after_days": None},
        {"prefix": "content/standard/", "expire_after_days": 30, "noncurrent_expire_after_days": None},
    ]
    assert state["lifecycle"]["exports"] == [
        {"prefix": "", "expire_after_days": 365, "noncurrent_expire_after_days": 30}
    ]
    assert state["lifecycle"]["config"] == []
    assert state["buckets"]["content"]["expire_after_days"] == 30
    assert state["queues"]["exports"]["visibility_timeout_s"] == 5400
    assert state["keys"]["content"]["alias"] == "alias/stage-content"


def test_lifecycle_rule_ids_name_the_prefix() -> None:
    assert expiry_rule_id("") == "expire"
    assert expiry_rule_id("content/standard/") == "expire-content-standard"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prefix_expiry": (("content/a/", 40),), "expire_after_days": 30}, "whole bucket's 30 days"),
        ({"prefix_expiry": (("content/a", 7),)}, "end with '/'"),
        ({"prefix_expiry": (("a/", 7), ("a/", 8))}, "distinct"),
        ({"expire_after_days": 0}, "at least 1"),
        ({"noncurrent_expire_after_days": 30}, "versioned"),
    ],
)
def test_a_bucket_spec_whose_rules_could_not_act_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(BucketSpec("b", "p"), **changes)


class _FakeSqs:
    """The two calls the runner makes per mapping when it registers it."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        assert QueueName in self.names, QueueName
        return {"QueueUrl": f"http://sqs.local/{ACCOUNT}/{QueueName}"}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        name = QueueUrl.rsplit("/", 1)[-1]
        return {"Attributes": {"QueueArn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"}}


class _FakeClients:
    names: ClassVar[set[str]] = set()

    def __init__(self, endpoint: str, region: str, env: Any = None) -> None:
        self.endpoint = endpoint
        self._sqs = _FakeSqs(self.names)

    def client(self, service: str) -> Any:
        assert service == "sqs"
        return self._sqs

    def account(self) -> str:
        return ACCOUNT


@pytest.fixture
def fake_clients(monkeypatch: pytest.MonkeyPatch) -> type[_FakeClients]:
    monkeypatch.setattr(runner_module, "Clients", _FakeClients)
    return _FakeClients


def test_the_runner_maps_the_export_queue_to_the_dataset_export_handler(fake_clients: type[_FakeClients]) -> None:
    topo = topology("stage")
    fake_clients.names = {q.name for q in topo.queues}
    runner = EventSourceRunner(topo, endpoint="http://127.0.0.1:1", region=REGION)
    by_function = {m.function.key: m for m in runner.mappings}
    assert set(by_function) == {f.key for f in topo.functions if f.triggers}
    mapping = by_function["dataset-export"]
    assert mapping.handler is export_handler.handler
    assert mapping.queue == topo.queue("exports")
    assert (mapping.trigger.batch_size, mapping.trigger.max_batching_window_s) == (1, 0)
    assert mapping.queue_arn == f"arn:aws:sqs:{REGION}:{ACCOUNT}:stage-export-requests"


def test_the_runner_refuses_an_export_timeout_beyond_the_queue_visibility(fake_clients: type[_FakeClients]) -> None:
    topo = topology("stage")
    fake_clients.names = {q.name for q in topo.queues}
    runner = EventSourceRunner(topo, endpoint="http://127.0.0.1:1", region=REGION, load_functions=False)
    too_long = dataclasses.replace(topo.function("dataset-export"), timeout_s=5401)
    with pytest.raises(RunnerError, match="visibility timeout 5400 s is less than the function timeout 5401 s"):
        runner.add_function(too_long, handler=lambda event, context: None)
