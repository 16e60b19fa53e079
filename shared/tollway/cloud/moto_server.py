"""moto server with DynamoDB's item writes made atomic: ``python -m tollway.cloud.moto_server``.

DynamoDB applies a conditional write atomically per item: the quota-lease store's take is
``ADD granted :n`` if ``granted <= limit - n``, and two concurrent takes can never both pass on
the last units. moto's server is threaded and checks the condition, then writes, without a lock,
so under concurrent load two takes can both pass and the counter overshoots its limit (seen as
3011 of 3000 in ``tests/integration/test_leases_dynamodb.py``). The embedded local cloud runs moto
through this module, which serializes DynamoDB's writes with one lock, so the emulator keeps the
guarantee the lease store, the usage ledger and the audit store rely on.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["main"]

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


def main(argv: list[str] | None = None) -> None:
    _serialize_dynamodb_writes()
    from moto.server import main as moto_main

    moto_main(argv)


if __name__ == "__main__":
    main()
