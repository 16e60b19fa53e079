"""One background fetch at a time: the refresh of a credential that a synchronous hook on the event
loop must not wait for.

Vertex AI's access token and botocore's temporary AWS credentials are both fetched by a blocking
HTTPS round trip, and both are read by a transport's synchronous signing hook. Each keeps what it
fetched and starts its refresh through a :class:`SingleFlight`: a caller that asks while a fetch is
in flight joins it (one round trip however many requests ask), the fetch runs in a daemon thread,
and when the last one failed is kept, so callers can wait out a retry interval instead of starting
a fetch per request against an endpoint that is down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["SingleFlight"]

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Runs ``fetch`` in a thread named ``name``, one call at a time. ``clock`` (seconds) stamps
    failures; ``fetch`` stores its own result where its owner reads it, before it returns."""

    __slots__ = ("_clock", "_fetch", "_inflight", "_lock", "_name", "failed_at")

    def __init__(self, fetch: Callable[[], T], *, name: str, clock: Callable[[], float]) -> None:
        self._fetch = fetch
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight: Future[T] | None = None
        self.failed_at: float | None = None
        """When the last fetch failed, on ``clock``; ``None`` once one succeeds."""

    @property
    def inflight(self) -> Future[T] | None:
        """The fetch in flight, if any."""
        return self._inflight

    def failed_within(self, seconds: float) -> bool:
        """Whether the last fetch failed less than ``seconds`` ago."""
        failed_at = self.failed_at
        return failed_at is not None and self._clock() - failed_at < seconds

    def start_unless_failed_within(self, seconds: float) -> Future[T] | None:
        """The fetch in flight, or a new one; ``None`` when none is in flight and the last one
        failed less than ``seconds`` ago (a caller's retry interval)."""
        if self._inflight is None and self.failed_within(seconds):
            return None
        return self.start()

    def start(self) -> Future[T]:
        """The fetch in flight, or a new one in a thread."""
        with self._lock:
            future = self._inflight
            if future is not None:
                return future
            future = self._inflight = Future()
        threading.Thread(target=self._run, args=(future,), name=self._name, daemon=True).start()
        return future

    def _run(self, future: Future[T]) -> None:
        try:
            value = self._fetch()
        except BaseException as exc:
            self.failed_at = self._clock()
            with self._lock:
                self._inflight = None
            future.set_exception(exc)
            return
        self.failed_at = None
        with self._lock:
            self._inflight = None
        future.set_result(value)
