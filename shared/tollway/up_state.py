"""Where the ``tollway up`` running in a directory keeps its local cloud: ``.tollway/up.json``.

``tollway up`` writes the file once its local cloud is ready and removes it when it stops.
``tollway audit`` reads it when ``AWS_ENDPOINT_URL`` is not set, so the command the banner
prints (``tollway audit list --since 10m``) works as printed from the same directory. A file
whose ``pid`` is no longer running (an ``up`` that was killed) is ignored. It holds no secret:
the endpoint, the stage, the region and the pid of ``up``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from tollway.pids import alive

__all__ = ["STATE_FILE", "UpState", "read_state", "remove_state", "write_state"]

STATE_FILE: Final = Path(".tollway") / "up.json"
"""Relative to the directory ``tollway up`` runs in."""


@dataclass(frozen=True, slots=True)
class UpState:
    endpoint: str
    """The local cloud's endpoint URL (moto server, or the emulator ``AWS_ENDPOINT_URL`` named)."""
    stage: str
    region: str
    pid: int
    """The ``tollway up`` process."""


def write_state(state: UpState, directory: Path = Path()) -> Path:
    """Write the state file under ``directory`` (atomically: a reader never sees half of it)."""
    path = directory / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{state.pid}")
    partial.write_text(json.dumps(asdict(state)) + "\n", encoding="utf-8")
    partial.replace(path)
    return path


def read_state(directory: Path = Path()) -> UpState | None:
    """The state of the ``tollway up`` running in ``directory``; ``None`` if none is (or the file is unreadable)."""
    try:
        data = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
        state = UpState(str(data["endpoint"]), str(data["stage"]), str(data["region"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if alive(state.pid) else None


def remove_state(pid: int, directory: Path = Path()) -> None:
    """Remove the state file if process ``pid`` wrote it (a later ``up`` may have replaced it)."""
    path = directory / STATE_FILE
    try:
        if int(json.loads(path.read_text(encoding="utf-8"))["pid"]) == pid:
            path.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass
