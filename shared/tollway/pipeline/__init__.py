"""One request's path from authentication to the audit trail's last event (work in progress)."""
