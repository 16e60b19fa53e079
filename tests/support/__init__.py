"""Test support code (not tests)."""
