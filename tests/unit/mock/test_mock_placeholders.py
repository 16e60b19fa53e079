"""The ``placeholders`` fault: a mock model that copies, alters, drops or invents PII placeholders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from tollway.mock import create_app
from tollway.mock.content import (
    FORGED_PLACEHOLDER,
    PLACEHOLDER_RE,
    TextReply,
    ToolReply,
    placeholder_reply,
    placeholder_text,
    text_reply,
)
from tollway.mock.faults import NO_FAULTS, FaultSpecError, fault_spec
from tollway.pii.placeholders import PLACEHOLDER_RE as GATEWAY_PLACEHOLDER_RE

P1 = "[TWPII1_EMAIL_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]"
P2 = "[TWPII1_CARD_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM]"
DIGITS = "[TWPII1_42_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM]"
PROMPT = f"mail {P1} and charge {P2}"


def test_the_mock_grammar_is_the_gateways() -> None:
    assert PLACEHOLDER_RE.pattern == GATEWAY_PLACEHOLDER_RE.pattern
    assert PLACEHOLDER_RE.fullmatch(FORGED_PLACEHOLDER)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("echo", PROMPT),
        (
            "alter",
            "mail [TWPII1_email_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB] and charge "
            "[TWPII1_card_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM]",
        ),
        ("drop", "mail  and charge "),
        ("invent", f"mail {P1} and charge {P2} {FORGED_PLACEHOLDER}"),
    ],
)
def test_each_mode_treats_every_placeholder_alike(mode: str, expected: str) -> None:
    assert placeholder_text(PROMPT, mode) == expected


def test_an_altered_placeholder_is_a_near_miss_never_a_placeholder() -> None:
    altered = placeholder_text(f"{PROMPT} {DIGITS}", "alter")
    assert PLACEHOLDER_RE.search(altered) is None
    assert altered.count("TWPII1_") == 3
    assert "[TWPII1_42_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM " not in altered  # the digits-only kind
    assert altered.endswith("[TWPII1_42_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM")


def test_invent_keeps_json_valid_and_adds_nothing_where_there_is_no_placeholder() -> None:
    doc = orjson.dumps({"reply": PROMPT, "n": 1}).decode()
    invented = placeholder_text(doc, "invent", append=False)
    assert orjson.loads(invented)["reply"] == f"{PROMPT} {FORGED_PLACEHOLDER}"
    assert placeholder_text('{"a":"b"}', "invent", append=False) == '{"a":"b"}'
    assert placeholder_text("no placeholder", "invent") == f"no placeholder {FORGED_PLACEHOLDER}"


def test_a_text_reply_is_cut_again_into_deltas_that_join_to_it() -> None:
    reply = text_reply(PROMPT, None, None, 4)
    dropped = placeholder_reply(reply, "drop", PROMPT, 4)
    assert isinstance(dropped, TextReply)
    assert "TWPII" not in dropped.text
    assert "".join(dropped.deltas) == dropped.text
    assert len(dropped.deltas) == 4
    assert placeholder_reply(reply, "echo", PROMPT, 4) is reply


def test_a_tool_call_carries_the_requests_placeholders_in_its_first_string_argument() -> None:
    reply = ToolReply("send", '{"n":1,"to":"mock-to","body":"mock-body"}', ('{"n":1,', '"to":"mock-to",', "..."), 5)
    echoed = placeholder_reply(reply, "echo", f"{PROMPT} {P1}", 5)
    assert isinstance(echoed, ToolReply)
    assert orjson.loads(echoed.arguments) == {"n": 1, "to": f"{P1} {P2}", "body": "mock-body"}
    assert "".join(echoed.fragments) == echoed.arguments
    altered = placeholder_reply(reply, "alter", PROMPT, 5)
    assert isinstance(altered, ToolReply)
    assert orjson.loads(altered.arguments)["to"] == placeholder_text(f"{P1} {P2}", "alter")
    assert placeholder_reply(reply, "invent", "no placeholders here", 5) is reply


def test_the_mode_is_validated_and_absent_by_default() -> None:
    assert NO_FAULTS.placeholders is None
    assert fault_spec({"placeholders": "drop"}).placeholders == "drop"
    with pytest.raises(FaultSpecError, match="placeholders must be one of echo, alter, drop, invent"):
        fault_spec({"placeholders": "shuffle"})


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mock") as http:
        http.app = app  # type: ignore[attr-defined]
        yield http


OPENAI: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
ANTHROPIC: dict[str, Any] = {"model": "c", "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}]}


def _sse_text(body: str) -> str:
    text: list[str] = []
    for line in body.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        frame = orjson.loads(line[6:])
        if "choices" in frame:
            text.extend(c["delta"].get("content") or "" for c in frame["choices"])
        elif frame.get("type") == "content_block_delta":
            text.append(frame["delta"].get("text", ""))
    return "".join(text)


async def test_a_path_fault_alters_a_buffered_openai_answer(client: httpx.AsyncClient) -> None:
    r = await client.post("/_fault/placeholders=alter/v1/chat/completions", json=OPENAI)
    assert r.status_code == 200
    content = r.json()["choices"][0]["message"]["content"]
    assert content == "Mock reply #5: " + placeholder_text(PROMPT, "alter")


async def test_a_header_drops_them_from_an_anthropic_stream(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/messages", json={**ANTHROPIC, "stream": True}, headers={"x-mock-placeholders": "drop"})
    assert r.status_code == 200
    assert _sse_text(r.text) == "Mock reply #5: mail  and charge "


async def test_a_posted_default_invents_in_an_openai_stream_and_a_messages_answer(client: httpx.AsyncClient) -> None:
    set_ = await client.post("/_mock/faults", json={"placeholders": "invent"})
    assert set_.json()["faults"] == "placeholders=invent"
    streamed = await client.post("/v1/chat/completions", json={**OPENAI, "stream": True})
    assert _sse_text(streamed.text) == f"Mock reply #5: {PROMPT} {FORGED_PLACEHOLDER}"
    buffered = await client.post("/v1/messages", json=ANTHROPIC)
    assert buffered.json()["content"][0]["text"] == f"Mock reply #5: {PROMPT} {FORGED_PLACEHOLDER}"
    log = (await client.get("/_mock/requests")).json()
    assert log[-1]["faults"] == "placeholders=invent"


async def test_without_the_fault_the_answer_is_the_plain_echo(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=OPENAI)
    assert r.json()["choices"][0]["message"]["content"] == f"Mock reply #5: {PROMPT}"


async def test_a_tool_call_under_a_mode_carries_the_placeholders_in_both_formats(client: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
    openai_body = {**OPENAI, "tools": [{"type": "function", "function": {"name": "send", "parameters": schema}}]}
    r = await client.post("/_fault/placeholders=echo/v1/chat/completions", json=openai_body)
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert orjson.loads(call["arguments"]) == {"to": f"{P1} {P2}"}
    anthropic_body = {**ANTHROPIC, "stream": True, "tools": [{"name": "send", "input_schema": schema}]}
    r = await client.post("/_fault/placeholders=invent/v1/messages", json=anthropic_body)
    parts = [
        orjson.loads(line[6:])["delta"]["partial_json"]
        for line in r.text.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line
    ]
    assert orjson.loads("".join(parts)) == {"to": f"{P1} {P2} {FORGED_PLACEHOLDER}"}


async def test_a_bad_mode_is_a_400_in_the_formats_envelope(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=OPENAI, headers={"x-mock-placeholders": "scramble"})
    assert r.status_code == 400
    assert "placeholders must be one of" in r.json()["error"]["message"]
