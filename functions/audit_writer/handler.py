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

from tollway.audit.consumer import SqsHandler, sqs_batch_handler
from tollway.audit.messages import MalformedMessage, decode_message
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


def _describe(result: ApplyResult) -> str:
    return f"{result.applied} event(s) applied, {result.duplicates} duplicate(s), {result.unknown} of unknown kind"


def build_handler(store: StoreFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS message's events to ``store()``."""
    return sqs_batch_handler(lambda body: store().apply(decode_message(body)), _describe, safe=_SAFE_TEXT, log=log)


handler = build_handler(default_store)
