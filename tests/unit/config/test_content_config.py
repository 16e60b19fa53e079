"""The content modes' rules: a store and an audit trail to capture into, a known retention class
short enough for raw content, consent only for tokenized content, and never for data classified
as forbidding capture."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.config.test_validate import base_config, issues_of
from tollway.config import parse_config
from tollway.config.root import _content_policy
from tollway.config.validate import check

CAPTURE = {"content": {"store": {"type": "s3", "bucket": "tollway-content", "kmsKeyId": "alias/content"}}}
AUDIT = {"audit": {"sink": {"type": "sqs", "queueName": "tollway-audit"}}}


def config(model: dict[str, Any], *blocks: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(base_config())
    data["models"][0].update(model)
    for block in blocks:
        data.update(copy.deepcopy(block))
    return data


def paths(data: dict[str, Any]) -> dict[str, str]:
    return {i.path: i.message for i in issues_of(data) if i.path.startswith(("models[0].content", "content"))}


def test_a_capturing_alias_with_a_store_and_an_audit_trail_is_valid() -> None:
    assert paths(config({"contentMode": "tokenized-content", "contentPurposes": ["evaluation"]}, CAPTURE, AUDIT)) == {}
    assert paths(config({"contentMode": "encrypted-raw"}, CAPTURE, AUDIT)) == {}


@pytest.mark.parametrize("mode", ["tokenized-content", "encrypted-raw"])
def test_capture_needs_a_content_store(mode: str) -> None:
    found = paths(config({"contentMode": mode}, AUDIT))
    assert "content store" in found["models[0].contentMode"]


def test_capture_needs_the_audit_trail_that_holds_its_references() -> None:
    found = paths(config({"contentMode": "tokenized-content"}, CAPTURE))
    assert "audit trail" in found["models[0].contentMode"]


def test_a_classification_that_forbids_capture_is_refused() -> None:
    data = config({"contentMode": "tokenized-content", "dataClassifications": ["restricted"]}, CAPTURE, AUDIT)
    assert "'restricted'" in paths(data)["models[0].contentMode"]


def test_raw_content_is_for_audit_only_and_kept_briefly() -> None:
    found = paths(config({"contentMode": "encrypted-raw", "contentPurposes": ["training"]}, CAPTURE, AUDIT))
    assert "audit only" in found["models[0].contentPurposes"]
    found = paths(config({"contentMode": "encrypted-raw", "contentRetentionClass": "standard"}, CAPTURE, AUDIT))
    assert "at most 7 days" in found["models[0].contentRetentionClass"]


def test_an_unknown_retention_class_is_named() -> None:
    found = paths(config({"contentMode": "tokenized-content", "contentRetentionClass": "forever"}, CAPTURE, AUDIT))
    assert "'forever'" in found["models[0].contentRetentionClass"]


def test_purposes_without_capture_are_only_a_warning() -> None:
    data = config({"contentMode": "metadata-only", "contentPurposes": ["evaluation"]})
    assert paths(data) == {}  # a config that turns capture on by environment stays valid without it
    warnings = check(parse_config(data)).warnings
    assert any(w.path == "models[0].contentPurposes" and "no effect" in w.message for w in warnings)


def test_the_compiled_policy_carries_mode_class_and_consent() -> None:
    cfg = parse_config(config({"contentMode": "tokenized-content", "contentPurposes": ["training"]}, CAPTURE, AUDIT))
    policy = _content_policy(cfg.models[0], cfg)
    assert policy is not None
    assert (policy.mode, policy.retention_class, policy.purposes) == (
        "tokenized-content",
        "standard",
        ("audit", "training"),
    )
    assert all(_content_policy(m, cfg) is None for m in cfg.models[1:])


@pytest.mark.parametrize("rate", [0.0, 0.25, 1.0])
def test_sampling_is_a_stable_share_of_request_ids(rate: float) -> None:
    cfg = parse_config(config({"contentMode": "tokenized-content", "contentSampleRate": rate}, CAPTURE, AUDIT))
    policy = _content_policy(cfg.models[0], cfg)
    assert policy is not None
    ids = [f"req_{i:024x}" for i in range(4000)]
    picked = [policy.sampled(i) for i in ids]
    assert picked == [policy.sampled(i) for i in ids]  # the same id decides the same way
    assert abs(sum(picked) / len(ids) - rate) < 0.03
