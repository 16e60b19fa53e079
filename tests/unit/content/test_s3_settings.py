"""The S3 content store's settings and construction: read from the environment the stack sets,
and nothing AWS-related happens until the first call."""

from __future__ import annotations

import pytest

from tollway import aws
from tollway.cloud.resources import topology
from tollway.content import ContentStore, ContentStoreSettings, ContentUnavailable, S3ContentStore


def test_settings_come_from_the_content_variables_then_the_stacks_bucket_name() -> None:
    env = {
        "TOLLWAY_CONTENT_BUCKET": "acme-content",
        "TOLLWAY_CONTENT_KMS_KEY_ID": "alias/acme-content",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:4566",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    settings = ContentStoreSettings.from_env(env)
    assert (settings.bucket, settings.kms_key_id) == ("acme-content", "alias/acme-content")
    assert (settings.endpoint_url, settings.region) == ("http://127.0.0.1:4566", "eu-west-1")
    assert (settings.connect_timeout_s, settings.read_timeout_s, settings.max_attempts) == (1.0, 5.0, 2)

    stack = topology("envcheck").environment("123456789012", "eu-west-1")
    from_stack = ContentStoreSettings.from_env({**stack, "TOLLWAY_CONTENT_KMS_KEY_ID": "alias/k"})
    assert from_stack.bucket == "envcheck-content-123456789012-eu-west-1"
    assert from_stack.endpoint_url is None and from_stack.region is None
    assert ContentStoreSettings.from_env(env, bucket="given", kms_key_id="alias/given").bucket == "given"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TOLLWAY_CONTENT_KMS_KEY_ID": "alias/k"}, "TOLLWAY_CONTENT_BUCKET"),
        ({"TOLLWAY_CONTENT_BUCKET": "acme-content"}, "TOLLWAY_CONTENT_KMS_KEY_ID"),
        ({"TOLLWAY_CONTENT_BUCKET": "ab", "TOLLWAY_CONTENT_KMS_KEY_ID": "alias/k"}, "bucket"),
    ],
)
def test_missing_or_invalid_settings_are_unavailable_and_say_which(env: dict[str, str], named: str) -> None:
    with pytest.raises(ContentUnavailable, match=named):
        ContentStoreSettings.from_env(env)


async def test_building_a_store_builds_no_client_and_closing_it_needs_none() -> None:
    before = aws.cache_size()
    settings = ContentStoreSettings(bucket="acme-content", kms_key_id="alias/k", region="eu-west-1")
    store: ContentStore = S3ContentStore(settings)
    assert aws.cache_size() == before
    assert "acme-content" in repr(store)
    await store.aclose()
    assert aws.cache_size() == before
