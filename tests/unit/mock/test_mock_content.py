"""Pure pieces of the mock: reply content, tool arguments, fault-spec parsing."""

from __future__ import annotations

import pytest

from tollway.mock import FaultSpecError
from tollway.mock.content import ToolSpec, split_text, text_reply, tool_arguments, tool_reply
from tollway.mock.faults import NO_FAULTS, fault_spec, parse_fault_items


@pytest.mark.parametrize("chunks", [1, 2, 5, 9, 12, 40])
def test_split_text_gives_exactly_the_requested_non_empty_deltas(chunks: int) -> None:
    text = "Mock reply #6: one two three four five six"

    deltas = split_text(text, chunks)

    assert len(deltas) == chunks
    assert all(deltas)
    assert "".join(deltas) == text


def test_split_text_caps_deltas_at_the_character_count() -> None:
    assert split_text("abc", 10) == ("a", "b", "c")


def test_text_reply_pads_with_filler_to_the_requested_words() -> None:
    reply = text_reply("one two", 5, None, 2)

    assert reply.text == "Mock reply #5: one two alpha bravo charlie"
    assert reply.completion_tokens == 8
    assert not reply.truncated


def test_text_reply_without_user_text_still_answers() -> None:
    assert text_reply("", None, None, 5).text == "Mock reply #0:"


def test_tool_arguments_follow_the_schema_property_types() -> None:
    schema = {
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "a": {"type": "array"},
            "o": {"type": "object"},
            "e": {"enum": ["x", "y"]},
            "u": {},
        }
    }

    assert tool_arguments(schema) == '{"s":"mock-s","i":1,"n":1.5,"b":true,"a":[],"o":{},"e":"x","u":null}'
    assert tool_arguments({}) == "{}"


def test_tool_reply_fragments_arguments_at_least_three_ways() -> None:
    reply = tool_reply(ToolSpec("t", {"properties": {"city": {"type": "string"}}}), 1)

    assert len(reply.fragments) == 3
    assert "".join(reply.fragments) == '{"city":"mock-city"}'


def test_fault_items_resolve_aliases_and_canonicalize() -> None:
    items = parse_fault_items("status=503, latency-ms=20,Retry_After=1")
    spec = fault_spec(items)

    assert items == {"status": "503", "delay_ms": "20", "retry_after": "1"}
    assert spec.canonical == "delay_ms=20,retry_after=1,status=503"
    assert (spec.status, spec.delay_ms, spec.retry_after) == (503, 20, "1")
    assert fault_spec({}) is NO_FAULTS


@pytest.mark.parametrize(
    "spec",
    [
        "bogus=1",
        "status=abc",
        "status=200",
        "chunks=0",
        "stall_at=-2",
        "abort_mode=explode",
        "retry_after=-1",
        "status",
    ],
)
def test_invalid_fault_specs_raise(spec: str) -> None:
    with pytest.raises(FaultSpecError):
        fault_spec(parse_fault_items(spec))


def test_fail_first_alone_implies_503_and_stall_defaults() -> None:
    assert fault_spec({"fail_first": "2"}).fail_status == 503
    assert fault_spec({"fail_first": "2", "midstream_error": "1"}).fail_status is None
    assert fault_spec({"stall_at": "3"}).stall == (3, 600.0)
    assert fault_spec({"stall_ms": "50"}).stall == (-1, 0.05)


def test_latency_jitter_is_deterministic_and_bounded() -> None:
    spec = fault_spec({"latency_ms": "10", "latency_jitter_ms": "20"})

    delays = [spec.delay_s(seq) for seq in range(1, 201)]

    assert delays == [spec.delay_s(seq) for seq in range(1, 201)]
    assert all(0.010 <= d <= 0.030 for d in delays)
    assert len(set(delays)) > 10
    assert NO_FAULTS.delay_s(7) == 0
