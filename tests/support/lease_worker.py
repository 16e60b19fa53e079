"""One replica of the multi-process lease test: a LocalLedger on DynamoDB, hammering one budget.

Run as ``python -m tests.support.lease_worker --scope S --limit L`` with ``TOLLWAY_TABLE_QUOTA_LEASES``
and the local cloud's AWS variables in the environment. It prints ``ready``, waits for a line on
stdin (so that every replica starts together), runs ``--tasks`` concurrent request loops of at most
``--requests`` each and for at most ``--seconds``, gives its leases back, and prints one JSON line:
what it settled, its overshoot, and what it admitted and was denied.

Each request reserves 1-10 units and settles a little under or over that (up to ``--over``), so
settlements above reservation happen and the overshoot bound is exercised.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter

from tollway.governance.leases import Denial, DenyReason, LeasePolicy, LocalLedger, Window, cost_budget
from tollway.governance.store import DynamoDBLeaseStore, LeaseStoreSettings

POLICY = LeasePolicy(
    fraction=0.05, tick_s=0.02, exhausted_retry_s=0.05, backoff_s=0.02, backoff_max_s=0.2, idle_give_back_s=None
)


async def run(args: argparse.Namespace) -> dict[str, object]:
    store = DynamoDBLeaseStore(LeaseStoreSettings.from_env())
    budget = cost_budget(args.scope, Window.LIFETIME, args.limit)
    rng = random.Random(args.seed)
    denied: Counter[str] = Counter()
    admitted = 0
    deadline = time.monotonic() + args.seconds
    ledger = LocalLedger(store, POLICY)

    async def loop() -> None:
        nonlocal admitted
        exhausted_in_a_row = 0
        for _ in range(args.requests):
            if time.monotonic() >= deadline or exhausted_in_a_row >= 20:
                return
            amount = rng.randint(1, 10)
            result = await ledger.reserve(budget, amount, timeout=2.0)
            if isinstance(result, Denial):
                denied[result.reason.value] += 1
                exhausted_in_a_row += result.reason is DenyReason.BUDGET_EXHAUSTED
                await asyncio.sleep(0.01)
                continue
            exhausted_in_a_row = 0
            admitted += 1
            await asyncio.sleep(rng.random() * 0.002)
            ledger.settle(result, max(0, amount + rng.randint(-3, args.over)))

    try:
        await asyncio.gather(*(loop() for _ in range(args.tasks)))
    finally:
        await ledger.aclose()
        store.close()
    stats = ledger.all_stats()
    return {
        "settled": sum(s.spent for s in stats),
        "granted": sum(s.granted for s in stats),
        "overshoot": sum(s.overshoot for s in stats),
        "unpaid": ledger.unpaid_overshoot,
        "admitted": admitted,
        "denied": dict(denied),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scope", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--over", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("no start signal")
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
