"""Process helpers for tests: real servers on 127.0.0.1, started and stopped by fixtures."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from tollway.governance.principals import key_digest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    log_file: IO[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log_file.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        """The log's complete lines. A line the process is still writing is left out: a reader can
        see a write to a regular file in part (Linux copies it a page at a time), so the log's
        last line may be cut short, and parsing it as JSON fails."""
        text = self.log()
        return text[: text.rfind("\n") + 1].splitlines()

    def wait_log_line(self, predicate: Callable[[str], bool], timeout: float = 10) -> str:
        """The last complete log line matching ``predicate``, waited for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.log_lines() if predicate(line)]
            if found:
                return found[-1]
            assert time.monotonic() < deadline, f"no log line matched within {timeout} s:\n{self.log()[-4000:]}"
            time.sleep(0.05)


def start_process(args: list[str], ready: str, log_path: Path, env: dict[str, str] | None = None) -> Proc:
    """Start ``args``; wait for a stdout line matching ``ready`` (one URL group)."""
    log = log_path.open("w")
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})}, cwd=ROOT
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(ready, line)
        if m:
            return Proc(proc, m.group(1), log_path, log)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    log.close()
    raise RuntimeError(f"{args[:3]} did not start:\n{log_path.read_text()}")


def wait_healthy(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy")


@dataclass
class Gateway:
    proc: Proc
    base_url: str
    config_path: Path
    keys: dict[str, str]


def start_gateway(config_path: Path, env: dict[str, str], workers: int = 1) -> Gateway:
    proc = start_process(
        [
            sys.executable,
            "-m",
            "tollway.cli",
            "serve",
            "--config",
            str(config_path),
            "--port",
            "0",
            "--workers",
            str(workers),
            "--access-log",
        ],
        r"Tollway listening on (\S+)",
        config_path.parent / "gateway.log",
        env,
    )
    base = proc.url
    wait_healthy(base.removesuffix("/v1") + "/healthz")
    return Gateway(proc, base, config_path, {})


def new_key() -> tuple[str, str]:
    key = "tw-test-" + secrets.token_urlsafe(18)
    return key, key_digest(key)
