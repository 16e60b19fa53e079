"""The SQS side of the audit message format: one Powertools batch handler for every consumer.

Both queue-triggered workers (the audit writer and the usage reconciler) apply each SQS message
alone, fail it alone, and report failures item by item (``ReportBatchItemFailures``), so SQS
redelivers only those and, past the queue's maxReceiveCount, dead-letters them. They differ only
in what applying a message means and how its result is logged.

Logs carry message ids, counts and error types only: the text of an exception is logged only for
the ``safe`` types, whose messages name positions, fields and codes, never a value from a body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

__all__ = ["SqsHandler", "sqs_batch_handler"]

SqsHandler = Callable[[dict[str, Any], Any], PartialItemFailureResponse]
R = TypeVar("R")


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

    def record_handler(record: SQSRecord) -> R:
        try:
            result = apply(record.body)
        except safe as exc:
            log.warning("message %s failed: %s: %s", record.message_id, type(exc).__name__, exc)
            raise
        except Exception as exc:
            log.warning("message %s failed: %s", record.message_id, type(exc).__name__)
            raise
        log.info("message %s: %s", record.message_id, describe(result))
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
