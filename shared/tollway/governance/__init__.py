"""Principals, keys and (later) limits, budgets and leases."""

from tollway.governance.principals import Principal, authenticate, key_digest

__all__ = ["Principal", "authenticate", "key_digest"]
