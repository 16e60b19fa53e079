"""Reversible PII tokenization: detectors, authenticated placeholders, recovery and the vault."""
