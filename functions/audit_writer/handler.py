"""SQS → audit store: each message of the batch is applied alone and fails alone.

Powertools' :class:`BatchProcessor` reports the failed messages in ``batchItemFailures``
(the event source mapping has ``ReportBatchItemFailures`` on), so SQS redelivers only those and,
past the queue's maxReceiveCount, moves them to the dead-letter queue. A redelivered message is
harmless: the store is idempotent by ``eventId``. Even a batch in which every message fails is
reported item by item rather than raised, so the invocation never errors on message content.

The store comes from a factory, so tests hand :func:`build_handler` a fake; the deployed
:data:`handler` builds the DynamoDB store the environment names on its first invocation, never
at import.

Logs carry message ids, counts and error types only: never a message body or an event field.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from functions.audit_writer.message import MalformedMessage, decode_message
from tollway.audit.store import (
    ApplyResult,
    AuditStore,
    AuditStoreError,
    DynamoDBAuditStore,
    MalformedEvent,
    StoreSettings,
)

__all__ = ["SqsHandler", "StoreFactory", "build_handler", "default_store", "handler"]

log = logging.getLogger("tollway.audit_writer")

StoreFactory = Callable[[], AuditStore]
SqsHandler = Callable[[dict[str, Any], Any], PartialItemFailureResponse]

_SAFE_TEXT = (MalformedMessage, MalformedEvent, AuditStoreError)
"""Errors whose text names positions, fields and codes only, and so may be logged."""


@functools.lru_cache(maxsize=4)
def _store_for(settings: StoreSettings) -> DynamoDBAuditStore:
    return DynamoDBAuditStore(settings)


def default_store() -> AuditStore:
    """The DynamoDB store the environment names, built on first use and then reused.

    Cached per settings rather than once: the local event-source runner calls handlers inside
    one long-lived process, whose environment may be pointed at another stage's table.
    """
    return _store_for(StoreSettings.from_env())


def build_handler(store: StoreFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS message's events to ``store()``."""

    def record_handler(record: SQSRecord) -> ApplyResult:
        try:
            result = store().apply(decode_message(record.body))
        except _SAFE_TEXT as exc:
            log.warning("message %s failed: %s: %s", record.message_id, type(exc).__name__, exc)
            raise
        except Exception as exc:
            log.warning("message %s failed: %s", record.message_id, type(exc).__name__)
            raise
        log.info(
            "message %s: %d event(s) applied, %d duplicate(s), %d of unknown kind",
            record.message_id,
            result.applied,
            result.duplicates,
            result.unknown,
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


handler = build_handler(default_store)
