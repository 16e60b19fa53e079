"""Audit-writer benchmark: the default SQS batch through the real handler into DynamoDB on moto server.

``python -m bench.audit_writer [--batches 5] [--rps 300] [--latencies 250,0] [--dir DIR]``

The event-source mapping hands the writer at most 10 messages, and the shipper packs at most 64
events a message: the default batch is 640 events. They are built by the gateway's own event
builders (through ``tests.support.audit_events``, priced) and laid out as the WAL holds them: a
gateway taking ``--rps`` buffered, one-attempt requests, each answering after a latency (one row
per ``--latencies`` value), appends ``request_admitted`` and ``attempt_started`` at its arrival
and ``attempt_finished`` and ``request_finished`` when it answers, so at 250 ms a request's start
and end are about 300 events apart, in different messages; at 0 they are adjacent. The stream is
cut into messages of 64 events, and each batch of 10 is handed to
:func:`functions.audit_writer.handler.build_handler` with the DynamoDB store on the embedded
local cloud (``tollway.cloud.local``), as the event-source runner does. After a warm-up batch (the
client and its connections), each of ``--batches`` batches is timed; every batch must come back
without a failed message.

Prints a markdown table of the median and the slowest batch's wall time, the writer's events per
second (640 ÷ the median), and the DynamoDB write calls per batch (counted with a botocore event
hook on the store's client). Asserts nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from bench.cli import non_negative_ints, print_table
from tests.support.audit_events import admitted, attempt_done, finished, message, started
from tollway.audit.events import AuditEvent

__all__ = ["batches", "main"]

MESSAGES_PER_BATCH: Final = 10
"""The audit writer's event-source mapping batch size (``tollway.cloud.resources``)."""
EVENTS_PER_MESSAGE: Final = 64
"""The shipper's message bound (``tollway.audit.messages.MAX_EVENTS``)."""
FUNCTION_TIMEOUT_S: Final = 20
_WRITE_CALLS: Final = ("UpdateItem", "PutItem", "BatchWriteItem", "TransactWriteItems")
_TABLE: Final = (
    "request latency | events a batch | write calls a batch | batch wall, median | slowest batch | events/s",
    "{latency_ms:.0f} ms | {events:.0f} | {writes:.0f} | {wall_s:.2f} s | {max_wall_s:.2f} s | {events_per_s:,.0f}",
)


def _request(rid: str, t0_ms: int, latency_ms: int) -> list[AuditEvent]:
    """One buffered one-attempt request's four events, timestamped as the gateway would."""
    answered, took = t0_ms + latency_ms, float(latency_ms)
    return [
        admitted(rid, t0_ms, stream=False, max_attempts=2),
        started(rid, 1, t0_ms + 1, priced=True),
        attempt_done(rid, 1, answered + 1, first_token_ms=took, total_ms=took, connect_ms=0.0),
        finished(rid, answered + 2, total_ms=took + 0.9, priced=True),
    ]


def batches(count: int, *, rps: int, latency_ms: int, t0_ms: int) -> Iterator[list[str]]:
    """``count`` batches of 10 message bodies of 64 events, in the gateway's append order.

    The stream starts as many requests early as are in flight at ``latency_ms``, and skips their
    events that fall before the first batch, so every batch holds steady-state traffic: ends of
    requests that began in the batch before, starts of requests that end in the next one.
    """
    per_batch = MESSAGES_PER_BATCH * EVENTS_PER_MESSAGE
    in_flight = latency_ms * rps // 1000 + 1
    requests = in_flight * 2 + (count * per_batch) // 4 + 1
    run = uuid.uuid4().hex[:8]
    stream: list[AuditEvent] = []
    for n in range(requests):
        stream += _request(f"req-bench-{run}-{n:08d}", t0_ms + n * 1000 // rps, latency_ms)
    stream.sort(key=lambda e: e.ts_ms)  # the WAL's order: append order is time order
    start = in_flight * 2
    for b in range(count):
        chunk = stream[start + b * per_batch : start + (b + 1) * per_batch]
        yield [message(chunk[m : m + EVENTS_PER_MESSAGE]) for m in range(0, len(chunk), EVENTS_PER_MESSAGE)]


def sqs_event(bodies: Sequence[str], queue_arn: str, region: str) -> dict[str, Any]:
    records = []
    for body in bodies:
        records.append(
            {
                "messageId": str(uuid.uuid4()),
                "receiptHandle": uuid.uuid4().hex,
                "body": body,
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": str(int(time.time() * 1000))},
                "messageAttributes": {},
                "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
        )
    return {"Records": records}


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Calls:
    """DynamoDB calls by operation, counted with a botocore ``before-call`` hook."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, model: Any, **_: Any) -> None:
        self.counts[model.name] = self.counts.get(model.name, 0) + 1

    def writes(self) -> int:
        return sum(self.counts.get(op, 0) for op in _WRITE_CALLS)


def measure(
    workdir: Path, *, batch_count: int, rps: int, latencies: Sequence[int], concurrency: int | None
) -> list[dict[str, float]]:
    from functions.audit_writer.handler import build_handler
    from tollway.audit.store import DynamoDBAuditStore, StoreSettings
    from tollway.cloud.bootstrap import bootstrap
    from tollway.cloud.local import start_local_cloud
    from tollway.cloud.resources import topology
    from tollway.cloud.runner import LambdaContext

    rows: list[dict[str, float]] = []
    with ExitStack() as stack:
        cloud = start_local_cloud(0, log_path=workdir / "cloud.log")
        stack.callback(cloud.stop)
        full = topology("bench-writer")
        topo = dataclasses.replace(full, queues=(), tables=(full.table("audit"),), buckets=(), secrets=(), functions=())
        bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
        settings = StoreSettings(table=topo.table("audit").name, endpoint=cloud.endpoint)
        if concurrency is not None:
            settings = settings.model_copy(update={"write_concurrency": concurrency})
        with _environment(cloud.env()):  # the client takes the local cloud's credentials and region
            store = DynamoDBAuditStore(settings)
        calls = _Calls()
        store.client.meta.events.register("before-call.dynamodb", calls)
        handle = build_handler(lambda: store)
        arn = f"arn:aws:sqs:{cloud.region}:000000000000:bench-writer-audit-events"

        def run(bodies: list[str]) -> tuple[float, int]:
            context = LambdaContext(
                aws_request_id=str(uuid.uuid4()),
                function_name="bench-writer-audit-writer",
                memory_limit_in_mb="512",
                invoked_function_arn="arn:aws:lambda:us-east-1:000000000000:function:bench-writer-audit-writer",
                log_group_name="/aws/lambda/bench-writer-audit-writer",
                log_stream_name="bench",
                _deadline=time.monotonic() + FUNCTION_TIMEOUT_S,
            )
            event = sqs_event(bodies, arn, cloud.region)
            before = calls.writes()
            started = time.perf_counter()
            response = handle(event, context)
            wall = time.perf_counter() - started
            if response["batchItemFailures"]:
                raise RuntimeError(f"{len(response['batchItemFailures'])} message(s) of a batch failed")
            return wall, calls.writes() - before

        t0 = int(time.time() * 1000)
        for latency in latencies:
            warm, *timed = batches(batch_count + 1, rps=rps, latency_ms=latency, t0_ms=t0)
            run(warm)
            results = [run(b) for b in timed]
            walls = [w for w, _ in results]
            median = statistics.median(walls)
            rows.append(
                {
                    "latency_ms": float(latency),
                    "events": float(sum(b.count('"eventId"') for b in timed[0])),
                    "writes": statistics.median(n for _, n in results),
                    "wall_s": median,
                    "max_wall_s": max(walls),
                    "events_per_s": MESSAGES_PER_BATCH * EVENTS_PER_MESSAGE / median,
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_writer", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=5, help="timed batches per latency (the median is shown)")
    parser.add_argument("--rps", type=int, default=300, help="the gateway's request rate the stream stands for")
    parser.add_argument("--latencies", type=non_negative_ints, default=[250, 0], help="request latencies, ms")
    parser.add_argument("--concurrency", type=int, default=None, help="item writes in flight (default: the store's)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: the system temp dir)")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.rps < 1:
        parser.error("--batches and --rps must be positive")
    with tempfile.TemporaryDirectory(prefix="tollway-bench-writer-", dir=args.dir, ignore_cleanup_errors=True) as tmp:
        rows = measure(
            Path(tmp), batch_count=args.batches, rps=args.rps, latencies=args.latencies, concurrency=args.concurrency
        )
    setting = f"{MESSAGES_PER_BATCH} messages of {EVENTS_PER_MESSAGE} events a batch, medians of {args.batches}"
    print_table(f"python -m bench.audit_writer --batches {args.batches} --rps {args.rps}", setting, _TABLE, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
