"""moto server with DynamoDB's item writes made atomic: ``python -m tollway.cloud.moto_server``.

DynamoDB applies a conditional write atomically per item: the quota-lease store's take is
``ADD granted :n`` if ``granted <= limit - n``, and two concurrent takes can never both pass on
the last units. moto's server is threaded and checks the condition, then writes, without a lock,
so under concurrent load two takes can both pass and the counter overshoots its limit (seen as
3011 of 3000 in ``tests/integration/test_leases_dynamodb.py``). The embedded local cloud runs moto
through this module, which serializes DynamoDB's writes with one lock, so the emulator keeps the
guarantee the lease store, the usage ledger and the audit store rely on.

It also keeps SQS's send cost independent of the queue's backlog. moto's ``send_message`` reads
one static queue attribute (``ContentBasedDeduplication``) through ``Queue.attributes``, which
also counts the visible, delayed and in-flight messages by walking every message in the queue,
three times, with a clock read per message. With no consumer running (a benchmark that only
ships), each send got slower as the queue grew: 29 ms of emulator CPU per 10-message batch at a
backlog of a few hundred messages, most of the shipper's measured cost. During a send the three
counts are not computed (the send path never reads them); ``GetQueueAttributes`` still counts.

It keeps a KMS key created by CloudFormation usable. moto stores such a key's ``KeyPolicy`` as
the template's object rather than as JSON text, and every later call that checks the policy
(``DescribeKey``, ``GenerateDataKey``, ``Decrypt``) then fails with a 500; the CDK stack's PII
vault key, deployed with ``python -m infra.deploy --target local``, was unusable. The policy is
stored as JSON text, as ``CreateKey`` stores it.

And it lists moto's service packages once. To route a request, moto's dispatcher asks whether the
host names a service by listing moto's package directory and ``stat``-ing each of its ~150
entries, on every request: 27 % of the emulator's CPU while the audit shipper sent to SQS at
500 RPS (py-spy, docs/benchmarks.md). The installed packages do not change while it runs.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main", "patch_moto"]

_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items")


def _serialize_dynamodb_writes() -> None:
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()

    def locked(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return method(*args, **kwargs)

        return call

    for name in _WRITES:
        setattr(DynamoDBBackend, name, locked(getattr(DynamoDBBackend, name)))


_APPROXIMATE_COUNTS = (
    "approximate_number_of_messages",
    "approximate_number_of_messages_delayed",
    "approximate_number_of_messages_not_visible",
)


def _sqs_send_without_counting() -> None:
    from moto.sqs.models import Queue, SQSBackend

    sending = threading.local()

    def uncounted(count: property) -> property:
        getter = count.fget
        assert getter is not None

        def get(queue: Any) -> int:
            return 0 if getattr(sending, "active", False) else int(getter(queue))

        return property(functools.wraps(getter)(get))

    def flagged(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(sending, "active", False)
            sending.active = True
            try:
                return method(*args, **kwargs)
            finally:
                sending.active = outer

        return call

    for name in _APPROXIMATE_COUNTS:
        setattr(Queue, name, uncounted(getattr(Queue, name)))
    for name in ("send_message", "send_message_batch"):
        setattr(SQSBackend, name, flagged(getattr(SQSBackend, name)))


def _kms_cloudformation_policy_as_text() -> None:
    from moto.kms.models import Key

    key_class: Any = Key
    create = key_class.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(
        cls: type[Any], name: str, template: Any, account: str, region: str, /, **kw: Any
    ) -> Any:
        properties = dict(template.get("Properties") or {})
        if isinstance(properties.get("KeyPolicy"), dict):
            properties["KeyPolicy"] = json.dumps(properties["KeyPolicy"])
            template = {**template, "Properties": properties}
        return create(cls, name, template, account, region, **kw)

    key_class.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)


def _list_services_once() -> None:
    from moto import backends

    names = tuple(backends.list_of_moto_modules())

    def list_of_moto_modules() -> tuple[str, ...]:
        return names

    backends.list_of_moto_modules = list_of_moto_modules


def patch_moto() -> None:
    """Apply the fixes to the moto imported in this process (the server's, or a test's)."""
    _serialize_dynamodb_writes()
    _sqs_send_without_counting()
    _kms_cloudformation_policy_as_text()
    _list_services_once()


_PARENT_CHECK_S = 0.5


def _exit_with(parent: int) -> None:
    """End this process once ``parent`` is gone: the local cloud runs it in a process group of its
    own (so a terminal's Ctrl-C reaches only the parent), and a killed parent must not leave it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_S)
        os._exit(0)  # the emulator's state is in memory: nothing to flush

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """moto server's own command line, after an optional ``--parent PID`` (exit when it is gone)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--parent"] and len(args) > 1:
        _exit_with(int(args[1]))
        args = args[2:]
    patch_moto()
    from moto.server import main as moto_main

    moto_main(args)


if __name__ == "__main__":
    main()
