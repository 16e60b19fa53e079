"""What a committed stream tolerates: one undecodable event between good ones, never two."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from types import SimpleNamespace
from typing import Any

import pytest

from tollway.canonical import SKIPPED, StreamEvent, StreamFinish, TextDelta, ToolCallDelta
from tollway.exceptions import UpstreamCategory, UpstreamError
from tollway.gateway import AttemptRecord, CommittedStream


async def _feed(*events: StreamEvent) -> AsyncIterator[StreamEvent]:
    for ev in events:
        yield ev


def _stream(*rest: StreamEvent) -> tuple[CommittedStream, AttemptRecord]:
    record = AttemptRecord(1, "r", "d", 0.0)
    ctx: Any = SimpleNamespace(usage=None, audit=None)
    target: Any = SimpleNamespace()
    committed = CommittedStream(ctx, target, record, AsyncExitStack(), [TextDelta("a")], _feed(*rest))
    return committed, record


async def test_one_undecodable_event_is_skipped_and_counted_on_the_attempt() -> None:
    committed, record = _stream(SKIPPED, TextDelta("b"), StreamFinish("stop"))
    seen = [ev async for ev in committed.events()]
    assert [ev for ev in seen if isinstance(ev, TextDelta)] == [TextDelta("a"), TextDelta("b")]
    assert record.skipped_events == 1


async def test_a_second_undecodable_event_fails_the_stream_as_malformed() -> None:
    committed, record = _stream(SKIPPED, TextDelta("b"), SKIPPED, StreamFinish("stop"))
    with pytest.raises(UpstreamError) as info:
        async for _ in committed.events():
            pass
    assert info.value.category is UpstreamCategory.MALFORMED and not info.value.reported
    assert info.value.to_stream_error().code == "upstream_stream_malformed"
    assert record.skipped_events == 1


async def test_an_undecodable_event_after_a_tool_call_delta_fails_the_stream() -> None:
    committed, _ = _stream(ToolCallDelta(0, "call_1", "f", ""), SKIPPED, StreamFinish("tool_calls"))
    with pytest.raises(UpstreamError):
        async for _ in committed.events():
            pass
