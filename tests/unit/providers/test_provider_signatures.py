"""What carries providers' reasoning signatures: Gemini's thought signature in a tool call's id, and
the mock's corrupt event stream frames that a Bedrock stream must be refused for."""

from __future__ import annotations

import base64

import orjson
import pytest

from tollway.canonical import CanonicalRequest, Message, ToolCall
from tollway.eventstream import EventStreamCorrupt, EventStreamParser, encode_event
from tollway.mock.bedrock_converse import corrupt_frame
from tollway.mock.faults import FaultSpecError, fault_spec
from tollway.providers.base import Target
from tollway.providers.gemini import GeminiCodec
from tollway.providers.gemini.signatures import SIGNATURE_MARK, signed_id, split_id

SIGNATURES = [base64.b64encode(bytes(range(n, n + 40))).decode() for n in (0, 200, 215)] + [
    base64.b64encode(b"\xfb\xff\xbf" * k).decode() for k in (1, 2, 3, 5)
]


@pytest.mark.parametrize("signature", SIGNATURES)
def test_a_signature_survives_the_id_exactly(signature: str) -> None:
    call_id = signed_id("call_abc_0", signature)
    assert set(call_id) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    assert split_id(call_id) == ("call_abc_0", signature)


def test_ids_without_a_signature_are_left_alone() -> None:
    assert signed_id("call_1", None) == "call_1"
    assert split_id("toolu_01ABC") == ("toolu_01ABC", None)
    assert split_id(f"call_1{SIGNATURE_MARK}") == (f"call_1{SIGNATURE_MARK}", None)


def test_only_the_signed_call_gets_a_thought_signature_part() -> None:
    signature = SIGNATURES[1]
    calls = [ToolCall(signed_id("call_r_0", signature), "f", "{}"), ToolCall("call_r_1", "f", '{"a":1}')]
    req = CanonicalRequest(
        [
            Message("user", "hi"),
            Message("assistant", None, tool_calls=calls),
            Message("tool", "one", tool_call_id=calls[0].id),
            Message("tool", "two", tool_call_id=calls[1].id),
        ]
    )
    body = orjson.loads(GeminiCodec().encode_request(req, Target("gemini-3-pro-preview")).body)
    assert body["contents"][1]["parts"] == [
        {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": signature},
        {"functionCall": {"name": "f", "args": {"a": 1}}},
    ]
    assert [p["functionResponse"]["response"] for p in body["contents"][2]["parts"]] == [
        {"content": "one"},
        {"content": "two"},
    ]


@pytest.mark.parametrize("mode", ["crc", "prelude"])
def test_a_corrupt_frame_is_refused_by_the_gateway_s_parser(mode: str) -> None:
    good = encode_event("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Gr\xc3\xbc\xc3\x9fe"}}')
    parser = EventStreamParser()
    assert len(parser.feed(good)) == 1
    with pytest.raises(EventStreamCorrupt):
        parser.feed(corrupt_frame(good + good, mode))


def test_corrupt_mode_is_checked() -> None:
    assert fault_spec({"corrupt_frame": "2", "corrupt_mode": "prelude"}).paced
    with pytest.raises(FaultSpecError):
        fault_spec({"corrupt_frame": "1", "corrupt_mode": "length"})
