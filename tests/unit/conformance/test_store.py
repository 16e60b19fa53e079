"""Results in a directory: keys, history, verification on read, and where the location comes from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tollway.conformance.result import CaseOutcome, ConformanceResult
from tollway.conformance.store import (
    ConformanceStoreError,
    DirectoryStore,
    S3Store,
    latest_key,
    open_store,
    results_location,
)
from tollway.conformance.suite import SUITE_VERSION, suite_digest

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


def result(model: str = MODEL, finished: float = 1_800_000_000.0) -> ConformanceResult:
    return ConformanceResult(
        suite_version=SUITE_VERSION,
        suite_digest=suite_digest(),
        deployment="bedrock-eu",
        provider_type="bedrock",
        provider_format="bedrock-converse",
        model=model,
        started_at=finished - 3,
        finished_at=finished,
        cases=(CaseOutcome("chat.buffered", "chat", "pass"),),
    )


def test_a_model_id_stays_one_path_segment() -> None:
    assert latest_key("bedrock-eu", MODEL) == "bedrock-eu/anthropic.claude-3-5-haiku-20241022-v1%3A0.json"
    assert latest_key("openrouter", "meta/llama-3") == "openrouter/meta%2Fllama-3.json"


def test_the_latest_result_is_read_back_and_every_run_kept_in_the_history(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    first, second = result(finished=1_800_000_000.0), result(finished=1_800_003_600.0)
    store.write(first)
    written = store.write(second)
    other = store.write(result(model="meta/llama-3"))

    assert Path(written).is_file() and Path(other).is_file()
    assert store.read("bedrock-eu", MODEL) == second
    assert store.read("bedrock-eu", "absent") is None
    assert store.read_all() == {("bedrock-eu", MODEL): second, ("bedrock-eu", "meta/llama-3"): result("meta/llama-3")}
    history = sorted((tmp_path / "bedrock-eu" / "history").rglob("*.json"))
    assert len(history) == 3


def test_an_edited_or_misplaced_result_is_refused_with_its_path(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    path = Path(store.write(result()))
    path.write_bytes(path.read_bytes().replace(b'"pass"', b'"fail"', 1))
    with pytest.raises(ConformanceStoreError, match="digest does not verify"):
        store.read_all()
    path.write_bytes(dataclasses.replace(result(), model="other").to_json())
    with pytest.raises(ConformanceStoreError, match="another deployment or model"):
        store.read("bedrock-eu", MODEL)


def test_a_missing_directory_holds_no_results(tmp_path: Path) -> None:
    assert DirectoryStore(tmp_path / "none").read_all() == {}


def test_the_location_is_the_config_then_the_environment_then_the_default(tmp_path: Path) -> None:
    env = {"TOLLWAY_CONFORMANCE_RESULTS": "s3://bucket/env"}
    assert results_location("s3://bucket/cfg", env) == "s3://bucket/cfg"
    assert results_location("", env) == "s3://bucket/env"
    assert results_location("", {}) == ".tollway/conformance"
    store = open_store("results", tmp_path)
    assert isinstance(store, DirectoryStore) and store.root == tmp_path / "results"
    s3 = open_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    with pytest.raises(ConformanceStoreError):
        open_store("s3:///prefix")
