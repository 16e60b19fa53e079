from __future__ import annotations

import struct
import zlib
from collections.abc import AsyncIterator

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer

from tollway.eventstream import (
    EventStreamCorrupt,
    EventStreamError,
    EventStreamMessage,
    EventStreamParser,
    EventStreamTooLarge,
    HeaderValue,
    aiter_eventstream,
    encode_event,
    encode_exception,
    encode_message,
)
from tollway.exceptions import TollwayError
from tollway.mock.bedrock_converse import encode_frame

EMPTY_MESSAGE = bytes.fromhex("000000100000000005c248eb7d98c8ff")
"""A message with no headers and no payload: the specification's smallest, with both CRCs."""


def transcript() -> bytes:
    frames = [encode_event("messageStart", b'{"role":"assistant"}')]
    frames += [
        encode_event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 0, "delta": {"text": f"Grüße {i} "}}))
        for i in range(5)
    ]
    frames.append(encode_exception("throttlingException", b'{"message":"Too many requests"}'))
    return b"".join(frames)


def test_the_smallest_message_matches_the_known_bytes() -> None:
    assert encode_message({}, b"") == EMPTY_MESSAGE
    assert EventStreamParser().feed(EMPTY_MESSAGE) == [EventStreamMessage("event", None, b"")]


def test_messages_round_trip_with_every_header_type() -> None:
    headers: dict[str, HeaderValue] = {
        ":message-type": "event",
        ":event-type": "metadata",
        "flag": True,
        "off": False,
        "small": -7,
        "big": 2**40,
        "blob": b"\x00\xff",
    }
    [message] = EventStreamParser().feed(encode_message(headers, b'{"a":1}'))
    assert (message.message_type, message.event_type, message.payload) == ("event", "metadata", b'{"a":1}')
    assert dict(message.headers) == headers


def test_byte_timestamp_and_uuid_headers_parse() -> None:
    raw = b"\x01b\x02\xfe" + b"\x01s\x03\xff\xfe" + b"\x02ts\x08" + struct.pack(">q", 1_700_000_000_000)
    raw += b"\x02id\x09" + bytes(range(16))
    prelude = struct.pack(">II", 16 + len(raw), len(raw))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw
    [message] = EventStreamParser().feed(body + struct.pack(">I", zlib.crc32(body)))
    assert dict(message.headers) == {"b": -2, "s": -2, "ts": 1_700_000_000_000, "id": bytes(range(16))}


def test_exceptions_and_errors_name_what_they_carry() -> None:
    errors = encode_message({":message-type": "error", ":error-code": "InternalFailure", ":error-message": "boom"}, b"")
    parsed = EventStreamParser().feed(encode_exception("throttlingException", b'{"message":"slow"}') + errors)
    assert parsed == [
        EventStreamMessage("exception", "throttlingException", b'{"message":"slow"}'),
        EventStreamMessage("error", "InternalFailure", b"boom"),
    ]


def test_a_split_at_every_byte_boundary_yields_the_same_messages() -> None:
    data = transcript()
    whole = EventStreamParser().feed(data)
    assert len(whole) == 7
    for cut in range(1, len(data)):
        parser = EventStreamParser()
        assert parser.feed(data[:cut]) + parser.feed(data[cut:]) == whole, cut
        assert parser.pending == 0


def test_single_byte_chunks_yield_the_same_messages() -> None:
    data = transcript()
    parser = EventStreamParser()
    assert [m for i in range(len(data)) for m in parser.feed(data[i : i + 1])] == EventStreamParser().feed(data)


def test_a_cut_message_is_held_back_not_yielded() -> None:
    data = transcript()
    parser = EventStreamParser()
    messages = parser.feed(data[:-3])
    assert len(messages) == 6
    assert parser.pending == len(encode_exception("throttlingException", b'{"message":"Too many requests"}')) - 3


@pytest.mark.parametrize("offset", [0, 5, 8, 11], ids=["total-length", "headers-length", "prelude-crc", "crc-end"])
def test_a_corrupt_prelude_is_refused(offset: int) -> None:
    data = bytearray(encode_event("messageStart", b"{}"))
    data[offset] ^= 0x01
    with pytest.raises(EventStreamCorrupt, match="prelude CRC"):
        EventStreamParser().feed(bytes(data))


@pytest.mark.parametrize("offset", [12, 30, -5, -1], ids=["header", "payload", "payload-end", "message-crc"])
def test_a_corrupt_message_is_refused(offset: int) -> None:
    data = bytearray(encode_event("messageStart", b'{"role":"assistant"}'))
    data[offset] ^= 0x40
    with pytest.raises(EventStreamCorrupt, match="message CRC"):
        EventStreamParser().feed(bytes(data))


def test_impossible_lengths_and_bad_headers_are_corrupt_not_crashes() -> None:
    prelude = struct.pack(">II", 16, 8)  # headers longer than the message
    with pytest.raises(EventStreamCorrupt, match="shorter"):
        EventStreamParser().feed(prelude + struct.pack(">I", zlib.crc32(prelude)) + b"\x00" * 4)
    for raw in (b"\x01x\x0d", b"\x05ab", b"\x01x\x07\x00\x09ab", b"\x01x\x09\x00"):
        prelude = struct.pack(">II", 16 + len(raw), len(raw))
        body = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw
        with pytest.raises(EventStreamCorrupt):
            EventStreamParser().feed(body + struct.pack(">I", zlib.crc32(body)))


def test_a_duplicate_header_is_corrupt() -> None:
    raw = b"\x01x\x00" * 2
    prelude = struct.pack(">II", 16 + len(raw), len(raw))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw
    with pytest.raises(EventStreamCorrupt, match="duplicate"):
        EventStreamParser().feed(body + struct.pack(">I", zlib.crc32(body)))


def test_an_oversized_message_is_refused_before_it_is_buffered() -> None:
    message = encode_event("contentBlockDelta", b"x" * 5000)
    parser = EventStreamParser(max_message_bytes=4096)
    with pytest.raises(EventStreamTooLarge, match="exceeds 4096"):
        parser.feed(message[:12])
    assert EventStreamParser(max_message_bytes=len(message)).feed(message)[0].payload == b"x" * 5000


def test_oversized_headers_are_refused() -> None:
    prelude = struct.pack(">II", 200_000, 150_000)
    with pytest.raises(EventStreamTooLarge, match="headers"):
        EventStreamParser(max_message_bytes=1 << 20).feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_errors_belong_to_the_one_tree() -> None:
    assert issubclass(EventStreamCorrupt, EventStreamError)
    assert issubclass(EventStreamTooLarge, EventStreamError)
    assert issubclass(EventStreamError, TollwayError)
    assert issubclass(EventStreamError, ValueError)
    with pytest.raises(ValueError):
        EventStreamParser(max_message_bytes=15)


def test_botocore_parses_what_this_encoder_writes() -> None:
    data = transcript()
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    theirs = [(dict(m.headers), m.payload) for m in buffer]
    ours = [(dict(m.headers), m.payload) for m in EventStreamParser().feed(data)]
    assert theirs == ours
    assert theirs[0] == (
        {":event-type": "messageStart", ":content-type": "application/json", ":message-type": "event"},
        b'{"role":"assistant"}',
    )


def test_the_mocks_own_encoder_agrees_with_botocore_and_this_parser() -> None:
    """The mock frames its streams itself: both parsers must read its bytes as this encoder's."""
    payload = b'{"contentBlockIndex":0,"delta":{"text":"hi"}}'
    assert encode_frame("contentBlockDelta", payload) == encode_event("contentBlockDelta", payload)
    assert encode_frame("throttlingException", b"{}", exception=True) == encode_exception("throttlingException", b"{}")
    buffer = EventStreamBuffer()
    buffer.add_data(encode_frame("metadata", b"{}"))
    assert [m.headers[":event-type"] for m in buffer] == ["metadata"]


async def test_aiter_eventstream_yields_messages_as_chunks_complete() -> None:
    data = transcript()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 7):
            yield data[i : i + 7]

    kinds = [(m.message_type, m.event_type) async for m in aiter_eventstream(chunks())]
    assert kinds == [("event", "messageStart")] + [("event", "contentBlockDelta")] * 5 + [
        ("exception", "throttlingException")
    ]
