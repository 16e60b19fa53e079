"""The cached client factory: one botocore client per service and settings, built once.

Building a botocore client makes no network call, so these tests need no endpoint to answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tollway import aws

LOCAL = "http://127.0.0.1:4566"


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    aws.cache_clear()
    yield
    aws.cache_clear()


def test_the_same_settings_give_the_same_client() -> None:
    first = aws.client("dynamodb", region="eu-west-1", endpoint=LOCAL, read_timeout_s=2.0)
    again = aws.client("dynamodb", region="eu-west-1", endpoint=LOCAL, read_timeout_s=2.0)
    assert again is first
    assert aws.cache_size() == 1


@pytest.mark.parametrize(
    "other",
    [
        {"service": "sqs"},
        {"region": "us-east-1"},
        {"endpoint": "http://127.0.0.1:5000"},
        {"connect_timeout_s": 1.0},
        {"read_timeout_s": 20.0},
        {"retries": 0},
        {"max_pool_connections": 16},
        {"credentials": aws.Credentials("key", "secret")},
    ],
)
def test_different_settings_give_different_clients(other: dict[str, Any]) -> None:
    base: dict[str, Any] = {"service": "dynamodb", "region": "eu-west-1", "endpoint": LOCAL}
    first = aws.client(**base)
    second = aws.client(**{**base, **other})
    assert second is not first
    assert aws.cache_size() == 2


def test_the_settings_reach_the_client() -> None:
    c = aws.client(
        "s3",
        region="eu-west-1",
        endpoint=LOCAL,
        connect_timeout_s=1.5,
        read_timeout_s=20.0,
        retries=0,
        max_pool_connections=16,
        s3_path_style=True,
    )
    config = c.meta.config
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (1.5, 20.0, 16)
    # botocore counts the first attempt in total_max_attempts: no retries is one attempt.
    assert config.retries == {"mode": "standard", "total_max_attempts": 1}
    assert config.s3 == {"addressing_style": "path"}
    assert (c.meta.region_name, c.meta.endpoint_url) == ("eu-west-1", LOCAL)


def test_the_environment_supplies_endpoint_and_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", LOCAL)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    from_env = aws.client("sqs")
    assert (from_env.meta.endpoint_url, from_env.meta.region_name) == (LOCAL, "ap-south-1")

    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # first, as every store's settings read them
    assert aws.client("sqs").meta.region_name == "eu-west-1"

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")  # a changed environment: a new client
    assert aws.client("sqs").meta.endpoint_url == "http://127.0.0.1:5000"
    assert aws.client("sqs", endpoint=LOCAL).meta.endpoint_url == LOCAL  # an explicit endpoint wins


def test_a_service_specific_endpoint_wins_over_the_environments_generic_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """LocalStack for most services and moto for DynamoDB: the store passes $AWS_ENDPOINT_URL on, and
    botocore still sends DynamoDB to $AWS_ENDPOINT_URL_DYNAMODB, as it would with no endpoint given."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", LOCAL)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:4567")
    assert aws.client("dynamodb", region="us-east-1", endpoint=LOCAL).meta.endpoint_url == "http://127.0.0.1:4567"
    assert aws.client("sqs", region="us-east-1", endpoint=LOCAL).meta.endpoint_url == LOCAL
    other = "http://127.0.0.1:5000"  # an endpoint other than the environment's is used as given
    assert aws.client("dynamodb", region="us-east-1", endpoint=other).meta.endpoint_url == other


def test_concurrent_callers_share_one_client() -> None:
    got: list[Any] = []
    barrier = threading.Barrier(8)

    def call() -> None:
        barrier.wait()
        got.append(aws.client("dynamodb", region="eu-west-1", endpoint=LOCAL))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(c is got[0] for c in got)
    assert aws.cache_size() == 1


def test_credentials_come_from_the_given_environment_and_never_show() -> None:
    assert aws.Credentials.from_env({}) is None
    keys = aws.Credentials.from_env({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    assert keys == aws.Credentials("AKIDEXAMPLE", "s3cr3t", None)
    assert "AKIDEXAMPLE" not in repr(keys) and "s3cr3t" not in repr(keys)
    c = aws.client("sqs", region="eu-west-1", endpoint=LOCAL, credentials=keys)
    assert c._request_signer._credentials.access_key == "AKIDEXAMPLE"


def test_importing_the_module_imports_no_aws_library() -> None:
    import subprocess
    import sys

    code = "import sys, tollway.aws; assert not {'boto3', 'botocore'} & set(sys.modules), sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


async def test_threaded_clients_call_preset_clients_in_their_pool_and_refuse_once_closed() -> None:
    import threading

    from tollway.aws import ClientsClosed, ThreadedClients

    seen: list[str] = []

    class Stub:
        def get_item(self, **request: object) -> dict[str, object]:
            seen.append(threading.current_thread().name)
            return {"Item": request}

    clients = ThreadedClients(
        threads=1,
        thread_name="tollway-test",
        region="us-east-1",
        endpoint=None,
        connect_timeout_s=1,
        read_timeout_s=1,
        retries=0,
        clients={"dynamodb": Stub()},
    )
    assert clients.built == {"dynamodb"}
    got = await clients.run(clients.call, "dynamodb", "get_item", {"Key": "k"})
    assert got == {"Item": {"Key": "k"}} and seen[0].startswith("tollway-test")
    clients.close()
    with pytest.raises(ClientsClosed):
        await clients.run(clients.call, "dynamodb", "get_item", {"Key": "k"})
