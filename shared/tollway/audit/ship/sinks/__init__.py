"""Where the shipper sends audit messages: an SQS queue (the default) or a Kafka topic.

A *message* is one UTF-8 JSON object that the audit writer consumes::

    {"v": 1, "events": [<event JSON object>, ...]}     # 1-64 events, at most 200 KiB

The shipper packs the messages (:mod:`tollway.audit.ship.shipper`); a sink only delivers them. Delivery
is all-or-nothing from the shipper's point of view: :meth:`AuditSink.send` returns once every
message is accepted by the queue, or raises :class:`SinkUnavailable` and the shipper acknowledges
nothing, so the records stay in the WAL and are sent again. A failed call may still have
delivered some messages; the audit writer is idempotent by ``eventId``, so a resend creates no
duplicate row.

The cloud clients (boto3, kafka-python) block and are imported inside the sinks, never at module
level: this module is on the Lambda extension's import path, which has only the standard library,
the core layer and the runtime's boto3.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Final, Protocol

from tollway.exceptions import TollwayError

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_EVENTS",
    "MESSAGE_HEAD",
    "MESSAGE_VERSION",
    "AuditSink",
    "SinkUnavailable",
    "UsageFanOut",
    "usage_messages",
]

log = logging.getLogger("tollway.audit")

MESSAGE_VERSION: Final = 1
MESSAGE_HEAD: Final = b'{"v":%d,"events":[' % MESSAGE_VERSION
"""How the shipper begins every message: its events follow, comma-separated, then ``]}``."""
MAX_MESSAGE_EVENTS: Final = 64
MAX_MESSAGE_BYTES: Final = 200 * 1024
"""Below SQS's historical 256 KiB message limit, which queues created before 2025 still default to."""

SQS_BATCH_ENTRIES: Final = 10
SQS_BATCH_BYTES: Final = 256 * 1024
"""SendMessageBatch's own limits: 10 entries, and a payload no larger than the smallest queue limit."""


class SinkUnavailable(TollwayError):
    """The queue did not accept a batch; nothing of it may be acknowledged in the WAL."""


class AuditSink(Protocol):
    def send(self, batch: list[bytes]) -> None:
        """Deliver every message of ``batch`` (each a message body), or raise :class:`SinkUnavailable`."""
        ...


def usage_messages(batch: Sequence[bytes]) -> list[bytes]:
    """The ``request_finished`` events of ``batch``, in messages of their own (the usage queue's share).

    A message that is not a JSON envelope was already refused by the shipper's packing; it is skipped.
    """
    out: list[bytes] = []
    for body in batch:
        try:
            events = json.loads(body)["events"]
        except (ValueError, LookupError, TypeError):
            continue
        finished = [e for e in events if isinstance(e, dict) and e.get("kind") == "request_finished"]
        if finished:
            out.append(json.dumps({"v": MESSAGE_VERSION, "events": finished}, separators=(",", ":")).encode())
    return out


class UsageFanOut:
    """The audit sink, then the usage queue with each batch's ``request_finished`` events.

    A batch is acknowledged in the WAL only when both accepted it: if the usage queue fails, the
    whole batch is sent again, to both. Duplicates are harmless (the audit store is idempotent by
    ``eventId``, the usage ledger by request id); a lost usage event would not be.
    """

    def __init__(self, audit: AuditSink, usage: AuditSink) -> None:
        self.audit = audit
        self.usage = usage

    def __repr__(self) -> str:
        return f"UsageFanOut({self.audit!r}, usage={self.usage!r})"

    def send(self, batch: list[bytes]) -> None:
        self.send_split(batch, usage_messages(batch))

    def send_split(self, batch: list[bytes], usage: list[bytes]) -> None:
        """``batch`` to the audit sink, then ``usage`` (its ``request_finished`` events, already
        packed by the shipper, which parsed every event anyway) to the usage queue."""
        self.audit.send(batch)
        if usage:
            self.usage.send(usage)


from tollway.audit.ship.sinks.kafka import KafkaAuditConsumer, KafkaSink  # noqa: E402
from tollway.audit.ship.sinks.sqs import SqsSink  # noqa: E402

__all__ += ["KafkaAuditConsumer", "KafkaSink", "SqsSink"]
