"""PII detectors: each rule's values and lookalikes, overlaps, custom rules, validation, and properties."""

from __future__ import annotations

import ipaddress
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tollway.exceptions import TollwayError
from tollway.pii import detectors
from tollway.pii.detectors import (
    BUILTIN_KINDS,
    MAX_PATTERN_LEN,
    MAX_TERM_LEN,
    RULES_VERSION,
    CustomPattern,
    Detector,
    DetectorConfigError,
    Dictionary,
    Span,
    build_detector,
)

DETECTOR = build_detector(BUILTIN_KINDS)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def found(text: str, detector: Detector = DETECTOR) -> list[tuple[str, str]]:
    return [(span.kind, text[span.start : span.end]) for span in detector.find(text)]


def in_sentence(value: str) -> str:
    return f"Please check {value} before Friday."


# --- values each rule finds ---------------------------------------------------------------------

POSITIVES = {
    "email": [
        "john.doe@example.com",
        "j.o-h_n+tag@mail.example.co.uk",
        "X@EXAMPLE.ORG",
        "user%list@example.io",
        "first.last@sub-domain.example.com",
        "jürgen@müller.de",
        "ops@xn--bcher-kva.example",
    ],
    "phone": [
        "+1 (415) 555-0132",
        "+14155550132",
        "+1-415-555-0132",
        "+44 20 7946 0958",
        "+44 (0)20 7946 0958",
        "+49 30 123456",
        "+49 (0) 30 1234 5678",
        "+33 1 23 45 67 89",
        "+91 98765 43210",
        "+86 138 0013 8000",
        "(415) 555-0132",
        "(415)555-0132",
        "415-555-0132",
        "415.555.0132",
        "415 555 0132",
        "1-800-555-0199",
        "1 (800) 555-0199",
        "020 7946 0958",
        "07700 900123",
        "030 123456",
        "030 1234 5678",
        "(030) 123456",
        "089/123456",
        "0171 1234567",
        "01 23 45 67 89",
        "01.23.45.67.89",
        "06-12-34-56-78",
    ],
    "card": [
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "4111111111111111",
        "4012888888881881",
        "4222222222222",
        "5555555555554444",
        "5105 1051 0510 5100",
        "2223003122003222",
        "378282246310005",
        "3782 822463 10005",
        "371449635398431",
        "6011111111111117",
        "6011 0009 9013 9424",
        "30569309025904",
        "3056 930902 5904",
        "38520000023237",
        "3530111333300000",
        "3566002020360505",
        "6200000000000005",
    ],
    "iban": [
        "DE89 3704 0044 0532 0130 00",
        "DE89370400440532013000",
        "de89370400440532013000",
        "GB82 WEST 1234 5698 7654 32",
        "GB82WEST12345698765432",
        "FR14 2004 1010 0505 0001 3M02 606",
        "NL91ABNA0417164300",
        "BE68539007547034",
        "BE68 5390 0754 7034",
        "NO9386011117947",
        "NO93 8601 1117 947",
        "CH9300762011623852957",
        "MT84MALT011000012345MTLCAST001S",
    ],
    "ssn": ["123-45-6789", "001-01-0001", "665-99-9999", "899-12-3456", "667-01-0001"],
    "ipv4": ["192.168.1.1", "10.0.0.1", "255.255.255.255", "0.0.0.0", "8.8.8.8", "172.16.254.3"],
    "ipv6": [
        "2001:db8::8a2e:370:7334",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
        "2001:DB8:85A3::8A2E:370:7334",
        "::ffff:192.0.2.1",
        "fe80::1:2:3",
        "2001:db8::1",
        "::1:2:3",
        "2001:db8:1::",
    ],
}


@pytest.mark.parametrize(("kind", "value"), [(k, v) for k, values in POSITIVES.items() for v in values])
def test_each_rule_finds_its_values(kind: str, value: str) -> None:
    assert found(in_sentence(value)) == [(kind, value)]
    assert found(value) == [(kind, value)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mailto:jane@example.com", [("email", "jane@example.com")]),
        ("<jane@example.com>", [("email", "jane@example.com")]),
        ("(jane@example.com).", [("email", "jane@example.com")]),
        ("..jane@example.com", [("email", "jane@example.com")]),
        ("a..b@example.com", [("email", "b@example.com")]),
        ("https://deploy:s3cret@host.example.com/x", [("email", "s3cret@host.example.com")]),
        ("git@github.com:org/repo.git", [("email", "git@github.com")]),
        ("10.0.0.1:8080", [("ipv4", "10.0.0.1")]),
        ("10.0.0.0/8", [("ipv4", "10.0.0.0")]),
        ("[2001:db8::1]:443", [("ipv6", "2001:db8::1")]),
        ("IP:2001:db8::1:5 seen", [("ipv6", "2001:db8::1:5")]),
        ("fe80::1:2:3%eth0", [("ipv6", "fe80::1:2:3")]),
        ("+44 20 7946 0958 2 times", [("phone", "+44 20 7946 0958")]),
        ("+49 30 1234 5678 4111 1111 1111 1111", [("phone", "+49 30 1234 5678"), ("card", "4111 1111 1111 1111")]),
        ("030 123456 4111 1111 1111 1111", [("phone", "030 123456"), ("card", "4111 1111 1111 1111")]),
        ("card 4111 1111 1111 1111 2024", [("card", "4111 1111 1111 1111")]),
        ("BE68 5390 0754 7034 Bank", [("iban", "BE68 5390 0754 7034")]),
        ("BE68 5390 0754 7034 Banking", [("iban", "BE68 5390 0754 7034")]),
        ("NO93 8601 1117 947 ok", [("iban", "NO93 8601 1117 947")]),
        ("SSN: 123-45-6789.", [("ssn", "123-45-6789")]),
    ],
)
def test_values_at_the_edges_of_punctuation_ports_and_words(text: str, expected: list[tuple[str, str]]) -> None:
    assert found(text) == expected


# --- lookalikes no rule takes -------------------------------------------------------------------

NEGATIVES = {
    "luhn-invalid cards": ["4111 1111 1111 1112", "4111111111111112", "3782 822463 10006", "5555555555554445"],
    "cards without a network prefix": ["1700000000000", "20240105123045", "8000000000000002", "0000000000000000"],
    "too long for a card": ["41111111111111111113", "4111-1111-1111-1111-1111"],
    "wrong IBAN checksums": ["DE88 3704 0044 0532 0130 00", "GB82 WEST 1234 5698 7654 33", "NL92ABNA0417164300"],
    "wrong IBAN lengths or countries": [
        "DE89 3704 0044 0532 0130 0",
        "DE8937040044053201300",
        "XX89370400440532013000",
        "XDE89370400440532013000",
        "DE89 370400440532013000",
    ],
    "ssn invalid ranges": ["000-12-3456", "666-12-3456", "900-12-3456", "999-99-9999", "123-00-4567", "123-45-0000"],
    "ssn without dashes or with extra digits": ["123456789", "123-45-67890", "1123-45-6789", "123-45-6789-1"],
    "ipv4 lookalikes": ["999.1.1.1", "256.1.1.1", "1.2.3", "1.2.3.4.5", "010.1.1.1", "1.2.3.04", "v1.2.3.4"],
    "ipv6 lookalikes": [
        "::1",
        "fe80::1",
        "a::b",
        "x = a[1::2]",
        "std::vector",
        "Foo::Bar",
        "10:30:45",
        "00:1A:2B:3C:4D:5E",
        "de:ad:be:ef:00:11:22:33:44",
        "2001:db8::g",
    ],
    "dates and times": [
        "2024-01-05",
        "05.01.2024",
        "01/05/2024",
        "2024-01-05T10:20:30Z",
        "05.01.2024 1030",
        "2024/01/05 10:20",
        "the year 2024",
        "10:30",
    ],
    "version numbers": ["v1.2.3", "2.14.3", "10.0.19041.1234", "1.2.3-rc.1", "Python 3.11.7"],
    "order ids and plain numbers": [
        "order 12345678901",
        "ORD-2024-000123",
        "#48213",
        "1700000000",
        "1,234,567.89",
        "3.14159265358979",
        "0.5",
        "100-200-3000",
        "555-0132",
        "4155550132",
        "02079460958",
        "+1 2",
        "ISBN 978-3-16-148410-0",
        "ISBN 0-306-40615-2",
    ],
    "uuids": [
        "123e4567-e89b-12d3-a456-426614174000",
        "550e8400-e29b-41d4-a716-446655440000",
        "12345678-1234-1234-1234-123456789012",
    ],
    "hex hashes": [
        "d41d8cd98f00b204e9800998ecf8427e",
        "da39a3ee5e6b4b0d3255bfef95601890afd80709",
        "commit 9f2c1ab",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ],
    "email lookalikes": ["root@localhost", "@handle", "a@b", "user@.example.com", "user@example.c0m", "a @ b.com"],
}


@pytest.mark.parametrize("text", [t for texts in NEGATIVES.values() for t in texts])
def test_lookalikes_are_not_values(text: str) -> None:
    assert found(text) == []
    assert found(in_sentence(text)) == []


def test_a_luhn_valid_number_glued_to_letters_or_digits_is_not_a_card() -> None:
    for text in (
        "x4111111111111111",
        "4111111111111111x",
        "_4111111111111111",
        "4111111111111111.5",
        "1.4111111111111111",
    ):
        assert found(text) == [], text


def test_an_ip_literal_domain_is_not_an_address_but_its_ip_is_an_ip() -> None:
    assert found("john@[10.0.0.1]") == [("ipv4", "10.0.0.1")]


# --- several values, overlaps, unicode ----------------------------------------------------------


def test_several_and_repeated_values_in_one_text() -> None:
    text = (
        "Mail ann@example.com or bob@example.org, call +1 415 555 0132 or +1 415 555 0132 again; "
        "card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00, SSN 123-45-6789, "
        "hosts 10.0.0.1 and 10.0.0.1 and 2001:db8::8a2e:370:7334. ann@example.com"
    )
    assert found(text) == [
        ("email", "ann@example.com"),
        ("email", "bob@example.org"),
        ("phone", "+1 415 555 0132"),
        ("phone", "+1 415 555 0132"),
        ("card", "4111 1111 1111 1111"),
        ("iban", "DE89 3704 0044 0532 0130 00"),
        ("ssn", "123-45-6789"),
        ("ipv4", "10.0.0.1"),
        ("ipv4", "10.0.0.1"),
        ("ipv6", "2001:db8::8a2e:370:7334"),
        ("email", "ann@example.com"),
    ]


def test_adjacent_values_separated_by_one_character() -> None:
    assert found("10.0.0.1,10.0.0.2;a@example.com") == [
        ("ipv4", "10.0.0.1"),
        ("ipv4", "10.0.0.2"),
        ("email", "a@example.com"),
    ]


def test_an_address_inside_a_longer_address_loses_to_it() -> None:
    assert found("from ::ffff:192.0.2.1 today") == [("ipv6", "::ffff:192.0.2.1")]


def test_indices_are_str_indices_around_non_ascii_text() -> None:
    text = (
        "Grüße 🙂📞 — Zoë: +49 30 1234 5678, ✉ zoë@exämple.de "
        "\U0001d518\U0001d52b\U0001d526 4111 1111 1111 1111 ✓ DE89370400440532013000"
    )
    assert found(text) == [
        ("phone", "+49 30 1234 5678"),
        ("email", "zoë@exämple.de"),
        ("card", "4111 1111 1111 1111"),
        ("iban", "DE89370400440532013000"),
    ]
    for span in DETECTOR.find(text):
        assert text.index(text[span.start : span.end]) == span.start


def test_letters_glued_to_an_address_are_taken_in_rather_than_leaked() -> None:
    assert found("请联系john@example.com谢谢") == [("email", "请联系john@example.com谢谢")]


@pytest.mark.parametrize("text", ["", "plain words only, nothing else here", "no digits; no at sign, no colon"])
def test_text_without_candidates_has_no_spans(text: str) -> None:
    assert DETECTOR.find(text) == []


def test_spans_are_span_objects_with_offsets_and_kind() -> None:
    assert DETECTOR.find("ip 10.0.0.1") == [Span(3, 11, "ipv4")]


def test_only_the_enabled_kinds_are_found() -> None:
    text = "a@example.com 10.0.0.1 123-45-6789 +1 415 555 0132"
    assert found(text, build_detector(["ipv4", "ssn"])) == [("ipv4", "10.0.0.1"), ("ssn", "123-45-6789")]
    assert found(text, build_detector(["phone"])) == [("phone", "+1 415 555 0132")]
    assert found(text, build_detector(["iban"])) == []
    assert found(text, build_detector([])) == []
    assert build_detector(["ipv4", "ssn"]).kinds == frozenset({"ipv4", "ssn"})


# --- overlap resolution -------------------------------------------------------------------------


def test_a_builtin_rule_wins_an_equal_span_over_a_custom_pattern() -> None:
    detector = build_detector(BUILTIN_KINDS, custom=[CustomPattern("ssnlike", r"\d{3}-\d{2}-\d{4}")])
    assert found("id 123-45-6789", detector) == [("ssn", "123-45-6789")]


def test_a_longer_custom_span_wins_over_a_builtin_inside_it() -> None:
    detector = build_detector(BUILTIN_KINDS, custom=[CustomPattern("case", r"CASE 123-45-6789")])
    assert found("see CASE 123-45-6789 now", detector) == [("case", "CASE 123-45-6789")]


def test_of_equal_overlapping_spans_the_earlier_wins() -> None:
    detector = build_detector([], custom=[CustomPattern("second", "cdef"), CustomPattern("first", "abcd")])
    assert found("abcdef", detector) == [("first", "abcd")]


def test_the_longest_span_wins_and_spans_it_displaced_come_back() -> None:
    detector = build_detector(
        [],
        custom=[
            CustomPattern("a", "0123456789"),
            CustomPattern("b", "567"),
            CustomPattern("c", "9abcdefghijklmnopqrst"),
        ],
    )
    assert found("0123456789abcdefghijklmnopqrst", detector) == [("b", "567"), ("c", "9abcdefghijklmnopqrst")]


def test_an_email_wins_over_a_dictionary_term_inside_it() -> None:
    detector = build_detector(BUILTIN_KINDS, dictionaries=[Dictionary("names", ("john",))])
    assert found("write to john@example.com or john", detector) == [
        ("email", "john@example.com"),
        ("names", "john"),
    ]


# --- custom patterns and dictionaries -----------------------------------------------------------


def test_custom_patterns_find_every_match() -> None:
    detector = build_detector(["email"], custom=[CustomPattern("employee", r"EMP-[0-9]{6}")])
    assert found("EMP-000123 and EMP-999999, not EMP-12", detector) == [
        ("employee", "EMP-000123"),
        ("employee", "EMP-999999"),
    ]
    assert detector.kinds == frozenset({"email", "employee"})


def test_a_custom_pattern_that_matches_empty_only_in_context_never_yields_an_empty_span() -> None:
    detector = build_detector([], custom=[CustomPattern("lazy", r"(?<=#)x?")])
    assert found("#x and # and #", detector) == [("lazy", "x")]


def test_dictionary_terms_match_whole_words_case_insensitively() -> None:
    detector = build_detector([], dictionaries=[Dictionary("projects", ("Project Apollo", "Hermes"))])
    text = (
        "project apollo, PROJECT  APOLLO\nand Project\tApollo; hermes. ProjectApollo Project Apollos xHermes hermes_2"
    )
    assert found(text, detector) == [
        ("projects", "project apollo"),
        ("projects", "PROJECT  APOLLO"),
        ("projects", "Project\tApollo"),
        ("projects", "hermes"),
    ]


def test_dictionary_terms_at_the_edges_of_text_and_punctuation() -> None:
    detector = build_detector([], dictionaries=[Dictionary("names", ("Hermes",))])
    for text, start in (
        ("Hermes", 0),
        ("(Hermes)", 1),
        ("«Hermes»", 1),
        ("\nHermes.", 1),
        ('"Hermes"', 1),
        ("é Hermes", 2),
    ):
        assert detector.find(text) == [Span(start, start + 6, "names")], text


def test_case_sensitive_dictionaries_match_the_exact_case() -> None:
    detector = build_detector([], dictionaries=[Dictionary("codes", ("Apollo",), case_sensitive=True)])
    assert found("Apollo apollo APOLLO", detector) == [("codes", "Apollo")]


def test_the_longest_term_wins_at_one_start() -> None:
    detector = build_detector([], dictionaries=[Dictionary("places", ("New York", "New York City", "York"))])
    assert found("New York City and New York Cityscape and York", detector) == [
        ("places", "New York City"),
        ("places", "New York"),
        ("places", "York"),
    ]


def test_a_term_in_two_dictionaries_is_reported_under_the_first() -> None:
    detector = build_detector(
        [], dictionaries=[Dictionary("staff", ("Ada Lovelace",)), Dictionary("vip", ("ada lovelace", "Grace"))]
    )
    assert found("Ada Lovelace met Grace", detector) == [("staff", "Ada Lovelace"), ("vip", "Grace")]


def test_terms_with_punctuation_and_digits() -> None:
    detector = build_detector([], dictionaries=[Dictionary("tech", ("C++", "@acme", "R2-D2", "a.b"))])
    assert found("we use C++ at @acme with R2-D2 and a.b, not C++11 or xa.b", detector) == [
        ("tech", "C++"),
        ("tech", "@acme"),
        ("tech", "R2-D2"),
        ("tech", "a.b"),
    ]


def test_dictionary_offsets_survive_text_whose_lower_case_is_longer() -> None:
    text = "İstanbul office: Hermes, HERMES"
    assert len(text.lower()) != len(text)
    detector = build_detector([], dictionaries=[Dictionary("names", ("hermes",))])
    assert found(text, detector) == [("names", "Hermes"), ("names", "HERMES")]


def test_many_dictionary_terms_compile_into_one_detector() -> None:
    rng = random.Random(5)
    terms = tuple(sorted({"".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 9))) for _ in range(3000)}))
    detector = build_detector([], dictionaries=[Dictionary("words", terms)])
    text = " ".join(terms[::100])
    assert [text[s.start : s.end] for s in detector.find(text)] == list(terms[::100])


# --- configuration errors -----------------------------------------------------------------------

SECRET = "Zelda Quartermaine"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kinds": ["email", "passport"]}, "unknown PII kind 'passport'"),
        ({"kinds": "email"}, "not one string"),
        ({"custom": [CustomPattern("", "x")]}, "custom pattern #0: a name"),
        ({"custom": [CustomPattern("9lives", "x")]}, "custom pattern #0: a name"),
        ({"custom": [CustomPattern("email", "x")]}, "'email': the name is already"),
        ({"custom": [CustomPattern("a", "x"), CustomPattern("a", "y")]}, "'a': the name is already"),
        ({"custom": [CustomPattern("a", "")]}, "custom pattern 'a': a pattern is 1 to"),
        ({"custom": [CustomPattern("a", "x" * (MAX_PATTERN_LEN + 1))]}, "custom pattern 'a': a pattern is 1 to"),
        ({"custom": [CustomPattern("a", SECRET + "(")]}, "custom pattern 'a' does not compile"),
        ({"custom": [CustomPattern("a", "(" + SECRET + ")*")]}, "'a' can match the empty string"),
        ({"custom": [CustomPattern("a", r"\b")]}, "'a' can match the empty string"),
        ({"dictionaries": [Dictionary("d", ())]}, "dictionary 'd' has no terms"),
        ({"dictionaries": [Dictionary("d", (SECRET, "  "))]}, "dictionary 'd': term #1 is blank"),
        ({"dictionaries": [Dictionary("d", ("ok", SECRET * 20))]}, f"term #1 is longer than {MAX_TERM_LEN}"),
        ({"dictionaries": [Dictionary("d", SECRET)]}, "terms must be a tuple"),  # type: ignore[arg-type]
        ({"dictionaries": [Dictionary("d", (SECRET, 7))]}, "term #1 is not a string"),  # type: ignore[arg-type]
        ({"custom": [CustomPattern("x", "a")], "dictionaries": [Dictionary("x", ("b",))]}, "'x': the name is already"),
    ],
)
def test_bad_configuration_is_refused_without_echoing_terms_or_patterns(
    kwargs: dict[str, object], message: str
) -> None:
    kinds = kwargs.pop("kinds", BUILTIN_KINDS)
    with pytest.raises(DetectorConfigError) as caught:
        build_detector(kinds, **kwargs)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert SECRET not in str(caught.value)
    assert "Zelda" not in str(caught.value)


def test_config_errors_are_value_errors_in_the_one_tree() -> None:
    assert issubclass(DetectorConfigError, TollwayError)
    assert issubclass(DetectorConfigError, ValueError)


# --- versions -----------------------------------------------------------------------------------


def test_version_names_the_rules_and_a_digest_of_the_custom_rules() -> None:
    assert DETECTOR.version == RULES_VERSION == build_detector(["email"]).version
    base = build_detector(BUILTIN_KINDS, [CustomPattern("a", "x+")], [Dictionary("d", ("one", "two"))]).version
    assert base.startswith(RULES_VERSION + "+custom:")
    same = build_detector(["email"], [CustomPattern("a", "x+")], [Dictionary("d", ("two", "one"))]).version
    assert same == base
    variants = {
        build_detector(BUILTIN_KINDS, [CustomPattern("a", "x*y")], [Dictionary("d", ("one", "two"))]).version,
        build_detector(BUILTIN_KINDS, [CustomPattern("b", "x+")], [Dictionary("d", ("one", "two"))]).version,
        build_detector(BUILTIN_KINDS, [CustomPattern("a", "x+")], [Dictionary("d", ("one", "three"))]).version,
        build_detector(BUILTIN_KINDS, [CustomPattern("a", "x+")], [Dictionary("d", ("one", "two"), True)]).version,
        build_detector(BUILTIN_KINDS, [CustomPattern("a", "x+")], []).version,
    }
    assert base not in variants
    assert len(variants) == 5
    assert "one" not in base


def test_repr_shows_version_and_kinds_only() -> None:
    detector = build_detector(["email"], dictionaries=[Dictionary("names", (SECRET,))])
    assert SECRET not in repr(detector)
    assert "names" in repr(detector)


# --- properties ---------------------------------------------------------------------------------

MIXED = st.text(
    alphabet=st.sampled_from(
        [*"abcdefXYZ0123456789 .,;:-+()/@_\n\t[]%", "é", "ü", "🙂", "İ", "—", "\U0001d518", "\u00a0"]
    ),
    max_size=120,
)
FULL = build_detector(
    BUILTIN_KINDS,
    custom=[CustomPattern("hexword", r"[a-f]{3,}"), CustomPattern("pair", r"[0-9]{2}:[0-9]{2}")],
    dictionaries=[Dictionary("names", ("abc", "Zed", "fed cab")), Dictionary("codes", ("X1", "a.b"), True)],
)


@PROPERTY
@given(MIXED)
def test_spans_are_sorted_in_bounds_and_never_overlap(text: str) -> None:
    spans = FULL.find(text)
    previous_end = 0
    for span in spans:
        assert previous_end <= span.start < span.end <= len(text)
        assert span.kind in FULL.kinds
        previous_end = span.end


@PROPERTY
@given(MIXED)
def test_find_is_deterministic(text: str) -> None:
    assert FULL.find(text) == FULL.find(text) == FULL.find(str(text))


SURROUNDING = st.text(
    alphabet=st.sampled_from([*"abcdefghij XYZ,.;!?\n", "é", "Ω", "🙂", "—"]),
    max_size=40,
)


def embedded(left: str, value: str, right: str) -> tuple[str, int]:
    """``value`` between ``left`` and ``right``, set apart by whitespace; and where it starts."""
    text = left + " " + value + " " + right
    return text, len(left) + 1


def assert_covered(kind: str, left: str, value: str, right: str) -> None:
    text, start = embedded(left, value, right)
    assert Span(start, start + len(value), kind) in DETECTOR.find(text), (text, value)


def luhn_complete(digits: str) -> str:
    """``digits`` followed by the check digit that makes the whole number Luhn-valid."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return digits + str((10 - total % 10) % 10)


@given(st.text(alphabet="0123456789", min_size=1, max_size=40))
def test_the_luhn_check_agrees_with_its_definition(digits: str) -> None:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    assert detectors._luhn_ok(digits) is (total % 10 == 0)
    assert detectors._luhn_ok(luhn_complete(digits))


@given(st.text(alphabet="0123456789 .-()/+ab\u0663", max_size=40))
def test_digit_count_counts_ascii_digits_only(text: str) -> None:
    assert detectors._digit_count(text) == sum(ch in "0123456789" for ch in text)


CARD_PREFIXES = ["4", "51", "55", "2221", "2720", "34", "37", "36", "38", "6011", "65", "3528", "62", "22"]


@st.composite
def cards(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(CARD_PREFIXES))
    length = draw(st.sampled_from([13, 14, 15, 16, 17, 18, 19]))
    body = draw(st.text(alphabet="0123456789", min_size=length - 1 - len(prefix), max_size=length - 1 - len(prefix)))
    number = luhn_complete(prefix + body)
    if length == 16 and draw(st.booleans()):
        sep = draw(st.sampled_from([" ", "-"]))
        return sep.join(number[i : i + 4] for i in range(0, 16, 4))
    return number


@PROPERTY
@given(SURROUNDING, cards(), SURROUNDING)
def test_a_luhn_valid_card_is_found_exactly(left: str, card: str, right: str) -> None:
    assert_covered("card", left, card, right)


@PROPERTY
@given(SURROUNDING, cards(), SURROUNDING)
def test_a_card_with_a_wrong_check_digit_is_not_a_card(left: str, card: str, right: str) -> None:
    wrong = card[:-1] + str((int(card[-1]) + 1) % 10)
    text, _ = embedded(left, wrong, right)
    assert all(span.kind != "card" for span in DETECTOR.find(text))


IBAN_COUNTRIES = {"DE": 22, "GB": 22, "FR": 27, "NL": 18, "BE": 16, "NO": 15, "CH": 21, "MT": 31, "LC": 32, "RU": 33}


def iban_with_check_digits(country: str, bban: str) -> str:
    numeric = "".join(str(int(ch, 36)) for ch in bban + country + "00")
    return f"{country}{98 - int(numeric) % 97:02d}{bban}"


@st.composite
def ibans(draw: st.DrawFn) -> str:
    country = draw(st.sampled_from(sorted(IBAN_COUNTRIES)))
    size = IBAN_COUNTRIES[country] - 4
    bban = draw(st.text(alphabet="0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=size, max_size=size))
    iban = iban_with_check_digits(country, bban)
    if draw(st.booleans()):
        return " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
    return iban


@PROPERTY
@given(SURROUNDING, ibans(), SURROUNDING)
def test_a_valid_iban_from_a_random_bban_is_found_exactly(left: str, iban: str, right: str) -> None:
    assert_covered("iban", left, iban, right)


@PROPERTY
@given(SURROUNDING, ibans(), SURROUNDING, st.data())
def test_an_iban_with_one_digit_changed_is_not_an_iban(left: str, iban: str, right: str, data: st.DataObject) -> None:
    digits = [i for i, ch in enumerate(iban) if ch.isdigit() and i >= 2]
    i = data.draw(st.sampled_from(digits))
    changed = iban[:i] + str((int(iban[i]) + data.draw(st.integers(1, 9))) % 10) + iban[i + 1 :]
    text, _ = embedded(left, changed, right)
    assert all(span.kind != "iban" for span in DETECTOR.find(text))


@PROPERTY
@given(
    SURROUNDING,
    st.integers(1, 899).filter(lambda a: a != 666),
    st.integers(1, 99),
    st.integers(1, 9999),
    SURROUNDING,
)
def test_an_issuable_ssn_is_found_exactly(left: str, area: int, group: int, serial: int, right: str) -> None:
    assert_covered("ssn", left, f"{area:03d}-{group:02d}-{serial:04d}", right)


@PROPERTY
@given(SURROUNDING, st.lists(st.integers(0, 255), min_size=4, max_size=4), SURROUNDING)
def test_an_ipv4_address_is_found_exactly(left: str, octets: list[int], right: str) -> None:
    assert_covered("ipv4", left, ".".join(map(str, octets)), right)


@PROPERTY
@given(SURROUNDING, st.integers(0, 2**128 - 1), st.booleans(), SURROUNDING)
def test_an_ipv6_address_is_found_exactly(left: str, number: int, exploded: bool, right: str) -> None:
    address = ipaddress.IPv6Address(number)
    value = address.exploded if exploded else address.compressed
    assume(sum(1 for group in value.split(":") if group) + ("." in value) >= 3)
    assert_covered("ipv6", left, value, right)


@PROPERTY
@given(
    SURROUNDING,
    st.integers(200, 999),
    st.integers(200, 999),
    st.integers(0, 9999),
    st.sampled_from(["({a}) {e}-{s}", "{a}-{e}-{s}", "{a}.{e}.{s}", "+1 {a} {e} {s}", "1-{a}-{e}-{s}"]),
    SURROUNDING,
)
def test_a_north_american_number_is_found_exactly(
    left: str, area: int, exchange: int, subscriber: int, shape: str, right: str
) -> None:
    assert_covered("phone", left, shape.format(a=area, e=exchange, s=f"{subscriber:04d}"), right)


LOCAL = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789_%+-", min_size=1, max_size=20)
LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@PROPERTY
@given(SURROUNDING, st.lists(LOCAL, min_size=1, max_size=3), st.lists(LABEL, min_size=1, max_size=3), SURROUNDING)
def test_an_email_address_is_found_exactly(left: str, atoms: list[str], labels: list[str], right: str) -> None:
    value = ".".join(atoms) + "@" + ".".join(labels) + ".example"
    assert_covered("email", left, value, right)


# --- the shared numeric pattern ----------------------------------------------------------------

_OWN_START = r"(?<![\w+])(?<![0-9][.\-/])"
"""The start every numeric rule of ``tollway-rules-1`` was first written with, in each rule; the
shared pattern checks it once, in its guard."""
_FIRST_IPV4 = r"(?<![\w+.])(?<![0-9]-)" + rf"(?:{detectors._OCTET}\.){{3}}{detectors._OCTET}" + r"(?!\w|\.[0-9])"
"""The IPv4 rule as first written: its own start, and no shape check before the octets."""


def _with_own_starts(monkeypatch: pytest.MonkeyPatch, kinds: frozenset[str]) -> object:
    rules = {
        group: (kind, _FIRST_IPV4 if group == "ipv4" else _OWN_START + pattern, check)
        for group, (kind, pattern, check) in detectors._NUMERIC_RULES.items()
    }
    with monkeypatch.context() as patched:
        patched.setattr(detectors, "_NUMERIC_RULES", rules)
        return detectors._numeric_pattern(kinds)


NUMERIC_TEXT = st.lists(
    st.one_of(
        st.from_regex(r"[0-9]{1,5}", fullmatch=True),
        st.sampled_from([" ", ".", "-", "/", "(", ")", "+", "a", "_", "DE", "(0)", ":", "\n", "0"]),
    ),
    max_size=16,
).map("".join)
"""Digit runs between separators: the shapes the numeric rules look for, and their near misses."""
NUMERIC_EXAMPLES = [
    "a.1.2.3.4",
    " .10.0.0.1 ",
    "1.2.3.4.5",
    "5.415-555-0132",
    "7/415.555.0132",
    "x+1 415 555 0132",
    "_123-45-6789",
    "4-4111 1111 1111 1111",
    "v2.14.3 and 10.0.0.1:8080",
    "9-030 123456",
]


@PROPERTY
@given(st.lists(NUMERIC_TEXT, min_size=1, max_size=20), st.sampled_from(sorted(BUILTIN_KINDS)))
def test_the_shared_guard_matches_what_rules_with_their_own_starts_matched(texts: list[str], dropped: str) -> None:
    texts = texts + NUMERIC_EXAMPLES
    with pytest.MonkeyPatch.context() as monkeypatch:
        for kinds in (BUILTIN_KINDS, BUILTIN_KINDS - {dropped}):
            reference = _with_own_starts(monkeypatch, kinds)
            shared = detectors._numeric_pattern(kinds)
            assert reference is not None and shared is not None
            for text in texts:
                for pos in range(len(text) + 1):
                    a, b = reference.search(text, pos), shared.search(text, pos)  # type: ignore[attr-defined]
                    assert (a is None) == (b is None)
                    if a is not None and b is not None:
                        assert (a.span(), a.lastgroup) == (b.span(), b.lastgroup)
                        assert a.lastgroup is not None and a.span(a.lastgroup) == b.span(b.lastgroup)
