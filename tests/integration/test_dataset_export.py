"""The dataset export on the local cloud: export queue → event-source runner → the real handler →
audit table scan, S3 + KMS content, shards and manifest in the exports bucket, the audit queue.

``topology()`` does not list the export function, its queue or the content KMS key yet, so the test
adds the specs they are meant to have (a trigger on ``exports``; the audit table, the content
bucket and key, the exports bucket and the audit queue granted) to a stage trimmed to what the
function uses. The runner imports the handler from the spec's dotted path, and the handler builds
every backend from the environment, as on Lambda.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from functions.dataset_export import handler as handler_module
from tests.unit.export.corpus import capture
from tollway.audit.messages import decode_message as decode_audit_message
from tollway.audit.store import DynamoDBAuditStore
from tollway.cloud.bootstrap import Clients, bootstrap
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import FunctionSpec, Grant, KeySpec, QueueSpec, QueueTrigger, Topology, topology
from tollway.cloud.runner import EventSourceRunner, QueueMapping
from tollway.content import S3ContentStore
from tollway.export import ExportRequest, S3ExportSink, SqsExportQueue, encode_message, manifest_key
from tollway.export.cli import download, show

pytestmark = pytest.mark.local_cloud

DAY_MS = 86_400_000
VISIBILITY_S = 5
EVERYONE = ("audit", "evaluation", "training")


def export_spec(prefix: str) -> FunctionSpec:
    """The dataset-export FunctionSpec as ``topology()`` should list it (its timeout cut for the test)."""
    return FunctionSpec(
        key="dataset-export",
        name=f"{prefix}-dataset-export",
        handler="functions.dataset_export.handler.handler",
        source_dir="functions/dataset_export",
        memory_mb=1024,
        timeout_s=VISIBILITY_S,
        triggers=(QueueTrigger("exports", batch_size=1, max_batching_window_s=0),),
        grants=(
            Grant("queue", "exports", "consume"),
            Grant("table", "audit", "read"),
            Grant("bucket", "content", "read"),
            Grant("key", "content", "envelope"),
            Grant("bucket", "exports", "read-write"),
            Grant("queue", "audit", "send"),
        ),
    )


def stage(prefix: str) -> Topology:
    full = topology(prefix)
    return dataclasses.replace(
        full,
        queues=(
            dataclasses.replace(full.queue("audit"), visibility_timeout_s=VISIBILITY_S),
            QueueSpec("exports", f"{prefix}-exports", visibility_timeout_s=VISIBILITY_S, max_receive_count=2),
        ),
        tables=(full.table("audit"),),
        buckets=(full.bucket("content"), full.bucket("exports")),
        secrets=(),
        keys=(
            KeySpec(
                "content",
                f"alias/{prefix}-content",
                "Wraps the data keys of captured content",
                environment_variable="TOLLWAY_CONTENT_KMS_KEY_ID",
            ),
        ),
        functions=(export_spec(prefix),),
    )


@dataclass
class Rig:
    topo: Topology
    runner: EventSourceRunner
    mapping: QueueMapping
    sqs: Any
    s3: Any

    def audit_messages(self) -> list[bytes]:
        url = self.sqs.get_queue_url(QueueName=self.topo.queue("audit").name)["QueueUrl"]
        got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        return [m["Body"].encode() for m in got.get("Messages", [])]


@pytest.fixture
def rig(cloud: LocalCloud, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    topo = stage(prefix)
    report = bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    for key, value in {**cloud.env(), **topo.environment(report.account, cloud.region)}.items():
        monkeypatch.setenv(key, value)
    runner = EventSourceRunner(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    (mapping,) = runner.mappings
    assert mapping.handler is handler_module.handler
    clients = Clients(cloud.endpoint, cloud.region, cloud.env())
    yield Rig(topo, runner, mapping, clients.client("sqs"), clients.client("s3"))
    assert runner.stop(timeout_s=5)


def seed(now_ms: int) -> None:
    """Requests in the audit table, their content in S3 under KMS: one per rule the test checks."""

    async def put() -> None:
        store = S3ContentStore.from_env()
        audit = DynamoDBAuditStore.from_env()
        try:
            for request_id, at_ms, kw in (
                ("ok-train", now_ms - 3 * DAY_MS, {"purposes": EVERYONE}),
                ("ok-audit-only", now_ms - 3 * DAY_MS + 1, {"purposes": ("audit",)}),
                ("raw", now_ms - 3 * DAY_MS + 2, {"mode": "encrypted-raw", "purposes": EVERYONE}),
                ("meta", now_ms - 3 * DAY_MS + 3, {"mode": "metadata-only"}),
                ("old-request", now_ms - 100 * DAY_MS, {"purposes": EVERYONE}),  # past the table's 90-day expiry
            ):
                found, _ = await capture(store, request_id, at_ms, **kw)
                audit.apply(found)
        finally:
            await store.aclose()

    asyncio.run(put())


def test_an_export_request_on_the_queue_makes_shards_a_manifest_and_an_audit_event(rig: Rig, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    seed(now_ms)
    request = ExportRequest.parse(
        {
            "purpose": "training",
            "sinceMs": now_ms - 200 * DAY_MS,
            "untilMs": now_ms,
            "requestedBy": "alice",
            "approvedBy": "dpo",
            "transformations": {"pii": "redact"},
            "shardRecords": 1,
        }
    )
    SqsExportQueue.from_env().send(encode_message(request))
    outcome = rig.runner.poll_once(rig.mapping, wait_s=2)
    assert (outcome.error, outcome.retried, outcome.deleted) == (None, (), 1)

    sink = S3ExportSink.from_env()
    manifest = show(sink, request.export_id)
    assert manifest["records"] == 1
    assert manifest["exclusions"] | {"purpose_not_allowed": 0} == {
        "deleted": 0,
        "expired": 1,
        "dropped": 0,
        "no_content": 1,
        "integrity_failed": 0,
        "purpose_not_allowed": 0,
        "missing_object": 0,
    }
    assert manifest["exclusions"]["purpose_not_allowed"] == 2  # audit-only consent, encrypted-raw
    files = download(sink, request.export_id, tmp_path)
    (row,) = [orjson.loads(line) for f in files[:-1] for line in f.read_bytes().splitlines()]
    assert row["requestId"] == "ok-train" and "TWPII1" not in orjson.dumps(row).decode()
    everything = b"".join(sink.get(k) or b"" for k in sink.list(f"exports/{request.export_id}/"))
    assert b"old-request" not in everything  # the expired request appears nowhere, only in the count

    (body,) = rig.audit_messages()
    (event,) = decode_audit_message(body)
    assert (event.kind, event.request_id) == ("export_finished", request.export_id)
    assert event.body["manifest"]["digest"] == manifest["digest"]
    assert event.body["manifest"]["key"] == manifest_key(request.export_id)
    DynamoDBAuditStore.from_env().apply([event])
    view = DynamoDBAuditStore.from_env().get_request(request.export_id)
    assert view is not None and view.request.operation == "dataset.export" and view.request.principal_id == "alice"

    # A redelivered request changes nothing: the same manifest, one version of each object.
    SqsExportQueue.from_env().send(encode_message(request))
    outcome = rig.runner.poll_once(rig.mapping, wait_s=2)
    assert (outcome.error, outcome.deleted) == (None, 1)
    assert show(sink, request.export_id)["digest"] == manifest["digest"]
    versions = rig.s3.list_object_versions(Bucket=sink.bucket, Prefix=f"exports/{request.export_id}/")
    written = [v for v in versions["Versions"] if not v["Key"].endswith("/status.json")]
    assert len(written) == 2  # one shard and the manifest, each written once (the status is overwritten)


def test_the_s3_sink_never_replaces_an_object(rig: Rig) -> None:
    sink = S3ExportSink.from_env()
    assert sink.put_if_absent("exports/x/a", b"one", content_type="text/plain")
    assert not sink.put_if_absent("exports/x/a", b"two", content_type="text/plain")
    assert sink.get("exports/x/a") == b"one"
    head = sink.head("exports/x/a")
    assert head is not None and head.size == 3 and head.sha256 is not None
    assert sink.head("exports/x/b") is None and sink.get("exports/x/b") is None
    assert sink.list("exports/x/") == ["exports/x/a"]
