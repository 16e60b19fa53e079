"""Session fixtures: each stack is synthesized once and shared by every test that reads it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.synth import STAGE, WORKER_STAGE, Synth, synthesize
from tests.infra.synthetic import topology_with_worker


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    yield synthesize(tmp_path_factory.mktemp("synth"), STAGE)


@pytest.fixture(scope="session")
def worker_synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    yield synthesize(tmp_path_factory.mktemp("worker-synth"), WORKER_STAGE, topology_with_worker(WORKER_STAGE))
