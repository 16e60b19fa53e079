"""SQS → audit store: the batch's events are written together, and each message fails alone.

Every message is decoded first; the store then writes the events of all the well-formed ones at
once, merged per item (the events of one item in one batch, whichever messages hold them, are one
conditional write) and several items in flight (:meth:`tollway.audit.store.AuditStore.apply_batch`). Powertools'
:class:`BatchProcessor` reports the failed messages in ``batchItemFailures`` (the event source
mapping has ``ReportBatchItemFailures`` on): a malformed message, and a message whose events
share an item write that failed; the others are deleted. SQS redelivers only those and, past the
queue's maxReceiveCount, moves them to the dead-letter queue. A redelivered message is harmless:
the store is idempotent by ``eventId``. Even a batch in which every message fails is reported item
by item rather than raised, so the invocation never errors on message content.

The store comes from a factory, so tests hand :func:`build_handler` a fake; the deployed
:data:`handler` builds the DynamoDB store the environment names on its first invocation, never
at import.

Logs carry message ids, counts and error types only: never a message body or an event field.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from tollway.audit.events import AuditEvent
from tollway.audit.messages import MalformedMessage, decode_message
from tollway.audit.store import (
    ApplyResult,
    AuditStore,
    AuditStoreError,
    DynamoDBAuditStore,
    MalformedEvent,
    StoreSettings,
)
from tollway.sqs_batch import SqsHandler, sqs_merged_batch_handler

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


def _apply_all(store: StoreFactory, bodies: Sequence[str]) -> list[ApplyResult | Exception]:
    """Each message's result, or why it failed: its own decoding, or the store's writes."""
    decoded: list[list[AuditEvent] | MalformedMessage] = []
    for body in bodies:
        try:
            decoded.append(decode_message(body))
        except MalformedMessage as exc:
            decoded.append(exc)
    good = [d for d in decoded if not isinstance(d, MalformedMessage)]
    results = iter(store().apply_batch(good) if good else [])
    return [d if isinstance(d, MalformedMessage) else next(results) for d in decoded]


def build_handler(store: StoreFactory) -> SqsHandler:
    """A Lambda handler that applies each SQS batch's messages to ``store()``, all at once."""
    return sqs_merged_batch_handler(lambda bodies: _apply_all(store, bodies), _describe, safe=_SAFE_TEXT, log=log)


handler = build_handler(default_store)
