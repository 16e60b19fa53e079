"""The local-cloud tier: a real moto server per module (or the emulator ``$AWS_ENDPOINT_URL`` names).

Every test names its resources with a fresh prefix, so a shared emulator (LocalStack, a moto
server started by hand) can run the suite repeatedly without collisions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tollway.cloud.local import LocalCloud, local_cloud


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "local_cloud: tests against a real local cloud (moto server or LocalStack)")


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    log = tmp_path_factory.mktemp("cloud") / "moto.log"
    with local_cloud(port=0, log_path=log) as running:
        yield running


@pytest.fixture
def prefix() -> str:
    """A stage prefix unique to the test (topology prefixes are at most 20 characters)."""
    return "it" + uuid.uuid4().hex[:10]
