"""The stages Tollway ships: governance (budgets, quotas, concurrency) and the audit recorder."""
