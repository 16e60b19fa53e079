"""Tollway: an OpenAI-compatible LLM gateway in front of governed model aliases."""

__version__ = "0.1.0"
