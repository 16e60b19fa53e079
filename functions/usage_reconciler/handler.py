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

from tollway.audit.messages import MalformedMessage, decode_message
from tollway.metering import (
    ApplyResult,
    DynamoDBUsageLedger,
    LedgerSettings,
    MalformedUsageEvent,
    UsageLedger,
    UsageLedgerUnavailable,
    usage_record,
)
from tollway.sqs_batch import SqsHandler, sqs_batch_handler

__all__ = ["LedgerFactory", "MessageResult", "SqsHandler", "build_handler", "default_ledger", "handler"]

log = logging.getLogger("tollway.usage_reconciler")

LedgerFactory = Callable[[], UsageLedger]

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


def _describe(result: MessageResult) -> str:
    return f"{result.applied} request(s) applied, {result.duplicates} duplicate(s), {result.skipped} event(s) skipped"


def build_handler(ledger: LedgerFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS message's events to ``ledger()``."""
    return sqs_batch_handler(lambda body: _apply(ledger(), body), _describe, safe=_SAFE_TEXT, log=log)


handler = build_handler(default_ledger)
