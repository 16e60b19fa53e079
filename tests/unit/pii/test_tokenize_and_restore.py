"""The PII stage's pure parts: what a request's tokenization touches, and a stream's restoration."""

from __future__ import annotations

import dataclasses
import hashlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tollway.canonical import (
    CacheControl,
    CanonicalRequest,
    EmbeddingRequest,
    ImagePart,
    Message,
    StreamEvent,
    StreamFinish,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from tollway.pii.detectors import build_detector
from tollway.pii.placeholders import PLACEHOLDER_RE, PlaceholderKey, PlaceholderMinter, scope_binding
from tollway.pii.policy import PiiKeys, PiiProfile, Tokenizer
from tollway.pii.recovery import Mapping
from tollway.pipeline.stages.pii import PiiState, _Recovery

EMAIL = "jane.doe@example.com"
CARD = "4111111111111111"
KEYS = PiiKeys(PlaceholderMinter([PlaceholderKey(b"k" * 32)]), b"k" * 32)


def profile(scope: str = "request") -> PiiProfile:
    return PiiProfile("p", build_detector(["email", "card"]), scope, "leave-masked", True, False, 60)  # type: ignore[arg-type]


def tokenizer(scope: str = "request", binding: bytes = b"b" * 32) -> tuple[Tokenizer, Mapping]:
    mapping = Mapping(KEYS.minter, binding)
    return Tokenizer(profile(scope), mapping, KEYS, binding), mapping


def test_content_is_tokenized_and_control_fields_are_not() -> None:
    tok, mapping = tokenizer()
    thinking = ThinkingPart(f"the user wrote {EMAIL}", "sig")
    args = orjson.dumps({"to": EMAIL, EMAIL: 1, "n": 4}).decode()
    req = CanonicalRequest(
        messages=[
            Message("system", f"Escalate to {EMAIL}."),
            Message("user", [TextPart(f"card {CARD}"), ImagePart("https://example.com/jane.doe@example.com.png")]),
            Message("assistant", [thinking], tool_calls=[ToolCall("c1", "send_to_jane.doe@example.com", args)]),
            Message("tool", f"sent to {EMAIL}", tool_call_id="c1", name="jane.doe@example.com"),
        ],
        tools=[ToolDefinition("send", f"mail {EMAIL}", {"type": "object"})],
        user=EMAIL,
    )
    tok.request(req)
    system, user, assistant, tool = req.messages
    assert EMAIL not in str(system.content) and "[TWPII1_EMAIL_" in str(system.content)
    assert isinstance(user.content, list) and "[TWPII1_CARD_" in user.content[0].text  # type: ignore[union-attr]
    assert user.content[1] == ImagePart("https://example.com/jane.doe@example.com.png")  # a URL is not text
    assert assistant.content == [thinking]  # signed by the provider: byte for byte
    assert assistant.tool_calls is not None
    call = assistant.tool_calls[0]
    assert call.name == "send_to_jane.doe@example.com"
    doc = orjson.loads(call.arguments)
    assert PLACEHOLDER_RE.fullmatch(doc["to"]) and doc[EMAIL] == 1 and doc["n"] == 4  # keys are schema
    assert tool.name == "jane.doe@example.com" and EMAIL not in str(tool.content)
    assert req.tools is not None and req.tools[0].description == f"mail {EMAIL}" and req.user == EMAIL
    assert tok.out.counts == {"email": 3, "card": 1}
    assert len(tok.out.minted) == 2  # one placeholder per distinct value
    assert mapping.resolve(doc["to"]) == EMAIL


def test_a_tokenized_message_keeps_every_other_field() -> None:
    # The tokenizer builds a changed message field by field: a field added to Message must be added there.
    assert [f.name for f in dataclasses.fields(Message)] == [
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "cache_control",
    ]
    tok, _ = tokenizer()
    before = Message("tool", f"sent to {EMAIL}", "mailer", None, "c7", CacheControl("1h"))
    req = CanonicalRequest(messages=[before])
    tok.request(req)
    (after,) = req.messages
    assert after is not before and EMAIL not in str(after.content) and before.content == f"sent to {EMAIL}"
    assert (after.role, after.name, after.tool_calls, after.tool_call_id, after.cache_control) == (
        "tool",
        "mailer",
        None,
        "c7",
        CacheControl("1h"),
    )


def test_the_digest_covers_the_tokenized_texts_and_no_value() -> None:
    tok, _ = tokenizer()
    req = CanonicalRequest(messages=[Message("system", "Be brief."), Message("user", f"Mail {EMAIL} today.")])
    tok.request(req)
    sent = [m.content for m in req.messages]
    assert EMAIL not in str(sent)
    assert tok.digest() == hashlib.sha256(orjson.dumps(sent)).hexdigest()[:32]
    again, _ = tokenizer()
    again.request(CanonicalRequest(messages=[Message("system", "Be brief."), Message("user", f"Mail {EMAIL} today.")]))
    assert again.digest() != tok.digest()  # request scope: fresh placeholders, so another digest


def test_embeddings_inputs_are_tokenized() -> None:
    tok, _ = tokenizer()
    req = EmbeddingRequest([f"a {EMAIL}", "plain"])
    tok.request(req)
    assert EMAIL not in req.inputs[0] and req.inputs[1] == "plain"  # type: ignore[operator]


def test_durable_scopes_give_one_value_one_placeholder_across_requests() -> None:
    session = scope_binding("session", "t", "p", "s-1")
    first, _ = tokenizer("session", session)
    second, _ = tokenizer("session", session)
    other, _ = tokenizer("session", scope_binding("session", "t", "p", "s-2"))
    assert first.text(EMAIL) == second.text(f"{EMAIL}").strip() != other.text(EMAIL)
    request_a, _ = tokenizer("request", b"r" * 32)
    request_b, _ = tokenizer("request", b"r" * 32)
    assert request_a.text(EMAIL) != request_b.text(EMAIL)  # request scope: random ids, never linkable


def _state(text: str) -> tuple[PiiState, str]:
    binding = b"b" * 32
    mapping = Mapping(KEYS.minter, binding)
    tok = Tokenizer(profile(), mapping, KEYS, binding)
    tokenized = tok.text(text)
    return PiiState(profile(), KEYS, mapping, binding, tok.out, "d"), tokenized


def _run(state: PiiState, events: list[StreamEvent]) -> list[StreamEvent]:
    rec = _Recovery(state)
    out: list[StreamEvent] = []
    for ev in events:
        out.extend(rec.feed(ev))
    out.extend(rec.flush())
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=30))
def test_a_stream_split_anywhere_restores_exactly(cuts: list[int]) -> None:
    original = f"Hi {EMAIL}, your card {CARD} is on file. [link](x) {EMAIL}!"
    state, tokenized = _state(original)
    pieces, at = [], 0
    for n in cuts:
        if at >= len(tokenized):
            break
        pieces.append(tokenized[at : at + n])
        at += n
    pieces.append(tokenized[at:])
    out = _run(state, [TextDelta(p) for p in pieces if p] + [StreamFinish("stop")])
    text = "".join(e.text for e in out if isinstance(e, TextDelta))
    assert text == original
    assert isinstance(out[-1], StreamFinish)  # held text leaves before the finish
    assert state.outcomes.exact == 3


def test_tool_arguments_are_restored_json_escaped_and_text_goes_first() -> None:
    value = 'jo"e@example.com'
    state, _ = _state("")
    token = state.mapping.mint("email", value)
    args = orjson.dumps({"to": token}).decode()
    events: list[StreamEvent] = [
        TextDelta("Sending to " + token[:10]),
        TextDelta(token[10:]),
        ToolCallDelta(0, id="c1", name="send"),
        ToolCallDelta(0, arguments=args[:15]),
        ToolCallDelta(0, arguments=args[15:]),
        StreamFinish("tool_calls"),
    ]
    out = _run(state, events)
    text = "".join(e.text for e in out if isinstance(e, TextDelta))
    assert text == "Sending to " + value
    first_tool = next(i for i, e in enumerate(out) if isinstance(e, ToolCallDelta))
    assert all(not isinstance(e, TextDelta) for e in out[first_tool:])
    joined = "".join(e.arguments for e in out if isinstance(e, ToolCallDelta))
    assert orjson.loads(joined) == {"to": value}


def test_the_state_ends_with_counts_and_no_values() -> None:
    state, tokenized = _state(f"{EMAIL} {EMAIL} {CARD}")
    out = _run(state, [TextDelta(tokenized.split(" ")[0])])
    assert "".join(e.text for e in out if isinstance(e, TextDelta)) == EMAIL
    state.end()
    assert state.omitted == 1 and state.tokenized.minted == [] and len(state.mapping) == 0
    assert state.manifest()["recovery"] == {"exact": 1, "leftMasked": 0, "nearMiss": 0, "omitted": 1}
    assert EMAIL not in str(state.manifest()) and "TWPII" not in str(state.manifest())
