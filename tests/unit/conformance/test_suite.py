"""The suite's definition and digest, and that each case builds the request its check expects."""

from __future__ import annotations

import base64
import dataclasses
import hashlib

import orjson

from tollway.canonical import ImagePart, TextPart
from tollway.conformance import runner
from tollway.conformance.suite import (
    CAPABILITIES,
    CASES,
    SUITE_VERSION,
    UNDECLARED_TOOL,
    WEATHER_TOOL,
    suite_definition,
    suite_digest,
)


def test_the_digest_is_the_sha256_of_the_sorted_compact_definition() -> None:
    expected = hashlib.sha256(orjson.dumps(suite_definition(), option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert suite_digest() == expected
    assert suite_definition()["version"] == SUITE_VERSION


def test_the_digest_changes_with_any_request_of_the_suite() -> None:
    changed = dataclasses.replace(CASES[0], messages=(("user", "Say goodbye."),))
    definition = {"version": SUITE_VERSION, "cases": [changed.definition(), *(c.definition() for c in CASES[1:])]}
    other = hashlib.sha256(orjson.dumps(definition, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert other != suite_digest()


def test_every_case_is_unique_has_a_known_capability_and_a_check() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert {c.capability for c in CASES} == set(CAPABILITIES)
    assert set(runner._CHECKS) == set(ids)


def test_each_request_is_fresh_and_streams_only_in_stream_cases() -> None:
    for case in CASES:
        first, second = case.request(), case.request()
        assert first is not second and first.messages is not second.messages
        assert first.stream == (case.mode == "stream") == first.include_usage


def test_the_vision_case_sends_a_png_image_part() -> None:
    (vision,) = [c for c in CASES if c.capability == "vision"]
    content = vision.request().messages[-1].content
    assert isinstance(content, list)
    text, image = content
    assert isinstance(text, TextPart) and isinstance(image, ImagePart)
    head, _, data = image.url.partition(",")
    assert head == "data:image/png;base64"
    assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")


def test_the_invalid_request_case_forces_a_tool_it_does_not_declare() -> None:
    (case,) = [c for c in CASES if c.capability == "errors"]
    req = case.request()
    assert req.tool_choice is not None and req.tool_choice.name == UNDECLARED_TOOL
    assert [t.name for t in req.tools or []] == [WEATHER_TOOL.name]
