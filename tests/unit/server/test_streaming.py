"""SseResponse's bounds: write progress, lifetime and disconnect, driven through a scripted ASGI peer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from tollway.server.streaming import SseResponse


class Peer:
    """The server side of one response: records what was sent, and can stall or disconnect."""

    def __init__(
        self,
        *,
        stall_after: int | None = None,
        disconnect_after_s: float | None = None,
        drain_bytes_per_s: float | None = None,
    ) -> None:
        self.sent: list[dict[str, Any]] = []
        self._drain = drain_bytes_per_s
        self._stall_after = stall_after
        self._disconnect_after_s = disconnect_after_s
        self._never = asyncio.Event()

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]

    async def send(self, message: dict[str, Any]) -> None:
        bodies = sum(1 for m in self.sent if m["type"] == "http.response.body")
        if message["type"] == "http.response.body" and self._stall_after is not None and bodies >= self._stall_after:
            await self._never.wait()  # a reader that stopped reading: the socket stays paused
        if message["type"] == "http.response.body" and self._drain:
            await asyncio.sleep(len(message["body"]) / self._drain)  # a reader taking bytes slowly
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        if self._disconnect_after_s is None:
            await self._never.wait()
        await asyncio.sleep(self._disconnect_after_s or 0)
        return {"type": "http.disconnect"}


class Session:
    """A frame source that records how it ended, as the chat handler's stream session does."""

    def __init__(self, count: int, gap_s: float) -> None:
        self.count, self.gap_s = count, gap_s
        self.closed = 0
        self.ended_by: str | None = None

    async def frames(self) -> AsyncGenerator[bytes, None]:
        try:
            for i in range(self.count):
                if i:
                    await asyncio.sleep(self.gap_s)
                yield f"data: {i}\n\n".encode()
            self.ended_by = "done"
        except asyncio.CancelledError:
            self.ended_by = "cancelled"
            raise
        except GeneratorExit:
            self.ended_by = "closed"
            raise

    async def close(self) -> None:
        self.closed += 1


def response(
    session: Session,
    *,
    write_timeout_s: float = 5.0,
    lifetime_s: float = 5.0,
    min_drain: float = 0.0,
    drain_grace_s: float = 0.2,
) -> SseResponse:
    return SseResponse(
        session.frames(),
        on_close=session.close,
        headers={"x-extra": "1"},
        write_timeout_s=write_timeout_s,
        lifetime_s=lifetime_s,
        lifetime_frame=b"data: lifetime\n\n",
        min_drain_bytes_per_s=min_drain,
        drain_grace_s=drain_grace_s,
    )


async def test_every_frame_then_a_final_empty_body() -> None:
    session, peer = Session(3, 0), Peer()
    await asyncio.wait_for(response(session)({}, peer.receive, peer.send), 5)
    assert peer.sent[0]["type"] == "http.response.start"
    assert (b"x-extra", b"1") in peer.sent[0]["headers"]
    assert peer.bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert peer.sent[-1]["more_body"] is False
    assert (session.ended_by, session.closed) == ("done", 1)


async def test_a_stalled_reader_is_cut_off_after_the_write_deadline() -> None:
    session, peer = Session(50, 0.001), Peer(stall_after=2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(response(session, write_timeout_s=0.2)({}, peer.receive, peer.send), 5)
    elapsed = loop.time() - started
    assert 0.2 <= elapsed < 2.0
    assert peer.bodies == [b"data: 0\n\n", b"data: 1\n\n"]  # nothing more, not even the final frame
    assert session.closed == 1
    assert session.ended_by in {"cancelled", "closed"}


async def test_a_slow_but_progressing_stream_is_not_cut_off() -> None:
    # The gaps between frames add up to three write deadlines; no single send waits that long.
    session, peer = Session(7, 0.05), Peer()
    await asyncio.wait_for(response(session, write_timeout_s=0.1)({}, peer.receive, peer.send), 5)
    assert len(peer.bodies) == 8
    assert session.ended_by == "done"


async def test_lifetime_ends_the_stream_with_its_frame_even_while_frames_flow() -> None:
    session, peer = Session(1000, 0.01), Peer()
    await asyncio.wait_for(response(session, lifetime_s=0.15)({}, peer.receive, peer.send), 5)
    assert peer.bodies[-2:] == [b"data: lifetime\n\n", b""]
    assert 3 <= len(peer.bodies) < 100
    assert session.closed == 1
    assert session.ended_by in {"cancelled", "closed"}


async def test_disconnect_cancels_the_frame_source_at_once() -> None:
    session, peer = Session(5, 10.0), Peer(disconnect_after_s=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(response(session)({}, peer.receive, peer.send), 5)
    assert loop.time() - started < 2.0  # not the 10 s upstream gap
    assert peer.bodies == [b"data: 0\n\n"]
    assert (session.ended_by, session.closed) == ("cancelled", 1)


async def test_an_outside_cancellation_still_propagates_and_closes() -> None:
    session, peer = Session(5, 10.0), Peer()
    task = asyncio.ensure_future(response(session)({}, peer.receive, peer.send))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.closed == 1


async def test_a_reader_draining_below_the_minimum_rate_is_cut_off_after_the_grace() -> None:
    # Frames of 10 bytes taken at 100 B/s: 0.1 s of waiting per frame, against a 1000 B/s minimum.
    session, peer = Session(100, 0), Peer(drain_bytes_per_s=100)
    await asyncio.wait_for(response(session, min_drain=1000, drain_grace_s=0.2)({}, peer.receive, peer.send), 5)
    assert 2 <= len(peer.bodies) <= 5
    assert b"" not in peer.bodies  # cut off, not completed
    assert session.closed == 1
    assert session.ended_by in {"cancelled", "closed"}


async def test_a_slow_producer_is_not_mistaken_for_a_slow_reader() -> None:
    # The client takes frames at once; the upstream is slow. Nothing waits on the client.
    session, peer = Session(8, 0.05), Peer()
    await asyncio.wait_for(response(session, min_drain=1_000_000, drain_grace_s=0.0)({}, peer.receive, peer.send), 5)
    assert len(peer.bodies) == 9
    assert session.ended_by == "done"
