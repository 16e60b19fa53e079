"""``python -m bench.export_throughput [--records N] [--repeat R]``: dataset exports on the local cloud.

Starts the embedded local cloud (moto server), bootstraps the ``bench`` stage, and stores ``N``
captured exchanges the way the gateway does: each a ~1.5 KB chat record put by the S3 content store
(AES-GCM under a KMS data key) and its audit events (admitted, finished, content_stored) applied to
the DynamoDB audit table. Then it runs the export job (``tollway.export.run_export``: the audit
table's Scan, every object's GetObject and decryption, the JSONL shards and the manifest written to
the exports bucket) ``R`` times, each a new export id, and reports records per second, with the
median. The local cloud's own CPU (moto is one Python process) is part of what is measured: it
bounds the rate, as DynamoDB and S3 would not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_PROMPT = "Please summarise the ticket for [TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]. " * 12


async def _populate(records: int, base_ms: int) -> None:
    from tollway.audit import events
    from tollway.audit.store import DynamoDBAuditStore
    from tollway.content import ContentRecord, S3ContentStore

    store = S3ContentStore.from_env()
    audit = DynamoDBAuditStore.from_env()
    digest = "0" * 64
    try:
        batch: list[Any] = []
        for i in range(records):
            rid = f"req_bench{i:019d}"
            at = base_ms + i
            record = ContentRecord(
                request_id=rid,
                tenant="bench",
                principal_id="bench",
                alias="bench-capture-v1",
                operation="chat.completions",
                mode="tokenized-content",
                captured_at_ms=at,
                request={"messages": [{"role": "user", "content": _PROMPT}]},
                response={"content": "Done.", "tool_calls": None, "finish_reason": "stop", "status": 200},
                purposes=("audit", "evaluation"),
            )
            ref = await store.put(record, "standard")
            caller: dict[str, Any] = {"principal_id": "bench", "tenant": "bench", "team": None, "key_id": "k"}
            admitted = events.request_admitted(
                request_id=rid,
                root_digest=digest,
                **caller,
                alias="bench-capture-v1",
                stream=False,
                content_mode="tokenized-content",
                max_attempts=1,
            )
            stored = events.content_stored(request_id=rid, root_digest=digest, ref=ref.to_body())
            batch.append([_at(admitted, at), _at(stored, at + 5)])
            if len(batch) == 25:
                audit.apply_batch(batch)
                batch = []
        if batch:
            audit.apply_batch(batch)
    finally:
        await store.aclose()


def _at(event: Any, ts: int) -> Any:
    import dataclasses

    return dataclasses.replace(event, ts_ms=ts)


async def _export(export_id: str, since_ms: int, until_ms: int) -> tuple[int, float]:
    from tollway.audit.store import DynamoDBAuditStore
    from tollway.content import S3ContentStore
    from tollway.export import ExportRequest, S3ExportSink, run_export

    request = ExportRequest.parse(
        {
            "exportId": export_id,
            "purpose": "evaluation",
            "sinceMs": since_ms,
            "untilMs": until_ms,
            "requestedBy": "bench",
            "approvedBy": "bench",
        }
    )
    store = S3ContentStore.from_env()
    try:
        started = time.perf_counter()
        result = await run_export(request, DynamoDBAuditStore.from_env(), store, S3ExportSink.from_env())
        elapsed = time.perf_counter() - started
    finally:
        await store.aclose()
    return int(result.manifest["records"]), elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.export_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.records <= 100_000 or not 1 <= args.repeat <= 10:
        parser.error("--records must be 1-100000 and --repeat 1-10")

    from tollway.cloud.bootstrap import Clients, bootstrap
    from tollway.cloud.local import start_local_cloud
    from tollway.cloud.resources import topology

    topo = topology("bench")
    with tempfile.TemporaryDirectory() as tmp:
        cloud = start_local_cloud(0, log_path=Path(tmp) / "cloud.log")
        try:
            bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
            account = Clients(cloud.endpoint, cloud.region, cloud.env()).account()
            os.environ.update(cloud.env())
            os.environ.update(topo.environment(account, cloud.region))
            base = 1_798_761_600_000
            started = time.perf_counter()
            asyncio.run(_populate(args.records, base))
            populate_s = time.perf_counter() - started
            runs = []
            for i in range(args.repeat):
                records, seconds = asyncio.run(_export(f"exp-bench-{i}", base, base + args.records + 10))
                runs.append({"records": records, "seconds": round(seconds, 3), "rps": round(records / seconds, 1)})
        finally:
            cloud.stop()
    result = {
        "records": args.records,
        "populate_seconds": round(populate_s, 2),
        "runs": runs,
        "median_records_per_second": statistics.median(r["rps"] for r in runs),
        "python": sys.version.split()[0],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for r in runs:
            print(f"exported {r['records']} records in {r['seconds']} s: {r['rps']} records/s")
        print(f"median {result['median_records_per_second']} records/s ({args.records} records, local cloud)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
