"""Tollway's bundled mock LLM providers: deterministic, fast and fault-injecting.

One raw ASGI application serves the OpenAI Chat Completions and Anthropic Messages
formats, buffered and streamed. Faults come from a ``/_fault/<k=v,...>/`` path prefix,
``x-mock-<key>`` headers, or defaults posted to ``/_mock/faults``
(see :mod:`tollway.mock.faults`). Run it with ``python -m tollway.mock``, or in-process
with :class:`MockServer` (async) or :class:`MockServerThread` (sync).
"""

from tollway.mock.app import MockApp, create_app
from tollway.mock.faults import FAULT_KEYS, FaultSpec, FaultSpecError
from tollway.mock.server import MockServer, MockServerThread, serve

__all__ = [
    "FAULT_KEYS",
    "FaultSpec",
    "FaultSpecError",
    "MockApp",
    "MockServer",
    "MockServerThread",
    "create_app",
    "serve",
]
