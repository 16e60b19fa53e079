"""The in-memory content store: the shared store contract, plus its bound."""

from __future__ import annotations

import pytest

from tests.support.content_store_contract import RETENTION, ContentStoreContract, record
from tollway.content import ContentError, ContentStore, ContentUnavailable, MemoryContentStore


@pytest.fixture
def store() -> MemoryContentStore:
    return MemoryContentStore()


class TestMemoryStoreContract(ContentStoreContract):
    pass


def test_the_memory_store_is_a_content_store() -> None:
    typed: ContentStore = MemoryContentStore()  # mypy checks the Protocol here
    assert isinstance(typed, MemoryContentStore)


async def test_a_full_store_refuses_a_new_object_but_replaces_a_stored_one() -> None:
    store = MemoryContentStore(max_objects=2)
    first = await store.put(record("req_1"), RETENTION)
    await store.put(record("req_2"), RETENTION)
    with pytest.raises(ContentUnavailable, match="full") as full:
        await store.put(record("req_3"), RETENTION)
    assert "req_3" not in str(full.value)
    assert store.objects == 2
    await store.put(record("req_1"), RETENTION)  # the same key: no new object
    assert store.objects == 2
    assert await store.delete(first) is True
    await store.put(record("req_3"), RETENTION)
    assert store.objects == 2


async def test_a_record_over_the_object_limit_is_refused_and_not_stored() -> None:
    store = MemoryContentStore(max_object_bytes=100)
    with pytest.raises(ContentError, match="larger than 100 bytes") as refused:
        await store.put(record(), RETENTION)
    assert not isinstance(refused.value, ContentUnavailable)
    assert store.objects == 0


async def test_closing_forgets_every_object() -> None:
    store = MemoryContentStore()
    await store.put(record(), RETENTION)
    assert store.objects == 1
    await store.aclose()
    assert store.objects == 0
