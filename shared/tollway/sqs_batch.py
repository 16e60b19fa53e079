"""The SQS side of the audit message format: one Powertools batch handler for every consumer.

Both queue-triggered workers (the audit writer and the usage reconciler) fail each SQS message
alone and report failures item by item (``ReportBatchItemFailures``), so SQS redelivers only
those and, past the queue's maxReceiveCount, dead-letters them. They differ in what applying a
message means and how its result is logged, and in one more way: the usage reconciler applies
each message on its own (:func:`sqs_batch_handler`), while the audit writer applies the whole
batch at once, to merge the writes of its messages' events, and gets back each message's result
or the error that failed it (:func:`sqs_merged_batch_handler`). Powertools' ``BatchProcessor``
then reports those outcomes exactly as it reports a per-message handler's.

Logs carry message ids, counts and error types only: the text of an exception is logged only for
the ``safe`` types, whose messages name positions, fields and codes, never a value from a body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

__all__ = ["SqsHandler", "sqs_batch_handler", "sqs_merged_batch_handler"]

SqsHandler = Callable[[dict[str, Any], Any], PartialItemFailureResponse]
R = TypeVar("R")


def _record_handler(
    apply: Callable[[SQSRecord], R],
    describe: Callable[[R], str],
    safe: tuple[type[Exception], ...],
    log: logging.Logger,
) -> Callable[[SQSRecord], R]:
    def record_handler(record: SQSRecord) -> R:
        try:
            result = apply(record)
        except safe as exc:
            log.warning("message %s failed: %s: %s", record.message_id, type(exc).__name__, exc)
            raise
        except Exception as exc:
            log.warning("message %s failed: %s", record.message_id, type(exc).__name__)
            raise
        log.info("message %s: %s", record.message_id, describe(result))
        return result

    return record_handler


def _process(
    event: dict[str, Any], context: Any, record_handler: Callable[[SQSRecord], Any], log: logging.Logger
) -> PartialItemFailureResponse:
    # One processor per invocation: it holds the batch's state, and the local runner may
    # invoke a handler from several threads at once.
    processor = BatchProcessor(EventType.SQS, raise_on_entire_batch_failure=False)
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    log.info("batch of %d message(s): %d failed", len(event.get("Records", [])), len(response["batchItemFailures"]))
    return response


def sqs_batch_handler(
    apply: Callable[[str], R],
    describe: Callable[[R], str],
    *,
    safe: tuple[type[Exception], ...],
    log: logging.Logger,
) -> SqsHandler:
    """A Lambda handler that calls ``apply(body)`` for each SQS message of a batch.

    ``describe(result)`` is the log line's tail for an applied message.
    """
    record_handler = _record_handler(lambda record: apply(record.body), describe, safe, log)

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        return _process(event, context, record_handler, log)

    return handler


def sqs_merged_batch_handler(
    apply_all: Callable[[Sequence[str]], Sequence[R | Exception]],
    describe: Callable[[R], str],
    *,
    safe: tuple[type[Exception], ...],
    log: logging.Logger,
) -> SqsHandler:
    """A Lambda handler that calls ``apply_all(bodies)`` once per batch, with every message's body in order.

    ``apply_all`` returns, per message, its result or the exception that failed it (it may also
    raise: then every message fails with that exception). Each message is then reported, and
    logged, as :func:`sqs_batch_handler` reports one.
    """

    def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
        records = event.get("Records", [])
        ids = [str(r.get("messageId", "")) for r in records]
        outcomes: Sequence[R | Exception]
        try:
            outcomes = apply_all([str(r.get("body", "")) for r in records])
            if len(outcomes) != len(records):
                raise RuntimeError(f"{len(outcomes)} outcome(s) for {len(records)} message(s)")
        except Exception as exc:
            outcomes = [exc] * len(records)
        by_id = dict(zip(ids, outcomes, strict=True))

        def outcome(record: SQSRecord) -> R:
            found = by_id[record.message_id]
            if isinstance(found, Exception):
                raise found
            return found

        return _process(event, context, _record_handler(outcome, describe, safe, log), log)

    return handler
