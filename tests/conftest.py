"""Shared fixtures: real processes on 127.0.0.1 (mock providers, gateway), nothing faked."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.processes import Proc, start_process, wait_healthy


@pytest.fixture(scope="session")
def mock_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    log = tmp_path_factory.mktemp("mock") / "mock.log"
    proc = start_process(
        [sys.executable, "-m", "tollway.mock", "--host", "127.0.0.1", "--port", "0"],
        r"mock listening on (\S+)",
        log,
    )
    wait_healthy(proc.url + "/_mock/health")
    yield proc
    proc.stop()
