"""The usage-reconciler function: request_finished events from the usage queue into the usage ledger."""
