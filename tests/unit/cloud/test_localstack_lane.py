"""``scripts/test-localstack`` where LocalStack cannot run: it says so, tests nothing, and succeeds."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "test-localstack"
NO_PYTHON = "no Python 3.13 here: the LocalStack lane needs it; nothing was tested\n"


def run_lane(interpreter: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "TOLLWAY_LOCALSTACK_PYTHON": interpreter}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_without_python_313_the_lane_tests_nothing_and_succeeds() -> None:
    result = run_lane("/nonexistent")
    assert (result.returncode, result.stdout, result.stderr) == (0, NO_PYTHON, "")


def test_an_interpreter_of_another_version_does_not_count(tmp_path: Path) -> None:
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho 3.12\n")
    other.chmod(0o755)
    result = run_lane(str(other))
    assert (result.returncode, result.stdout, result.stderr) == (0, NO_PYTHON, "")


def test_localstack_pins_are_exact_and_under_the_host_mode_caps() -> None:
    pins: dict[str, tuple[int, ...]] = {}
    for line in (ROOT / "localstack" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[name.split("[")[0].lower()] = tuple(int(part) for part in version.split(".")[:2])
    assert pins["localstack-core"] == (2026, 3)
    assert pins["cbor2"] < (6, 0)
    assert pins["pyopenssl"] < (24, 3)
