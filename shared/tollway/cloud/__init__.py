"""Cloud topology and the embedded local cloud (resource spec, bootstrap, event-source runner)."""
