"""SQS → usage ledger: each message of the batch is applied alone and fails alone.

Powertools' :class:`BatchProcessor` reports the failed messages in ``batchItemFailures`` (the event
source mapping has ``ReportBatchItemFailures`` on), so SQS redelivers only those and, past the
queue's maxReceiveCount, dead-letters them. Every event of a message is checked against the usage
contract before any is written, so a malformed message writes nothing. Each ``request_finished``
is then one ledger transaction; a redelivered message (or one that failed half-way) is harmless,
because a request already accounted is a duplicate, a no-op. Events of other kinds are skipped.

The ledger comes from a factory, so tests hand :func:`build_handler` a fake; the deployed
:data:`handler` builds the DynamoDB ledger the environment names on its first invocation, never at
import. Logs carry message ids, counts and error types only: never a body or an event field.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from functions.usage_reconciler.message import MalformedMessage, decode_message
from tollway.metering import (
    ApplyResult,
    DynamoDBUsageLedger,
    LedgerSettings,
    MalformedUsageEvent,
    UsageLedger,
    UsageLedgerUnavailable,
    usage_record,
)

__all__ = ["LedgerFactory", "MessageResult", "SqsHandler", "build_handler", "default_ledger", "handler"]

log = logging.getLogger("tollway.usage_reconciler")

LedgerFactory = Callable[[], UsageLedger]
SqsHandler = Callable[[dict[str, Any], Any], PartialItemFailureResponse]

_SAFE_TEXT = (MalformedMessage, MalformedUsageEvent, UsageLedgerUnavailable)
"""Errors whose text names positions, fields, tables and codes only, and so may be logged."""


@dataclass(frozen=True, slots=True)
class MessageResult:
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0


@functools.lru_cache(maxsize=4)
def _ledger_for(settings: LedgerSettings) -> DynamoDBUsageLedger:
    return DynamoDBUsageLedger(settings)


def default_ledger() -> UsageLedger:
    """The DynamoDB ledger the environment names, built on first use and reused while the settings hold."""
    return _ledger_for(LedgerSettings.from_env())


def _apply(ledger: UsageLedger, body: str) -> MessageResult:
    events = decode_message(body)
    for event in events:
        usage_record(event)  # the whole message is checked before anything is written
    counts = Counter(ledger.apply(event) for event in events)
    return MessageResult(counts[ApplyResult.APPLIED], counts[ApplyResult.DUPLICATE], counts[ApplyResult.SKIPPED])


def build_handler(ledger: LedgerFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS message's events to ``ledger()``."""

    def record_handler(record: SQSRecord) -> MessageResult:
        try:
            result = _apply(ledger(), record.body)
        except _SAFE_TEXT as exc:
            log.warning("message %s failed: %s: %s", record.message_id, type(exc).__name__, exc)
            raise
        except Exception as exc:
            log.warning("message %s failed: %s", record.message_id, type(exc).__name__)
            raise
        log.info(
            "message %s: %d request(s) applied, %d duplicate(s), %d event(s) skipped",
            record.message_id,
            result.applied,
            result.duplicates,
            result.skipped,
        )
        return result

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        # One processor per invocation: it holds the batch's state, and the local runner may
        # invoke this handler from several threads at once.
        processor = BatchProcessor(EventType.SQS, raise_on_entire_batch_failure=False)
        response = process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
        log.info("batch of %d message(s): %d failed", len(event.get("Records", [])), len(response["batchItemFailures"]))
        return response

    return handler


handler = build_handler(default_ledger)
