"""The local-cloud tier: a real moto server per module (or the emulator ``$AWS_ENDPOINT_URL`` names).

Every test names its resources with a fresh prefix, so a shared emulator (LocalStack, a moto
server started by hand) can run the suite repeatedly without collisions.

The endpoint may be split by service, as botocore reads it: ``AWS_ENDPOINT_URL_DYNAMODB`` sends
DynamoDB elsewhere (``scripts/test-localstack`` runs LocalStack with DynamoDB on moto, since
LocalStack's DynamoDB needs DynamoDB Local, downloaded at run time). Such a variable must answer
too. A test that cannot run on LocalStack carries ``@pytest.mark.not_on_localstack(reason)``, and
is skipped there with that reason.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from tollway.cloud.local import LocalCloud, LocalCloudError, local_cloud, reachable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "local_cloud: tests against a real local cloud (moto server or LocalStack)")
    config.addinivalue_line(
        "markers", "not_on_localstack(reason): skipped when $AWS_ENDPOINT_URL is LocalStack, with the reason given"
    )


@functools.cache
def on_localstack() -> bool:
    """True when ``$AWS_ENDPOINT_URL`` is LocalStack (it answers ``/_localstack/health``)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "").strip().rstrip("/")
    if not endpoint:
        return False
    try:
        with urllib.request.urlopen(endpoint + "/_localstack/health", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError, urllib.error.HTTPError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("not_on_localstack")]
    if not marked or not on_localstack():
        return
    for item in marked:
        marker = item.get_closest_marker("not_on_localstack")
        assert marker is not None
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: not_on_localstack needs a reason")
        item.add_marker(pytest.mark.skip(reason=f"not on LocalStack: {reason}"))


def _check_split_endpoints() -> None:
    for name, value in os.environ.items():
        if name.startswith("AWS_ENDPOINT_URL_") and value.strip() and not reachable(value.strip()):
            raise LocalCloudError(f"{name}={value.strip()} does not answer; start it or unset the variable")


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    if os.environ.get("AWS_ENDPOINT_URL", "").strip():
        _check_split_endpoints()
    log = tmp_path_factory.mktemp("cloud") / "moto.log"
    with local_cloud(port=0, log_path=log) as running:
        yield running


@pytest.fixture
def prefix() -> str:
    """A stage prefix unique to the test (topology prefixes are at most 20 characters)."""
    return "it" + uuid.uuid4().hex[:10]
