"""``bench.bedrock_clients``: Tollway's side of the Converse comparison runs against the mock.

The aiobotocore side needs its own venv (``--setup``) and is not run here; this proves the path
the benchmark measures is the real one: codec, SigV4 signer and ``h1`` against the Bedrock mock,
which answers only signed calls.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import bedrock_clients
from tollway.mock.server import MockServerThread


def test_the_tollway_path_signs_sends_and_decodes_against_the_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bedrock_clients, "WARMUP", 2)
    with MockServerThread() as mock:
        cpu = asyncio.run(bedrock_clients._tollway_cpu(mock.base_url.rstrip("/"), 6, 2))
    assert 0 < cpu < 1.0


def test_main_refuses_to_run_without_the_side_venv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bedrock_clients, "SIDE_VENV", tmp_path)
    with pytest.raises(SystemExit) as exited:
        bedrock_clients.main(["--requests", "1", "--repeat", "1"])
    assert exited.value.code == 2
    assert "--setup" in capsys.readouterr().err
