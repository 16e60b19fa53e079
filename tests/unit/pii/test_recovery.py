"""Recovery: exact replacement only, leave-masked and near-miss counting, and streaming that
gives the buffered result for every way of cutting the text."""

from __future__ import annotations

import codecs
import itertools
import pickle
import re

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tollway.pii.placeholders import (
    MAX_PLACEHOLDER_LEN,
    PLACEHOLDER_RE,
    PlaceholderKey,
    PlaceholderMinter,
    is_placeholder_prefix,
    scope_binding,
)
from tollway.pii.recovery import (
    Mapping,
    Outcomes,
    Resolve,
    StreamRecoverer,
    _markers,
    json_string_escape,
    recover,
    unresolved,
)

MINTER = PlaceholderMinter([PlaceholderKey(b"r" * 32, "k1")])
BINDING = scope_binding("request", "req-1")
OTHER_BINDING = scope_binding("request", "req-2")


def clean_token(kind: str, binding: bytes = BINDING, minter: PlaceholderMinter = MINTER) -> str:
    """A placeholder whose random fields do not spell the near-miss marker by chance."""
    while True:
        token = minter.mint(kind, binding)
        if "TWPII" not in token[8:]:
            return token


MAPPING = Mapping(MINTER, BINDING)
VALUES = {
    "EMAIL": "alice@example.com",
    "PHONE": "+44 20 7946 0958",
    "CARD": "4111 1111 1111 1111",
    "NAME": 'Zoë "Z" O\'Brien\\\n',
    "IBAN": "[GB82 WEST 1234 5698 7654 32]",
}
VALID = [clean_token(kind) for kind in VALUES]
# A value that looks like a placeholder is written out, never expanded again.
NESTED_VALUE = f"see {VALID[0]}"
VALID.append(clean_token("NOTE"))
EXPANDS_TO = dict(zip(VALID, [*VALUES.values(), NESTED_VALUE], strict=True))
for _token, _value in EXPANDS_TO.items():
    MAPPING.insert(_token, _value)

FORGED = [
    "[TWPII1_EMAIL_ABCDEFGHIJKLMNOP_ABCDEFGHIJKLM]",
    VALID[1][:-2] + ("B" if VALID[1][-2] == "A" else "A") + "]",  # one mac character changed
]
FOREIGN = [clean_token("EMAIL", OTHER_BINDING)]
FOREIGN_KEY = [clean_token("EMAIL", BINDING, PlaceholderMinter([PlaceholderKey(b"o" * 32)]))]
UNKNOWN = [clean_token("EMAIL")]  # verifies, but was never mapped
LEFT_MASKED = FORGED + FOREIGN + FOREIGN_KEY + UNKNOWN


def near_misses(token: str) -> list[str]:
    kind_end = token.index("_", 8)
    return [
        token.lower(),
        token[1:],  # no opening bracket
        token[:-1],  # no closing bracket
        token[:-1] + ")",
        "(" + token[1:],
        token[: kind_end + 5] + token[kind_end + 6 :],  # an id one character short
        token[:-1] + "A]",  # a mac one character long
        token.replace("_", " "),
        token.replace("TWPII1", "TWPII2"),
        token.replace("[TWPII1_", "[TWPII1_ABCDEFGHIJKLM"),  # a 13-character kind
        token.replace("TWPII1", "TwPii1"),
        token[:30],
        "TWPII1_",
        "twpii",
    ]


NEAR = [variant for token in VALID[:2] for variant in near_misses(token)]


def resolve_spy() -> tuple[list[str], Resolve]:
    calls: list[str] = []

    def resolve(token: str) -> str | None:
        calls.append(token)
        return MAPPING.resolve(token)

    return calls, resolve


def stream(pieces: list[str], recoverer: StreamRecoverer | None = None) -> str:
    recoverer = recoverer or StreamRecoverer(MAPPING.resolve)
    out = []
    for piece in pieces:
        out.append(recoverer.feed(piece))
        assert recoverer.held_chars <= MAX_PLACEHOLDER_LEN - 1
    out.append(recoverer.flush())
    return "".join(out)


# --- buffered recovery ---------------------------------------------------------------------


def test_exact_placeholder_is_replaced_by_its_value() -> None:
    text, outcomes = recover(f"Write to {VALID[0]} today.", MAPPING.resolve)
    assert text == "Write to alice@example.com today."
    assert outcomes == Outcomes(exact=1)
    assert not outcomes.unresolved


def test_multiple_and_repeated_placeholders_are_all_replaced() -> None:
    email, phone = VALID[0], VALID[1]
    text, outcomes = recover(f"{email}, {phone}; again {email} and {email}.", MAPPING.resolve)
    assert text == "alice@example.com, +44 20 7946 0958; again alice@example.com and alice@example.com."
    assert outcomes == Outcomes(exact=4)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{a}{b}", "alice@example.com+44 20 7946 0958"),
        ("[{a}]", "[alice@example.com]"),
        ("[[{a}]]", "[[alice@example.com]]"),
        ("[{a}]({b})", "[alice@example.com](+44 20 7946 0958)"),
        ("[mail me]({a}) [x]", "[mail me](alice@example.com) [x]"),
        ('["{a}", "{b}"]', '["alice@example.com", "+44 20 7946 0958"]'),
        ("[{a},{b}]", "[alice@example.com,+44 20 7946 0958]"),
        ("[TWPII1_{a}", "[TWPII1_alice@example.com"),
        ("{a}]]", "alice@example.com]]"),
    ],
)
def test_placeholders_next_to_brackets_and_each_other(template: str, expected: str) -> None:
    text, outcomes = recover(template.format(a=VALID[0], b=VALID[1]), MAPPING.resolve)
    assert text == expected
    assert outcomes.exact == template.count("{")
    assert stream(list(template.format(a=VALID[0], b=VALID[1]))) == expected


@pytest.mark.parametrize("token", LEFT_MASKED)
def test_complete_but_unresolvable_placeholder_is_left_masked(token: str) -> None:
    text, outcomes = recover(f"a {token} b", MAPPING.resolve)
    assert text == f"a {token} b"
    assert outcomes == Outcomes(left_masked=1)
    assert outcomes.unresolved
    assert unresolved(f"a {token} b", MAPPING.resolve)


@pytest.mark.parametrize("variant", NEAR)
def test_near_miss_is_counted_left_unchanged_and_never_looked_up(variant: str) -> None:
    calls, resolve = resolve_spy()
    text, outcomes = recover(f"x {variant} y", resolve)
    assert text == f"x {variant} y"
    assert outcomes == Outcomes(near_miss=1)
    assert calls == []
    recoverer = StreamRecoverer(resolve)
    assert stream(list(f"x {variant} y"), recoverer) == text
    assert recoverer.outcomes == outcomes
    assert calls == []


def test_only_complete_placeholders_reach_resolve() -> None:
    text = " ".join([*VALID, *LEFT_MASKED, *NEAR, "[TWPII1_", "[link](x)"])
    calls, resolve = resolve_spy()
    recoverer = StreamRecoverer(resolve)
    stream([text[i : i + 7] for i in range(0, len(text), 7)], recoverer)
    assert calls and all(PLACEHOLDER_RE.fullmatch(call) for call in calls)
    assert recoverer.outcomes == Outcomes(exact=len(VALID), left_masked=len(LEFT_MASKED), near_miss=len(NEAR) + 1)


def test_recovered_value_is_not_expanded_again() -> None:
    text, outcomes = recover(VALID[-1], MAPPING.resolve)
    assert text == NESTED_VALUE and VALID[0] in text
    assert outcomes == Outcomes(exact=1)
    assert stream(list(VALID[-1])) == NESTED_VALUE


def test_text_without_placeholders_is_returned_as_is() -> None:
    for text in ("", "plain", "[a](b) [1, 2]", "twp ii"):
        assert recover(text, MAPPING.resolve) == (text, Outcomes())
    assert not unresolved("plain [text]", MAPPING.resolve)


def test_tool_argument_values_are_json_escaped() -> None:
    name, iban = VALID[3], VALID[4]
    arguments = f'{{"to": "{name}", "refs": ["{iban}", "{name}"], "n": 1}}'
    text, outcomes = recover(arguments, MAPPING.resolve, json_string_escape)
    assert orjson.loads(text) == {"to": VALUES["NAME"], "refs": [VALUES["IBAN"], VALUES["NAME"]], "n": 1}
    assert outcomes == Outcomes(exact=3)
    recoverer = StreamRecoverer(MAPPING.resolve, json_string_escape)
    assert stream([arguments[i : i + 5] for i in range(0, len(arguments), 5)], recoverer) == text


def test_json_string_escape_matches_json() -> None:
    for value in ('a"b', "back\\slash", "line\nbreak\t", "\x00\x1f", "é😀", "</script>"):
        assert orjson.loads('"' + json_string_escape(value) + '"') == value


def test_outcomes_aggregate_and_hold_no_identifiers() -> None:
    total = Outcomes()
    total.add(recover(f"{VALID[0]} {FORGED[0]}", MAPPING.resolve)[1])
    total.add(recover(f"{NEAR[0]} {VALID[1]}", MAPPING.resolve)[1])
    assert total == Outcomes(exact=2, left_masked=1, near_miss=1)
    assert "TWPII" not in repr(total) and "alice" not in repr(total)


# --- the mapping ---------------------------------------------------------------------------


def test_mapping_reuses_a_placeholder_for_a_repeated_value_only() -> None:
    mapping = Mapping(MINTER, BINDING)
    first = mapping.mint("email", "bob@example.com")
    assert mapping.mint("EMAIL", "bob@example.com") == first
    assert mapping.mint("email", "carol@example.com") != first
    assert mapping.mint("note", "bob@example.com") != first
    assert len(mapping) == 3
    assert Mapping(MINTER, BINDING).mint("email", "bob@example.com") != first


def test_mapping_resolves_only_its_own_verified_placeholders() -> None:
    mapping = Mapping(MINTER, BINDING)
    token = mapping.mint("phone", "555-0100")
    assert mapping.resolve(token) == "555-0100"
    assert mapping.resolve(MINTER.mint("phone", BINDING)) is None  # verifies, unknown
    assert mapping.resolve(VALID[0]) is None  # another mapping's, same binding
    assert Mapping(MINTER, OTHER_BINDING).resolve(token) is None
    for variant in (token.lower(), token[:-1], token[1:], token + " ", ""):
        assert mapping.resolve(variant) is None


def test_mapping_takes_only_placeholders_that_verify_under_its_binding() -> None:
    mapping = Mapping(MINTER, BINDING)
    token = MINTER.mint("ssn", BINDING)
    mapping.insert(token, "078-05-1120")
    mapping.insert(token, "078-05-1120")
    assert mapping.resolve(token) == "078-05-1120"
    assert mapping.mint("SSN", "078-05-1120") == token
    for bad, message in ((MINTER.mint("ssn", OTHER_BINDING), "verify"), (FORGED[0], "verify"), (token, "another")):
        with pytest.raises(ValueError, match=message) as caught:
            mapping.insert(bad, "999-99-9999")
        assert bad not in str(caught.value) and "999" not in str(caught.value)


def test_cleared_mapping_drops_values_and_refuses_use() -> None:
    mapping = Mapping(MINTER, BINDING)
    token = mapping.mint("email", "dave@example.com")
    mapping.clear()
    assert len(mapping) == 0
    assert mapping.resolve(token) is None
    assert recover(token, mapping.resolve) == (token, Outcomes(left_masked=1))
    with pytest.raises(RuntimeError):
        mapping.mint("email", "dave@example.com")
    with pytest.raises(RuntimeError):
        mapping.insert(token, "dave@example.com")


def test_mapping_repr_and_pickle_reveal_nothing() -> None:
    mapping = Mapping(MINTER, BINDING)
    token = mapping.mint("email", "erin@example.com")
    assert repr(mapping) == "Mapping(entries=1, cleared=False)"
    assert token not in repr(mapping) and "erin" not in repr(mapping)
    with pytest.raises(TypeError):
        pickle.dumps(mapping)
    recoverer = StreamRecoverer(mapping.resolve)
    recoverer.feed(token[:20])
    assert token[:20] not in repr(recoverer) and "held_chars=20" in repr(recoverer)


# --- streaming -----------------------------------------------------------------------------


def test_chunk_without_a_bracket_is_released_unchanged() -> None:
    recoverer = StreamRecoverer(MAPPING.resolve)
    chunk = "The quick brown fox."
    assert recoverer.feed(chunk) is chunk
    assert recoverer.held_chars == 0


def test_only_a_possible_placeholder_beginning_is_held() -> None:
    recoverer = StreamRecoverer(MAPPING.resolve)
    assert recoverer.feed("see [link") == "see [link"
    assert recoverer.feed("] and [T") == "] and "
    assert recoverer.held_chars == 2
    assert recoverer.feed("ODO]") == "[TODO]"
    token = VALID[0]
    assert recoverer.feed("x " + token[:-1]) == "x "
    assert recoverer.held_chars == len(token) - 1
    assert recoverer.feed("]!") == "alice@example.com!"
    assert recoverer.feed(token[:10]) == ""
    assert recoverer.flush() == token[:10]
    assert recoverer.outcomes == Outcomes(exact=1, near_miss=1)


def test_flush_starts_a_new_stream() -> None:
    recoverer = StreamRecoverer(MAPPING.resolve)
    assert recoverer.feed("tw") == "tw"
    assert recoverer.flush() == ""
    assert recoverer.feed("pii") == "pii"
    assert recoverer.outcomes.near_miss == 0


def test_channels_can_share_outcomes() -> None:
    shared = Outcomes()
    text, tool = StreamRecoverer(MAPPING.resolve, outcomes=shared), StreamRecoverer(MAPPING.resolve, outcomes=shared)
    text.feed(VALID[0])
    tool.feed(FORGED[0])
    assert shared == Outcomes(exact=1, left_masked=1)


# --- properties ----------------------------------------------------------------------------

ADVERSARIAL = '[]TWPII1_ twpiAZ27()é😀\n"{},'
SAFE = "abcdefghjkmnoqrsuvxyz0389 .,:;!?{}\"'\né😀中"  # no bracket, no letter of the marker

tokens = st.sampled_from(VALID + LEFT_MASKED + NEAR)
pieces_of_tokens = st.builds(
    lambda token, cut, head: token[:cut] if head else token[cut:],
    st.sampled_from(VALID + FORGED),
    st.integers(0, MAX_PLACEHOLDER_LEN),
    st.booleans(),
)
segments = st.one_of(st.text(alphabet=ADVERSARIAL, max_size=10), tokens, pieces_of_tokens)
adversarial_texts = st.lists(segments, max_size=10).map("".join)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cuts(text: str, points: list[int]) -> list[str]:
    bounds = [0, *sorted({p % (len(text) + 1) for p in points}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def feed_checked(text: str, pieces: list[str], expected: str) -> Outcomes:
    """Stream ``pieces``; after every feed what was released is a prefix of ``expected``."""
    recoverer = StreamRecoverer(MAPPING.resolve)
    released = ""
    fed = ""
    for piece in pieces:
        released += recoverer.feed(piece)
        fed += piece
        held = recoverer.held_chars
        assert held <= MAX_PLACEHOLDER_LEN - 1
        if held:
            assert fed[-held:].startswith("[") and is_placeholder_prefix(fed[-held:])
        assert released == recover(fed[: len(fed) - held], MAPPING.resolve)[0]
        assert expected.startswith(released)  # an interrupted stream released nothing wrong
    assert released + recoverer.flush() == expected
    return recoverer.outcomes


@PROPERTY
@given(adversarial_texts)
def test_streaming_equals_buffered_for_every_single_cut(text: str) -> None:
    expected, outcomes = recover(text, MAPPING.resolve)
    for i in range(len(text) + 1):
        recoverer = StreamRecoverer(MAPPING.resolve)
        assert recoverer.feed(text[:i]) + recoverer.feed(text[i:]) + recoverer.flush() == expected
        assert recoverer.outcomes == outcomes


@PROPERTY
@given(adversarial_texts, st.lists(st.integers(0, 10_000), max_size=30))
def test_streaming_equals_buffered_for_random_cuts(text: str, points: list[int]) -> None:
    expected, outcomes = recover(text, MAPPING.resolve)
    assert feed_checked(text, cuts(text, points), expected) == outcomes
    assert feed_checked(text, list(text), expected) == outcomes


def decode_pieces(data: bytes, points: list[int]) -> list[str]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    bounds = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    return [decoder.decode(data[a:b], final=b == len(data)) for a, b in itertools.pairwise(bounds)]


@PROPERTY
@given(adversarial_texts, st.lists(st.integers(0, 10_000), max_size=30))
def test_streaming_equals_buffered_for_utf8_byte_cuts(text: str, points: list[int]) -> None:
    expected, outcomes = recover(text, MAPPING.resolve)
    data = text.encode("utf-8")
    for i in range(len(data) + 1):
        pieces = decode_pieces(data, [i])
        assert "".join(pieces) == text
        recoverer = StreamRecoverer(MAPPING.resolve)
        assert stream(pieces, recoverer) == expected
        assert recoverer.outcomes == outcomes
    assert feed_checked(text, decode_pieces(data, points), expected) == outcomes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(alphabet=SAFE, min_size=1, max_size=8), st.sampled_from(VALID + LEFT_MASKED + NEAR)),
        max_size=8,
    ),
    st.lists(st.integers(0, 10_000), max_size=20),
    st.booleans(),
)
def test_recovery_matches_an_independent_oracle(parts: list[tuple[str, str]], points: list[int], as_json: bool) -> None:
    escape = json_string_escape if as_json else None
    text = "".join(filler + token for filler, token in parts)
    expected = ""
    want = Outcomes()
    for filler, token in parts:
        expected += filler
        if token in EXPANDS_TO:
            expected += escape(EXPANDS_TO[token]) if escape else EXPANDS_TO[token]
            want.exact += 1
        else:
            expected += token
            if token in LEFT_MASKED:
                want.left_masked += 1
            else:
                want.near_miss += 1
    assert recover(text, MAPPING.resolve, escape) == (expected, want)
    recoverer = StreamRecoverer(MAPPING.resolve, escape)
    assert stream(cuts(text, points), recoverer) == expected
    assert recoverer.outcomes == want


def test_every_near_miss_has_exactly_one_marker() -> None:
    """The oracle above counts one near miss per variant; this keeps the variants honest."""
    for variant in NEAR:
        assert len(re.findall("twpii", variant, re.IGNORECASE)) == 1
        assert PLACEHOLDER_RE.search(variant) is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="twpiTWPI x\u0130\u0131\u212a\u017f\ufb01\u0307", max_size=40))
def test_markers_are_counted_in_ascii_cases_only(text: str) -> None:
    """ASCII text is counted through ``str.lower``; other text through the pattern, since
    ``str.lower`` folds some non-ASCII letters (``İ``, the Kelvin sign) into ASCII ones."""
    assert _markers(text) == len(re.findall("twpii", text, re.IGNORECASE | re.ASCII))
    assert _markers("twpi\u0130") == 0 and _markers("TwPiI and twpii") == 2  # "\u0130".lower() is "i\u0307"
