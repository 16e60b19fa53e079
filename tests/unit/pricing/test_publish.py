"""Publishing to the in-memory store: snapshot before pointer, idempotent, effective-dated; loading with retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from tollway.pricing import (
    MemorySnapshotStore,
    PricingSnapshot,
    SnapshotCorrupt,
    SnapshotLoader,
    compile_snapshot,
    load_current,
    parse_models_dev,
    pointer_key,
    publish,
    read_pointer,
    snapshot_key,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def build(output: float, effective: datetime = NOW) -> PricingSnapshot:
    doc = {"x": {"models": {"m": {"cost": {"input": 1, "output": output}}}}}
    return compile_snapshot([parse_models_dev(orjson.dumps(doc), uri="file://c")], None, now=effective)


def test_the_snapshot_object_is_written_before_the_pointer_to_it() -> None:
    store = MemorySnapshotStore()
    snap = build(2)
    result = publish(store, snap, now=NOW)
    assert (result.status, result.current, result.previous, result.snapshot_written) == (
        "published",
        snap.version,
        None,
        True,
    )
    assert store.puts == [f"pricing/snapshots/{snap.version}.json", "pricing/current.json"]
    pointer = read_pointer(store)
    assert pointer is not None
    assert (pointer.version, pointer.key, pointer.digest) == (snap.version, snapshot_key(snap.version), snap.digest)


def test_publishing_the_same_content_again_writes_nothing() -> None:
    store = MemorySnapshotStore()
    publish(store, build(2), now=NOW)
    writes = list(store.puts)
    result = publish(store, build(2, effective=NOW + timedelta(hours=1)), now=NOW + timedelta(hours=1))
    assert result.status == "unchanged"
    assert store.puts == writes


def test_new_content_moves_the_pointer_and_keeps_the_old_snapshot() -> None:
    store = MemorySnapshotStore()
    old, new = build(2), build(3)
    publish(store, old, now=NOW)
    result = publish(store, new, now=NOW)
    assert (result.status, result.previous, result.current) == ("published", old.version, new.version)
    assert store.exists(snapshot_key(old.version))
    loaded = load_current(store)
    assert loaded is not None and loaded.version == new.version


def test_returning_to_earlier_content_repoints_without_rewriting_its_snapshot() -> None:
    store = MemorySnapshotStore()
    publish(store, build(2), now=NOW)
    publish(store, build(3), now=NOW)
    result = publish(store, build(2), now=NOW)
    assert (result.status, result.snapshot_written) == ("published", False)
    assert store.puts[-1] == pointer_key()


def test_a_snapshot_effective_later_is_stored_but_not_pointed_at_until_then() -> None:
    store = MemorySnapshotStore()
    current = build(2)
    publish(store, current, now=NOW)
    future = build(3, effective=NOW + timedelta(days=1))
    early = publish(store, future, now=NOW)
    assert (early.status, early.current, early.snapshot_written) == ("pending", current.version, True)
    assert store.exists(snapshot_key(future.version))
    late = publish(store, future, now=NOW + timedelta(days=1))
    assert (late.status, late.current, late.snapshot_written) == ("published", future.version, False)


def test_nothing_published_loads_as_none() -> None:
    assert load_current(MemorySnapshotStore()) is None


def test_a_pointer_to_a_missing_or_mismatched_snapshot_is_corrupt() -> None:
    store = MemorySnapshotStore()
    a, b = build(2), build(3)
    publish(store, a, now=NOW)
    store.put(snapshot_key(a.version), store.objects[pointer_key()])
    with pytest.raises(SnapshotCorrupt):
        load_current(store)
    publish(store, b, now=NOW)
    del store.objects[snapshot_key(b.version)]
    with pytest.raises(SnapshotCorrupt, match="does not exist"):
        load_current(store)


def test_an_unreadable_pointer_is_replaced_by_the_next_publication() -> None:
    store = MemorySnapshotStore()
    store.put(pointer_key(), b"garbage")
    snap = build(2)
    result = publish(store, snap, now=NOW)
    assert (result.status, result.previous) == ("published", None)
    loaded = load_current(store)
    assert loaded is not None and loaded.version == snap.version


def test_the_loader_fetches_only_new_versions_and_keeps_the_last_valid_one() -> None:
    store = MemorySnapshotStore()
    loader = SnapshotLoader(store)
    assert loader.reload() is False and loader.current is None
    first = build(2)
    publish(store, first, now=NOW)
    assert loader.reload() is True
    assert loader.reload() is False
    store.put(pointer_key(), b"garbage")
    with pytest.raises(SnapshotCorrupt):
        loader.reload()
    assert loader.current is not None and loader.current.version == first.version


def test_a_custom_prefix_places_both_objects_under_it() -> None:
    store = MemorySnapshotStore()
    snap = build(2)
    publish(store, snap, now=NOW, prefix="/stage-a/pricing/")
    assert store.puts == [f"stage-a/pricing/snapshots/{snap.version}.json", "stage-a/pricing/current.json"]
    loaded = load_current(store, "stage-a/pricing")
    assert loaded is not None and loaded.version == snap.version
