from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from tollway.sse import DEFAULT_MAX_EVENT_BYTES, DONE, SseFrameTooLarge, SseParser, aiter_sse, encode_data
from tollway.wire import SseEvent


def parse(*chunks: bytes, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> list[SseEvent]:
    parser = SseParser(max_event_bytes)
    return [event for chunk in chunks for event in parser.feed(chunk)]


def every_split(data: bytes) -> list[list[bytes]]:
    return [[data[:i], data[i:]] for i in range(len(data) + 1)]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_all_three_line_endings_frame_the_same_events(eol: bytes) -> None:
    stream = eol.join([b"event: delta", b"data: one", b"data: two", b"", b"data: three", b"", b""])
    assert parse(stream) == [SseEvent("delta", "one\ntwo"), SseEvent(None, "three")]


def test_cr_ending_one_chunk_and_lf_starting_the_next_are_one_line_end() -> None:
    assert parse(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [SseEvent(None, "a\nb")]


def test_a_cr_not_followed_by_lf_ends_its_line_alone() -> None:
    assert parse(b"data: a\r", b"data: b\r\r") == [SseEvent(None, "a\nb")]
    assert parse(b"data: a\rdata: b\r", b"\r") == [SseEvent(None, "a\nb")]


def test_field_syntax_follows_the_specification() -> None:
    stream = (
        b": a comment line\n"
        b"id: 7\n"
        b"retry: 1000\n"
        b"unknown: field\n"
        b"data:no-space\n"
        b"data:  two spaces\n"
        b"data\n"
        b"data: colon: inside\n"
        b"\n"
    )
    assert parse(stream) == [SseEvent(None, "no-space\n two spaces\n\ncolon: inside")]


def test_a_single_empty_data_line_is_an_event_with_empty_data() -> None:
    assert parse(b"data:\n\n") == [SseEvent(None, "")]


def test_blank_lines_and_events_without_data_dispatch_nothing() -> None:
    assert parse(b"\n\n: ping\n\nevent: lonely\n\ndata: x\n\n") == [SseEvent(None, "x")]


def test_event_name_resets_after_each_event() -> None:
    assert parse(b"event: a\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n") == [
        SseEvent("a", "1"),
        SseEvent(None, "2"),
        SseEvent(None, "3"),
    ]


def test_fields_split_at_any_byte_give_the_same_events() -> None:
    stream = b'event: message_start\r\ndata: {"a": 1}\r\n: keepalive\r\n\r\ndata: [DONE]\r\n\r\n'
    expected = [SseEvent("message_start", '{"a": 1}'), SseEvent(None, "[DONE]")]
    for chunks in every_split(stream):
        assert parse(*chunks) == expected, chunks


def test_multibyte_characters_split_across_chunks_decode_intact() -> None:
    stream = "data: café 日本 👋\n\n".encode()
    expected = [SseEvent(None, "café 日本 👋")]
    assert parse(*(stream[i : i + 1] for i in range(len(stream)))) == expected
    for chunks in every_split(stream):
        assert parse(*chunks) == expected


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert parse(b"data: \xff\xfe ok\n\n") == [SseEvent(None, "\ufffd\ufffd ok")]


def test_a_leading_byte_order_mark_is_dropped_even_when_split() -> None:
    assert parse(b"\xef\xbb", b"\xbfdata: x\n\n") == [SseEvent(None, "x")]
    assert parse(b"data: x\n\n\xef\xbb\xbfdata: y\n\n") == [SseEvent(None, "x")]


def test_an_event_left_unterminated_at_the_end_is_not_emitted() -> None:
    parser = SseParser()
    assert parser.feed(b"data: complete\n\ndata: cut of") == [SseEvent(None, "complete")]
    assert parser.feed(b"f\n") == []


def test_empty_chunks_are_harmless() -> None:
    assert parse(b"", b"data: a\r", b"", b"\n\n", b"") == [SseEvent(None, "a")]


def test_an_unterminated_line_past_the_bound_raises() -> None:
    parser = SseParser(max_event_bytes=64)
    parser.feed(b"data: " + b"x" * 50)
    with pytest.raises(SseFrameTooLarge):
        parser.feed(b"x" * 20)


def test_an_event_whose_lines_together_pass_the_bound_raises_however_it_arrives() -> None:
    stream = b"data: " + b"a" * 30 + b"\n" + b"data: " + b"b" * 30 + b"\n\n"
    with pytest.raises(SseFrameTooLarge):
        parse(stream, max_event_bytes=60)
    with pytest.raises(SseFrameTooLarge):
        parse(*(stream[i : i + 1] for i in range(len(stream))), max_event_bytes=60)
    assert parse(stream, max_event_bytes=72) == [SseEvent(None, "a" * 30 + "\n" + "b" * 30)]


def test_the_bound_is_per_event_not_per_stream() -> None:
    stream = b"data: " + b"z" * 40 + b"\n\n"
    assert len(parse(stream * 100, max_event_bytes=64)) == 100


def test_the_frame_error_is_a_value_error() -> None:
    assert issubclass(SseFrameTooLarge, ValueError)
    with pytest.raises(ValueError):
        SseParser(max_event_bytes=0)


def test_encode_data_frames_one_event() -> None:
    assert encode_data(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    assert parse(encode_data(b'{"a":1}'), DONE) == [SseEvent(None, '{"a":1}'), SseEvent(None, "[DONE]")]


@pytest.mark.parametrize("payload", [b"one\ntwo", b"one\r\ntwo\rthree", b"trailing\n", b"\n"])
def test_encode_data_keeps_line_breaks_through_a_parser(payload: bytes) -> None:
    framed = encode_data(payload)
    expected = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode()
    assert parse(framed) == [SseEvent(None, expected)]


def test_randomly_chunked_streams_round_trip() -> None:
    rng = random.Random(1234)
    alphabet = "abc:é日本 👋{}\"'"
    for _ in range(200):
        payloads = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 6))]
        data = b"".join(encode_data(p.encode()) for p in payloads)
        chunks, i = [], 0
        while i < len(data):
            step = rng.randint(1, 9)
            chunks.append(data[i : i + step])
            i += step
        assert parse(*chunks) == [SseEvent(None, p) for p in payloads]


async def test_aiter_sse_yields_events_as_chunks_arrive() -> None:
    seen: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"data: fir", b"st\n\nda", b"ta: second\n", b"\n"):
            seen.append(chunk.decode())
            yield chunk

    events = []
    async for event in aiter_sse(chunks()):
        events.append((event, len(seen)))
    assert events == [(SseEvent(None, "first"), 2), (SseEvent(None, "second"), 4)]


async def test_aiter_sse_enforces_the_bound() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: " + b"x" * 100

    with pytest.raises(SseFrameTooLarge):
        async for _ in aiter_sse(chunks(), max_event_bytes=50):
            pass
