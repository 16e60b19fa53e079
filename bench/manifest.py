"""The run manifest: every input a result depends on, so a figure can be reproduced or rejected.

The seed's rule: a result without its manifest is diagnostic only. The manifest records the
commit and whether the tree was dirty, package versions, the machine (CPU model, cores,
kernel), the profile file and its digest, the gateway configuration as generated, the payload
corpus digests, the mock settings and the load-generator settings.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

__all__ = ["MANIFEST_SCHEMA", "git_state", "machine", "package_versions"]

MANIFEST_SCHEMA: Final = "tollway-bench-manifest/1"
PACKAGES: Final = (
    "tollway",
    "uvicorn",
    "uvloop",
    "httptools",
    "httpx",
    "orjson",
    "pydantic",
    "starlette",
    "pyyaml",
    "aiohttp",
    "granian",
)
REPO: Final = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any]:
    status = _git("status", "--porcelain")
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "describe": _git("describe", "--always", "--dirty"),
    }


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_mib() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_mib": _memory_mib(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
