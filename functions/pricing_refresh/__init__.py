"""The pricing-refresh function: configured pricing sources → a new immutable snapshot and its pointer."""
