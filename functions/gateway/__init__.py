"""The gateway function."""
