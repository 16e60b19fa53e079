"""The audit-writer function: audit event batches from the audit queue into the audit store."""
