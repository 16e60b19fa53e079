"""Local PII detectors: pure functions that find personal data in prompt text before a provider sees it.

``build_detector(kinds, custom, dictionaries)`` compiles a ``Detector`` once, when a PII profile
is published; ``Detector.find(text)`` runs on every prompt of a PII alias. It does no I/O, keeps
no state between calls and never logs: a span carries offsets and a kind, never the value.
Offsets are ``str`` indices, so ``text[span.start:span.end]`` is the value even around non-ASCII
text.

Built-in rules (``RULES_VERSION`` names them as a whole; any change to what they match takes a
new version):

``email``
    A practical subset of RFC 5322: a dot-atom local part of letters, digits and ``._%+-`` (at
    most 64 characters, leading dots and anything before a ``..`` left out), ``@``, then dot
    separated labels and an alphabetic TLD of two or more letters. Letters may be non-ASCII, so
    internationalized addresses are covered, at the price of taking in letters glued to the
    address (``请联系john@example.com`` matches from ``请``). Not matched: quoted local parts,
    IP-literal domains (``a@[10.0.0.1]``), dotless domains (``root@localhost``), ``@handles``. In
    a URL with userinfo (``https://user:pw@host.example``) or an SSH remote (``git@host.example``)
    the part after the last ``:`` or ``/`` and the host match as an address: they are a login.
``phone``
    Three shapes, each needing separators or ``+``:

    * international: ``+``, a country code, then groups separated by one space, dot or dash, one
      optional parenthesised group (``+1 (415) 555-0132``, ``+44 (0)20 7946 0958``), 8 to 15
      digits in all not counting a ``(0)`` (``+14155550132``, ``+33 1 23 45 67 89``);
    * North American: ``(415) 555-0132``, ``415-555-0132``, ``415.555.0132``, ``1-800-555-0199``
      (area code and exchange start with 2-9);
    * national with a trunk ``0``: ``020 7946 0958``, ``030 123456``, ``089/123456``,
      ``(030) 123456``, ``01 23 45 67 89``, ``06-12-34-56-78``: 9 to 12 digits, a separator after
      the area code, later groups of two or more digits.

    Not matched, deliberately: bare digit runs without ``+`` (``4155550132``, ``02079460958``:
    indistinguishable from order ids and timestamps), 7-digit local numbers (``555-0132``: looks
    like a range), ``00`` international prefixes, numbers in non-ASCII digits, and shapes that
    start with a date (``05.01.2024 1030``). Years, ISO dates, times and version strings never
    take a phone shape. A trailing single digit is left out (``+44 20 7946 0958 2``), and groups
    written right after a number end it where its digit count runs out, so a card number after a
    phone number is found as a card.
``card``
    13 to 19 digits, bare or grouped 4-4-4-4(-1..3), 4-6-5 or 4-6-4 with one kind of separator
    (space or dash), Luhn-valid, starting with the prefix of a payment network in use (``22``-``27``
    or ``3``-``6``: Mir, Mastercard, Amex, Diners, JCB, Visa, Maestro, Discover, UnionPay). The
    prefix rule keeps out millisecond epoch timestamps and ``yyyymmdd…`` stamps; one in ten random
    numbers passes Luhn, so a 13-19 digit order id with such a prefix can still match. A further
    group after a space is not part of it (``4111 1111 1111 1111 2024`` matches the first 16).
``iban``
    A country code from the registry table below, two check digits and the BBAN, either compact
    (``DE89370400440532013000``) or printed in groups of four separated by single spaces, with the
    exact length for its country and a valid ISO 7064 mod-97 checksum. Letters in either case.
    Countries not in the table are not matched, nor a mix of the two forms. An IBAN-shaped run
    that fails its checksum yields nothing, not a phone number from its groups.
``ssn``
    US ``AAA-GG-SSSS`` with the dashes; area 000, 666 and 900-999, group 00 and serial 0000 are
    never issued and not matched. Nine bare digits are too ambiguous (order ids, phone numbers)
    and are not matched.
``ipv4``
    Dotted quad, each octet 0-255 without leading zeros (``010.0.0.1`` could be octal and is not
    matched), not inside a longer dotted number (``1.2.3.4.5``) or word. A port or prefix length
    after it stays outside the span (``10.0.0.1:8080``, ``10.0.0.0/8``). A four-part version
    string (``1.2.3.4``) is a valid address and matches.
``ipv6``
    Full, compressed and IPv4-suffixed forms (``2001:db8::8a2e:370:7334``, ``::ffff:192.0.2.1``),
    validated by ``ipaddress``. At least three groups are required, so ``::1``, ``fe80::1`` and
    lookalikes such as Python slices (``a[1::2]``) and C++ scopes (``A::B``) are not matched; nor
    is a zone suffix (``%eth0``) part of the span.

Digits are ASCII digits throughout, and every numeric value must stand alone: not preceded by a
letter, digit, underscore or ``+`` (or a digit and a ``.``, ``-`` or ``/``), and not followed by
a letter, digit or underscore (or a ``.``, ``-`` or ``/`` and a digit). So hex hashes, UUIDs,
decimals and dotted or dashed ids never yield a value from their middle.

Custom rules: a ``CustomPattern`` is a regular expression compiled once; a ``Dictionary`` is a
list of literal terms matched as whole words (not preceded or followed by a letter, digit or
underscore), case-insensitively (by ``str.lower``) unless ``case_sensitive``, where a run of
whitespace in a term matches any run of whitespace. A term listed in two dictionaries of the same
case sensitivity is reported under the first.

Overlaps: ``find`` returns spans sorted by start, never overlapping. Of two overlapping candidate
spans the longer wins; at equal length the earlier; at the same place, the rule listed first
(``email``, ``phone``, ``card``, ``iban``, ``ssn``, ``ipv4``, ``ipv6``, then custom patterns, then
dictionaries, each in the order given).

Why it is fast: every built-in rule sits behind a check that costs a fraction of a microsecond
(``"@" in text``, any ASCII digit, ``":"`` followed by a hex digit). All numeric rules share one
compiled pattern whose first character is a digit, ``+`` or ``(``, so the regex engine skips to
candidates in C and tries the rules in lookarounds there; checksums run only on the few shapes
that match. A dictionary is one trie-shaped pattern per case sensitivity, tried only where a word
starts. ``python -m bench.pii_detect`` measures it.

``Detector.version`` is ``RULES_VERSION``, plus ``+custom:`` and a digest of the custom patterns
and dictionaries when there are any, so audit metadata records exactly which rules ran (the
enabled kinds are ``Detector.kinds``). The digest is not a secret-keeping transformation: a
dictionary of one short term can be confirmed by guessing it, like any configuration digest.
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from tollway.exceptions import TollwayError

__all__ = [
    "BUILTIN_KINDS",
    "RULES_VERSION",
    "CustomPattern",
    "Detector",
    "DetectorConfigError",
    "Dictionary",
    "Span",
    "build_detector",
]

RULES_VERSION = "tollway-rules-1"

_KIND_ORDER = ("email", "phone", "card", "iban", "ssn", "ipv4", "ipv6")
BUILTIN_KINDS = frozenset(_KIND_ORDER)
_PRIORITY = {kind: i for i, kind in enumerate(_KIND_ORDER)}

MAX_PATTERN_LEN = 1000
MAX_TERM_LEN = 200
MAX_TERMS = 100_000
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


class Span(NamedTuple):
    """One detected value: ``text[start:end]``, of ``kind`` (a built-in kind or a custom name).

    A named tuple, not a frozen dataclass: it is made for every value of every prompt, in 0.2 µs
    where a frozen dataclass took 0.36, and unpacks as ``start, end, kind``."""

    start: int
    end: int
    kind: str


@dataclass(frozen=True, slots=True)
class CustomPattern:
    """A named regular expression, compiled once.

    It must compile, be at most ``MAX_PATTERN_LEN`` characters, and not match the empty string
    (checked on a few probe texts; an empty match that still happens while scanning is skipped).
    Its cost is the pattern's own: ``re`` backtracks, so nested unbounded repeats can be slow.
    """

    name: str
    pattern: str


@dataclass(frozen=True, slots=True)
class Dictionary:
    """Named literal terms, matched as whole words; case-insensitive unless ``case_sensitive``."""

    name: str
    terms: tuple[str, ...]
    case_sensitive: bool = False


class DetectorConfigError(TollwayError, ValueError):
    """A PII profile's detector configuration is invalid.

    The message names the kind, pattern or dictionary (and a term's position), never a term or
    a pattern's text: both may be personal data themselves.
    """


_Candidate = tuple[int, int, int, str]
"""(start, end, priority, kind): priority breaks ties between equal spans, lower first."""

# --- numeric rules ------------------------------------------------------------------------------

# Every numeric rule starts where a value may stand alone: not after a letter, digit, underscore or
# "+", nor after a digit and a ".", "-" or "/". That start is checked once, by the guard of the
# pattern they share (``_numeric_pattern``), so the rules below leave it out: within that pattern,
# repeating it in each rule decided nothing and cost two lookbehinds per rule at every candidate
# (with the IPv4 shape check below, the numeric scan of the 2 KB bench prompt went from 15.1 to
# 13.9 µs; a fuzz test checks the pattern matches what the rules with their own starts matched).
_NUM_END = r"(?!\w|[.\-/][0-9])"

_SSN = r"(?!000|666|9)[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}" + _NUM_END
_CARD_GROUPED = r"[0-9]{{4}}{0}(?:[0-9]{{4}}{0}[0-9]{{4}}{0}[0-9]{{4}}(?:{0}[0-9]{{1,3}})?|[0-9]{{6}}{0}[0-9]{{4,5}})"
_CARD = (
    r"(?=2[2-7]|[3-6])(?:[0-9]{13,19}|" + _CARD_GROUPED.format(" ") + "|" + _CARD_GROUPED.format("-") + ")" + _NUM_END
)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = (
    # Not after a "." either (``1.2.3.4.5``); the shape first (four dotted runs of 1-3 digits), so
    # a version such as ``2.14.3`` fails in a few steps, before the octet ranges backtrack.
    r"(?<!\.)(?=(?:[0-9]{1,3}\.){3}[0-9])" + rf"(?:{_OCTET}\.){{3}}{_OCTET}" + r"(?!\w|\.[0-9])"
)
_NANP = r"(?:1[ .\-]?)?(?:\([2-9][0-9]{2}\)[ .\-]?|[2-9][0-9]{2}[ .\-])[2-9][0-9]{2}[ .\-][0-9]{4}" + _NUM_END
_TRUNK = (
    r"(?:\(0[1-9][0-9]{0,4}\)[ ./\-]?|0[1-9][0-9]{0,4}+[ ./\-])"
    r"[0-9]{2,}+(?:[ ./\-][0-9]{2,}+){0,3}+" + _NUM_END
)
_INTL = r"\+[1-9][0-9]*+(?:[ .\-]?\([0-9]{1,4}\))?(?:[ .\-]?[0-9]++)?(?:[ .\-][0-9]{2,}+)*+" + _NUM_END
_IBAN = (
    r"(?<!\w)[A-Za-z]{2}[0-9]{2}"
    r"(?:[A-Za-z0-9]{11,30}|(?: [A-Za-z0-9]{4}){2,7}(?: [A-Za-z0-9]{1,3})?)(?!\w)"
)

_DATE_HEAD = re.compile(r"[0-3]?[0-9]([./\-])[0-3]?[0-9]\1(?:19|20)[0-9]{2}(?![0-9])")
_INTL_TRUNK = "(0)"

# From the SWIFT IBAN registry: the full length of an IBAN per country.
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip
_IBAN_DIGITS = str.maketrans({chr(c): str(c - 55) for c in range(ord("A"), ord("Z") + 1)})
_DOUBLED = str.maketrans("0123456789", "0246813579")
"""A digit to the digit sum of its double, for Luhn."""
_NON_DIGIT_BYTES = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)


def _luhn_ok(digits: str) -> bool:
    """The Luhn check of ASCII ``digits``: every second digit from the right doubled. Sums of byte
    values in C (each digit counts its code, 48 more than its value), about twice as fast as a loop."""
    backwards = digits[::-1]
    total = sum(backwards[0::2].encode()) + sum(backwards[1::2].translate(_DOUBLED).encode())
    return (total - 48 * len(digits)) % 10 == 0


def _check_card(text: str, start: int, end: int) -> int:
    # A card's pattern allows only one kind of separator: a space or a dash.
    return end if _luhn_ok(text[start:end].replace(" ", "").replace("-", "")) else -1


def _accept(text: str, start: int, end: int) -> int:
    """For rules whose pattern already says everything (ranges, separators, digit counts)."""
    return end


def _digit_count(value: str) -> int:
    """How many ASCII digits ``value`` has (a non-ASCII character is no ASCII digit)."""
    return len(value.encode("ascii", "ignore").translate(None, _NON_DIGIT_BYTES))


def _trim_groups(text: str, start: int, end: int, most: int) -> int:
    """The end after dropping trailing groups until at most ``most`` digits remain.

    Possessive groups take in a number written right after a phone number (``+49 30 1234 5678
    4111 1111 1111 1111``); the phone number ends where its digits run out, and the rest is
    scanned again.
    """
    while _digit_count(text[start:end]) > most:
        cut = max(text.rfind(sep, start, end) for sep in " .-/")
        if cut <= start:
            return -1
        end = cut
    return end


def _check_trunk(text: str, start: int, end: int) -> int:
    end = _trim_groups(text, start, end, 12)
    if end < 0 or _digit_count(text[start:end]) < 9:
        return -1
    return -1 if _DATE_HEAD.match(text, start, end) else end


def _check_intl(text: str, start: int, end: int) -> int:
    trunk = 1 if _INTL_TRUNK in text[start:end] else 0
    end = _trim_groups(text, start, end, 15 + trunk)
    if end < 0 or _digit_count(text[start:end]) - trunk < 8:
        return -1
    return end


def _check_iban(text: str, start: int, end: int) -> int:
    """The end of a valid IBAN at ``start``, or -1.

    The pattern may take in a short word printed after a spaced IBAN (``BE68 5390 0754 7034
    Bank``): the country's length decides where the IBAN ends, which must be a group boundary.
    """
    value = text[start:end]
    compact = value.replace(" ", "").upper()
    length = _IBAN_LENGTHS.get(compact[:2])
    if length is None or len(compact) < length:
        return -1
    if " " in value:
        cut = length + (length - 1) // 4
        if cut < len(value) and value[cut] != " ":
            return -1
        end = start + cut
    elif len(compact) != length:
        return -1
    iban = compact[:length]
    if not iban.isalnum() or int((iban[4:] + iban[:4]).translate(_IBAN_DIGITS)) % 97 != 1:
        return -1
    return end


_NUMERIC_RULES: dict[str, tuple[str, str, Callable[[str, int, int], int]]] = {
    # group name: (kind, pattern, check returning the accepted end or -1)
    "ssn": ("ssn", _SSN, _accept),
    "card": ("card", _CARD, _check_card),
    "ipv4": ("ipv4", _IPV4, _accept),
    "nanp": ("phone", _NANP, _accept),
    "trunk": ("phone", _TRUNK, _check_trunk),
    "intl": ("phone", _INTL, _check_intl),
    "iban": ("iban", _IBAN, _check_iban),
}


def _numeric_pattern(kinds: frozenset[str]) -> re.Pattern[str] | None:
    """One pattern for every enabled numeric rule, tried where a value can start.

    The pattern starts with a character class, so ``re`` skips to a digit, ``+`` or ``(`` in C.
    There shared guards turn away, in a few cheap steps, what cannot start a value (a digit after
    a digit or a letter, a short number such as ``3``, ``2024`` or ``10:30``); only the few
    positions left try the rules, as one lookbehind of the first character wrapping a lookahead
    that captures the whole value in its rule's group. An IBAN is tried at its first check digit,
    after the two letters of its country code. One scan, however many rules.
    """
    rules = [
        f"(?P<{group}>{pattern})"
        for group, (kind, pattern, _) in _NUMERIC_RULES.items()
        if kind in kinds and group != "iban"
    ]
    alternatives = []
    if rules:
        alternatives.append(r"(?<![\w+].)(?<![0-9][.\-/].)(?=[0-9 .()/\-]{6})(?<=(?=" + "|".join(rules) + ").)")
    if "iban" in kinds:
        alternatives.append(r"(?<=[A-Za-z]{2}[0-9])(?<=(?=(?P<iban>" + _IBAN + r"))[A-Za-z]{2}.)")
    if not alternatives:
        return None
    first = "[0-9+(]" if "phone" in kinds else "[0-9]"
    return re.compile(first + r"(?<![0-9][0-9])(?:" + "|".join(alternatives) + ")")


# --- email --------------------------------------------------------------------------------------

_LOCAL_ASCII_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-"
_LOCAL_ASCII = frozenset(_LOCAL_ASCII_CHARS)
_MAX_LOCAL = 64
_DOMAIN = re.compile(r"(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+[^\W\d_]{2,63}(?![\w-])")


def _local_char(ch: str) -> bool:
    return ch in _LOCAL_ASCII or (ch > "\x7f" and ch.isalnum())


def _find_emails(text: str, out: list[_Candidate]) -> None:
    """Anchor on each ``@``: walk left over the local part, then match the domain after it."""
    at = text.find("@")
    while at != -1:
        floor = max(0, at - _MAX_LOCAL)
        # The ASCII run before the "@" in one C call (``rstrip``), then, only where it stops at a
        # non-ASCII letter or digit, the walk goes on one character at a time.
        start = floor + len(text[floor:at].rstrip(_LOCAL_ASCII_CHARS))
        while start > floor and _local_char(text[start - 1]):
            start -= 1
        if start == floor and start > 0 and _local_char(text[start - 1]):
            at = text.find("@", at + 1)
            continue
        double = text.rfind("..", start, at)
        if double != -1:
            start = double + 2
        while start < at and text[start] == ".":
            start += 1
        domain = _DOMAIN.match(text, at + 1) if start < at else None
        if domain is not None and domain.end() - at - 1 <= 253:
            out.append((start, domain.end(), _PRIORITY["email"], "email"))
            at = text.find("@", domain.end())
        else:
            at = text.find("@", at + 1)


# --- ipv6 ---------------------------------------------------------------------------------------

_HEX_COLON = frozenset("0123456789abcdefABCDEF:")
_V6_COLON = re.compile(r":(?=[0-9A-Fa-f]{0,4}:)")
_V6_BODY = re.compile(r"[0-9A-Fa-f:]+(?:\.[0-9]+)*")
_V6_MIN_GROUPS = 3
_V6_MAX_LEN = 45


def _find_ipv6(text: str, out: list[_Candidate]) -> None:
    """Anchor on a colon that has a second colon at most four hex digits later; validate the run around it.

    A single colon before the run is a label (``IP:2001:db8::1``), not part of the address.
    """
    pos = 0
    while (colon := _V6_COLON.search(text, pos)) is not None:
        start = colon.start()
        while start > pos and text[start - 1] in _HEX_COLON:
            start -= 1
        body = _V6_BODY.match(text, start)
        assert body is not None
        end = pos = body.end()
        if text.startswith(":", start) and not text.startswith("::", start):
            start += 1
        if start > 0 and (text[start - 1] in "._" or text[start - 1].isalnum()):
            continue
        if text.endswith(":", 0, end) and not text.endswith("::", 0, end):
            end -= 1
        if end < len(text) and (text[end].isalnum() or text[end] == "_"):
            continue
        value = text[start:end]
        if len(value) > _V6_MAX_LEN or value.count(":") < 2:
            continue
        if sum(1 for group in value.split(":") if group) + ("." in value) < _V6_MIN_GROUPS:
            continue
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            continue
        out.append((start, end, _PRIORITY["ipv6"], "ipv6"))


# --- dictionaries -------------------------------------------------------------------------------


def _normalise_term(term: str) -> str:
    return " ".join(term.split())


_Trie: TypeAlias = dict[str, "_Trie"]


def _trie_pattern(terms: Iterable[str]) -> str:
    """A regex that matches exactly ``terms``, shaped as a trie so ``re`` branches once per character.

    An alternation of 1000 literals costs ``re`` a test per literal at every candidate position;
    a trie costs one branch per character. Where a term ends inside a longer one, the longer is
    tried first, so the longest whole-word term wins at a given start. A space in a term matches
    any run of whitespace.
    """
    root: _Trie = {}
    for term in terms:
        node = root
        for ch in term:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: _Trie) -> str:
        branches = [(r"\s+" if ch == " " else re.escape(ch)) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return "(?:" + body + ")?" if "" in node else body

    return emit(root)


@dataclass(frozen=True, slots=True)
class _TermSet:
    """Dictionaries of one case sensitivity, compiled into one trie.

    ``spaced`` finds terms after a space (a literal prefix: ``re`` skips to spaces in C);
    ``other`` after any other non-word character; ``head`` at the start of the text.
    """

    case_sensitive: bool
    owners: dict[str, tuple[int, str]]
    spaced: re.Pattern[str]
    other: re.Pattern[str]
    head: re.Pattern[str]
    fallback: re.Pattern[str] | None

    @classmethod
    def build(cls, owners: dict[str, tuple[int, str]], case_sensitive: bool) -> _TermSet:
        trie = "(?:" + _trie_pattern(owners) + r")(?!\w)"
        # Where a word starts, one character class turns away the words no term starts with
        # before the trie's branches are tried.
        starts = "(?=[" + "".join(sorted({re.escape(term[0]) for term in owners})) + "])"
        fallback = None if case_sensitive else re.compile(r"(?<!\w)" + trie, re.IGNORECASE)
        return cls(
            case_sensitive=case_sensitive,
            owners=owners,
            spaced=re.compile(" " + starts + trie),
            other=re.compile(r"[^ 0-9A-Za-z_](?<!\w)" + starts + trie),
            head=re.compile(trie),
            fallback=fallback,
        )

    def find(self, text: str, lowered: str | None, out: list[_Candidate]) -> None:
        if not self.case_sensitive:
            if lowered is None:
                self._find_fallback(text, out)
                return
            haystack = lowered
        else:
            haystack = text
        owners = self.owners
        head = self.head.match(haystack)
        if head is not None and (owner := owners.get(_normalise_term(head.group()))) is not None:
            out.append((0, head.end(), owner[0], owner[1]))
        for pattern in (self.spaced, self.other):
            for m in pattern.finditer(haystack):
                start = m.start() + 1
                if (owner := owners.get(_normalise_term(haystack[start : m.end()]))) is not None:
                    out.append((start, m.end(), owner[0], owner[1]))

    def _find_fallback(self, text: str, out: list[_Candidate]) -> None:
        """Case-insensitive search on the text itself, for the rare text whose lower-casing changes its length."""
        assert self.fallback is not None
        for m in self.fallback.finditer(text):
            owner = self.owners.get(_normalise_term(m.group().lower()))
            if owner is not None:
                out.append((m.start(), m.end(), owner[0], owner[1]))


# --- detector -----------------------------------------------------------------------------------


_span = tuple.__new__
"""``_span(Span, (start, end, kind))`` is ``Span(start, end, kind)`` without the named tuple's Python
``__new__`` (five spans: 0.83 µs, where calling ``Span`` took 1.28)."""


def _resolve(candidates: list[_Candidate]) -> list[Span]:
    """Non-overlapping spans in start order.

    Of overlapping candidates the longer wins, then the earlier, then the lower priority. Chosen
    longest first, so a span that lost only to a span that lost in turn is kept.
    """
    candidates.sort()
    previous_end = -1
    for start, end, _, _ in candidates:
        if start < previous_end:
            break
        previous_end = end
    else:
        return [_span(Span, (start, end, kind)) for start, end, _, kind in candidates]
    starts: list[int] = []
    kept: list[_Candidate] = []
    for candidate in sorted(candidates, key=lambda c: (c[0] - c[1], c[0], c[2])):
        start, end = candidate[0], candidate[1]
        i = bisect.bisect_right(starts, start)
        if (i > 0 and kept[i - 1][1] > start) or (i < len(kept) and kept[i][0] < end):
            continue
        starts.insert(i, start)
        kept.insert(i, candidate)
    return [_span(Span, (start, end, kind)) for start, end, _, kind in kept]


def _has_ascii_digit(text: str) -> bool:
    """Ten ``memchr`` scans: 0.5 µs on 2 KB without a digit, where ``re.search("[0-9]")``, which
    tests one character at a time, takes 7.7."""
    return any(d in text for d in "0123456789")


class Detector:
    """A compiled set of PII rules. Build one with ``build_detector``; ``find`` is pure and thread-safe."""

    __slots__ = ("_custom", "_email", "_ipv6", "_numeric", "_term_sets", "kinds", "version")

    version: str
    kinds: frozenset[str]

    def __init__(
        self,
        version: str,
        kinds: frozenset[str],
        builtin: frozenset[str],
        custom: Sequence[tuple[int, str, re.Pattern[str]]],
        term_sets: Sequence[_TermSet],
    ) -> None:
        self.version = version
        self.kinds = kinds
        self._email = "email" in builtin
        self._ipv6 = "ipv6" in builtin
        self._numeric = _numeric_pattern(builtin)
        self._custom = tuple(custom)
        self._term_sets = tuple(term_sets)

    def __repr__(self) -> str:
        return f"Detector(version={self.version!r}, kinds={sorted(self.kinds)!r})"

    def find(self, text: str) -> list[Span]:
        """The PII spans of ``text``, sorted by start and never overlapping (see the module docstring)."""
        if not text:
            return []
        out: list[_Candidate] = []
        if self._email and "@" in text:
            _find_emails(text, out)
        if self._numeric is not None and _has_ascii_digit(text):
            self._find_numeric(text, out)
        if self._ipv6 and ":" in text:
            _find_ipv6(text, out)
        for priority, kind, pattern in self._custom:
            for m in pattern.finditer(text):
                if m.end() > m.start():
                    out.append((m.start(), m.end(), priority, kind))
        if self._term_sets:
            lowered = text.lower()
            for term_set in self._term_sets:
                term_set.find(text, lowered if len(lowered) == len(text) else None, out)
        return _resolve(out) if out else []

    def _find_numeric(self, text: str, out: list[_Candidate]) -> None:
        assert self._numeric is not None
        search = self._numeric.search
        pos = 0
        while (m := search(text, pos)) is not None:
            group = m.lastgroup
            assert group is not None
            kind, _, check = _NUMERIC_RULES[group]
            start, candidate_end = m.span(group)
            end = check(text, start, candidate_end)
            if end > 0:
                out.append((start, end, _PRIORITY[kind], kind))
                pos = max(end, m.end())
            elif kind == "iban":
                # An IBAN-shaped run that fails its checksum is no phone or card number inside.
                pos = candidate_end
            else:
                pos = m.end()


# --- configuration ------------------------------------------------------------------------------


def _check_name(what: str, index: int, name: object, taken: set[str]) -> str:
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise DetectorConfigError(
            f"{what} #{index}: a name is 1-40 ASCII letters, digits, '_' or '-', starting with a letter"
        )
    if name in BUILTIN_KINDS or name in taken:
        raise DetectorConfigError(f"{what} {name!r}: the name is already a kind of this detector")
    taken.add(name)
    return name


_EMPTY_PROBES = ("", " ", "a", "0", "\n", "a b", "0.a-_")


def _compile_custom(index: int, custom: CustomPattern, taken: set[str]) -> re.Pattern[str]:
    name = _check_name("custom pattern", index, custom.name, taken)
    pattern = custom.pattern
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN_LEN:
        raise DetectorConfigError(f"custom pattern {name!r}: a pattern is 1 to {MAX_PATTERN_LEN} characters")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        raise DetectorConfigError(f"custom pattern {name!r} does not compile: {exc.msg}{where}") from None
    if any(m.start() == m.end() for probe in _EMPTY_PROBES for m in compiled.finditer(probe)):
        raise DetectorConfigError(f"custom pattern {name!r} can match the empty string")
    return compiled


def _dictionary_terms(index: int, dictionary: Dictionary, taken: set[str]) -> tuple[str, list[str]]:
    name = _check_name("dictionary", index, dictionary.name, taken)
    terms = dictionary.terms
    if isinstance(terms, str) or not isinstance(terms, tuple | list):
        raise DetectorConfigError(f"dictionary {name!r}: terms must be a tuple of strings")
    if not terms:
        raise DetectorConfigError(f"dictionary {name!r} has no terms")
    if len(terms) > MAX_TERMS:
        raise DetectorConfigError(f"dictionary {name!r} has more than {MAX_TERMS} terms")
    normalised = []
    for position, term in enumerate(terms):
        if not isinstance(term, str):
            raise DetectorConfigError(f"dictionary {name!r}: term #{position} is not a string")
        term = _normalise_term(term if dictionary.case_sensitive else term.lower())
        if not term:
            raise DetectorConfigError(f"dictionary {name!r}: term #{position} is blank")
        if len(term) > MAX_TERM_LEN:
            raise DetectorConfigError(f"dictionary {name!r}: term #{position} is longer than {MAX_TERM_LEN} characters")
        normalised.append(term)
    return name, normalised


def _digest(custom: Sequence[CustomPattern], dictionaries: Sequence[tuple[str, bool, list[str]]]) -> str:
    document = {
        "custom": [[c.name, c.pattern] for c in custom],
        "dictionaries": [[name, case_sensitive, sorted(set(terms))] for name, case_sensitive, terms in dictionaries],
    }
    encoded = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()[:16]


def build_detector(
    kinds: Iterable[str],
    custom: Sequence[CustomPattern] = (),
    dictionaries: Sequence[Dictionary] = (),
) -> Detector:
    """Compile a detector for the built-in ``kinds`` plus custom patterns and dictionaries.

    Raises ``DetectorConfigError`` for an unknown kind, a bad name, a pattern that does not
    compile or can match the empty string, or a dictionary term that is blank or too long.
    """
    if isinstance(kinds, str):
        raise DetectorConfigError("kinds must be a collection of kind names, not one string")
    builtin = set()
    for kind in kinds:
        if kind not in BUILTIN_KINDS:
            shown = repr(kind)[:42] if isinstance(kind, str) else type(kind).__name__
            raise DetectorConfigError(
                f"unknown PII kind {shown}; the built-in kinds are {', '.join(sorted(BUILTIN_KINDS))}"
            )
        builtin.add(kind)
    taken: set[str] = set()
    priority = len(_KIND_ORDER)
    compiled: list[tuple[int, str, re.Pattern[str]]] = []
    for index, pattern in enumerate(custom):
        compiled.append((priority, pattern.name, _compile_custom(index, pattern, taken)))
        priority += 1
    listed: list[tuple[str, bool, list[str]]] = []
    owners: dict[bool, dict[str, tuple[int, str]]] = {False: {}, True: {}}
    for index, dictionary in enumerate(dictionaries):
        name, terms = _dictionary_terms(index, dictionary, taken)
        listed.append((name, dictionary.case_sensitive, terms))
        for term in terms:
            owners[dictionary.case_sensitive].setdefault(term, (priority, name))
        priority += 1
    term_sets = [_TermSet.build(terms, case_sensitive) for case_sensitive, terms in owners.items() if terms]
    version = RULES_VERSION
    if custom or dictionaries:
        version += "+custom:" + _digest(custom, listed)
    return Detector(version, frozenset(builtin) | taken, frozenset(builtin), compiled, term_sets)
