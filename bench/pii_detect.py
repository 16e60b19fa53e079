"""Microbenchmark for the local PII detectors (``tollway.pii.detectors``) on the hot path.

``python -m bench.pii_detect [--runs 21] [--calls 1000] [--no-presidio]`` scans 2 KB prompts with
three detectors, the default kinds (every built-in rule), the same plus a 1000-term dictionary, and
``presidio`` (``engine: presidio``: the default kinds plus ``person`` and ``location`` through
Presidio and spaCy's small English model, ``tollway.pii.presidio``; left out, with a note, when the
``presidio`` extra is not installed), and prints the median CPU time per prompt and the throughput
in MB/s (UTF-8 bytes). Three prompts share the same ordinary support-ticket prose, dates, times,
versions, ids and amounts included:

- ``five values``: an e-mail address, a phone number, a card number, an IBAN and an IPv4 address
  (plus one name from the dictionary, which only the dictionary detector reports);
- ``no values``: the prose alone, digits and colons included, so the numeric rules still scan;
- ``no candidates``: prose without ``@``, digits or ``:``: only the prefilters run.

CPU time is the thread's (``time.thread_time_ns``), so other load on the machine inflates the
numbers less than wall time would; each run times ``--calls`` scans (a hundredth of them for
``presidio``, whose scans take milliseconds), and the median of ``--runs`` runs is reported. One
process, one core. The model is loaded before the timed runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from tollway.pii import presidio
from tollway.pii.detectors import BUILTIN_KINDS, Detector, Dictionary, build_detector

PROMPT_CHARS = 2048

_PROSE = (
    "Hi team, following up on ticket 48213 from the 2024-03-18 review. ",
    "The customer upgraded to version 2.14.3 last Tuesday at 10:30 and saw 3 errors in the export job. ",
    "Order 2024-118 shipped in 2 boxes; the invoice total was 1,249.50 EUR including 19% VAT. ",
    "Please summarise the thread below and draft a polite reply that explains the next steps. ",
    "Latency rose from 120 ms to 340 ms between 09:00 and 11:15 UTC, then settled again. ",
    "We agreed to revisit this in Q3 once the 4.0 release is out and the migration has finished. ",
    "Attached are the logs (build 7731, commit 9f2c1ab) and a screenshot of the settings page. ",
    "Note: the retry limit is 5 and the timeout is 30 seconds; both can be changed per workspace. ",
)
_PLAIN = (
    "Hi team, following up on the ticket from the spring review and the notes we took afterwards. ",
    "The customer upgraded last Tuesday and saw several errors in the export job again. ",
    "Please summarise the thread below and draft a polite reply that explains the next steps. ",
    "We agreed to revisit this once the release is out and the migration has finished. ",
    "Attached are the logs and a screenshot of the settings page, as requested by support. ",
)
VALUES = (
    "Contact Maria Keller at maria.keller@example.com ",
    "or call +49 30 1234 5678 today. ",
    "She paid with card 4111 1111 1111 1111 ",
    "and asked for a refund to DE89 3704 0044 0532 0130 00. ",
    "Her last login came from 192.168.10.24 on the VPN. ",
)


def _filled(sentences: tuple[str, ...], inserts: tuple[str, ...] = ()) -> str:
    """``PROMPT_CHARS`` characters of ``sentences`` in turn, with ``inserts`` spread evenly through them."""
    parts: list[str] = []
    length = sum(map(len, inserts))
    i = 0
    while length < PROMPT_CHARS:
        parts.append(sentences[i % len(sentences)])
        length += len(parts[-1])
        i += 1
    step = max(1, len(parts) // (len(inserts) + 1))
    for n, insert in enumerate(inserts):
        parts.insert((n + 1) * step + n, insert)
    text = "".join(parts)
    if len(text) > PROMPT_CHARS:
        cut = text.rfind(" ", 0, PROMPT_CHARS)
        text = text[:cut]
    return text


def dictionary_terms(count: int = 1000, seed: int = 7) -> tuple[str, ...]:
    """``count`` distinct made-up names ("first last" or one word), with "Maria Keller" among them."""
    rng = random.Random(seed)
    syllables = ("an", "ber", "co", "da", "el", "fi", "gor", "han", "is", "jo", "ka", "lu", "mar", "no", "ol", "pe")
    terms = {"Maria Keller"}
    while len(terms) < count:
        first = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))).title()
        last = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))).title()
        terms.add(f"{first} {last}" if rng.random() < 0.7 else last)
    return tuple(sorted(terms))


def prompts() -> dict[str, str]:
    return {
        "five values": _filled(_PROSE, VALUES),
        "no values": _filled(_PROSE),
        "no candidates": _filled(_PLAIN),
    }


PRESIDIO = "presidio"
PRESIDIO_CALL_SHARE = 100
"""``presidio`` runs ``--calls`` // this many scans per timed run (at least one)."""


def detectors(with_presidio: bool = True) -> dict[str, Detector]:
    found = {
        "default kinds": build_detector(BUILTIN_KINDS),
        "+ 1000-term dictionary": build_detector(BUILTIN_KINDS, dictionaries=[Dictionary("names", dictionary_terms())]),
    }
    if with_presidio:
        found[PRESIDIO] = presidio.build_presidio_detector(build_detector(BUILTIN_KINDS), presidio.PRESIDIO_KINDS)
    return found


def measure(detector: Detector, text: str, runs: int, calls: int) -> float:
    """The median over ``runs`` of the CPU seconds one ``find`` takes, each run timing ``calls`` scans."""
    find = detector.find
    samples = []
    for _ in range(runs):
        start = time.thread_time_ns()
        for _ in range(calls):
            find(text)
        samples.append((time.thread_time_ns() - start) / calls / 1e9)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="timed runs; the median is reported")
    parser.add_argument("--calls", type=int, default=1000, help="scans per timed run (presidio: a hundredth)")
    parser.add_argument("--no-presidio", action="store_true", help="leave out the presidio line")
    args = parser.parse_args(argv)
    texts = prompts()
    missing = presidio.missing_modules()
    with_presidio = not args.no_presidio and not missing
    if not args.no_presidio and missing:
        print(f"presidio: left out, the presidio extra is not installed (missing {', '.join(missing)})")
    print(f"{'detector':24s} {'prompt':14s} {'chars':>5s} {'spans':>5s} {'µs/prompt':>10s} {'MB/s':>7s}")
    for name, detector in detectors(with_presidio).items():
        calls = max(1, args.calls // PRESIDIO_CALL_SHARE) if name == PRESIDIO else args.calls
        for label, text in texts.items():
            spans = len(detector.find(text))
            seconds = measure(detector, text, args.runs, calls)
            size = len(text.encode("utf-8"))
            rate = size / seconds / 1e6
            shown = f"{rate:7.1f}" if rate >= 1 else f"{rate:7.3f}"
            print(f"{name:24s} {label:14s} {len(text):5d} {spans:5d} {seconds * 1e6:10.1f} {shown}")


if __name__ == "__main__":
    main()
