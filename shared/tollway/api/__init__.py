"""Tollway."""
