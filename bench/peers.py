"""Peer gateways, measured in the same run, on the same mock, with the same load: LiteLLM and Portkey.

Each peer is installed from its registry into ``bench/results/.peers/`` (git-ignored), never
into Tollway's environment::

    python -m bench.peers install litellm portkey

- **LiteLLM proxy** (PyPI ``litellm[proxy]``, pinned in ``bench/peers/litellm/requirements.txt``)
  runs in its own venv with no database, a master key (it refuses to start without one), the
  local cost map (``LITELLM_LOCAL_MODEL_COST_MAP``, or it downloads prices at start), the alias
  mapped to a model it knows (``openai/gpt-4o-mini`` with ``api_base`` at the mock, so no extra
  cost lookup per request) and the same worker count as Tollway.
- **Portkey gateway** (npm ``@portkey-ai/gateway``, pinned with ``@hono/node-server`` 1.13.5
  through ``overrides``: with 1.19.x every streamed request fails with HTTP 500) is one Node
  process, bound to 127.0.0.1 by ``bench/peers/portkey/loopback.mjs`` (it listens on every
  interface by default) and routed per request with ``x-portkey-provider: openai`` and
  ``x-portkey-custom-host``. It holds back the first streamed chunk by about 25 ms by design.

A peer that is not installed or fails to start is reported as such, with the reason, and the
run goes on without it. Bifrost (npm ``@maximhq/bifrost``) downloads its binary at run time,
which cannot work here; agentgateway and Helicone have no npm or PyPI build.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from bench.servers import ALIAS, PROVIDER_MODEL, Server, fault_prefix, start_polled

__all__ = ["PEERS", "PEERS_DIR", "PeerError", "PeerTarget", "install", "start_peer"]

BENCH_DIR: Final = Path(__file__).resolve().parent
PEERS_DIR: Final = BENCH_DIR / "results" / ".peers"
PEERS: Final = ("litellm", "portkey")
_LITELLM_KEY_ENV: Final = "LITELLM_BENCH_PROVIDER_KEY"
_INSTALL_TIMEOUT_S: Final = 900
_START_TIMEOUT_S: Final = 120.0


class PeerError(RuntimeError):
    """A peer is not installed or did not start; the message is the reason the report prints."""


@dataclass
class PeerTarget:
    name: str
    server: Server
    url: str
    headers: dict[str, str]
    model: str
    workers: int
    version: str | None
    settings: dict[str, Any] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _litellm_version(venv: Path) -> str | None:
    found = sorted(venv.glob("lib/python3*/site-packages/litellm-*.dist-info"))
    return found[-1].name.removeprefix("litellm-").removesuffix(".dist-info") if found else None


def _start_litellm(out: Path, mock_url: str, faults: str, workers: int, provider_key: str) -> PeerTarget:
    venv = PEERS_DIR / "litellm"
    exe = venv / "bin" / "litellm"
    if not exe.is_file():
        raise PeerError("not installed: run `python -m bench.peers install litellm`")
    config = {
        "model_list": [
            {
                "model_name": ALIAS,
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "api_base": mock_url + fault_prefix(faults) + "/v1",
                    "api_key": f"os.environ/{_LITELLM_KEY_ENV}",
                },
            }
        ],
        "litellm_settings": {"telemetry": False},
    }
    config_path = out / "litellm.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = _free_port()
    master_key = "sk-bench-" + secrets.token_urlsafe(16)
    command = [str(exe), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--num_workers", str(workers)]
    env = {
        "LITELLM_MASTER_KEY": master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        _LITELLM_KEY_ENV: provider_key,
    }
    base = f"http://127.0.0.1:{port}"
    try:
        server = start_polled(
            "litellm", command, base, "/health/liveliness", out / "litellm.log", env, _START_TIMEOUT_S
        )
    except RuntimeError as exc:
        raise PeerError(str(exc)) from None
    return PeerTarget(
        name="litellm",
        server=server,
        url=base + "/v1/chat/completions",
        headers={"authorization": f"Bearer {master_key}"},
        model=ALIAS,
        workers=workers,
        version=_litellm_version(venv),
        settings={"config": config, "config_file": config_path.name},
    )


def _start_portkey(out: Path, mock_url: str, faults: str, provider_key: str) -> PeerTarget:
    root = PEERS_DIR / "portkey" / "node_modules" / "@portkey-ai" / "gateway"
    entry = root / "build" / "start-server.js"
    node = shutil.which("node")
    if not entry.is_file() or node is None:
        raise PeerError("not installed (or no node): run `python -m bench.peers install portkey`")
    port = _free_port()
    command = [node, str(BENCH_DIR / "peers" / "portkey" / "loopback.mjs"), f"--port={port}", "--headless"]
    env = {"PORTKEY_ENTRY": str(entry), "NODE_ENV": "production"}
    base = f"http://127.0.0.1:{port}"
    try:
        server = start_polled("portkey", command, base, "/", out / "portkey.log", env, _START_TIMEOUT_S)
    except RuntimeError as exc:
        raise PeerError(str(exc)) from None
    version = json.loads((root / "package.json").read_text()).get("version")
    custom_host = mock_url + fault_prefix(faults) + "/v1"
    return PeerTarget(
        name="portkey",
        server=server,
        url=base + "/v1/chat/completions",
        headers={
            "authorization": f"Bearer {provider_key}",
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": custom_host,
        },
        model=PROVIDER_MODEL,
        workers=1,
        version=version,
        settings={"routing_headers": ["x-portkey-provider: openai", "x-portkey-custom-host: <mock>/v1"]},
    )


def start_peer(name: str, out: Path, mock_url: str, faults: str, workers: int, provider_key: str) -> PeerTarget:
    """Start peer ``name`` against the mock; raises :class:`PeerError` with the reason when it cannot."""
    if name == "litellm":
        return _start_litellm(out, mock_url, faults, workers, provider_key)
    if name == "portkey":
        return _start_portkey(out, mock_url, faults, provider_key)
    raise PeerError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


def _run(command: list[str], cwd: Path) -> None:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, cwd=cwd, check=True, timeout=_INSTALL_TIMEOUT_S)


def install(names: Sequence[str]) -> None:
    """Install peers from their registries into ``bench/results/.peers/`` (bounded in time)."""
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == "litellm":
            venv = PEERS_DIR / "litellm"
            if not (venv / "bin" / "python").is_file():
                _run([sys.executable, "-m", "venv", str(venv)], PEERS_DIR)
            requirements = BENCH_DIR / "peers" / "litellm" / "requirements.txt"
            _run(
                [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "-r", str(requirements)],
                venv,
            )
        elif name == "portkey":
            target = PEERS_DIR / "portkey"
            target.mkdir(exist_ok=True)
            shutil.copyfile(BENCH_DIR / "peers" / "portkey" / "package.json", target / "package.json")
            _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], target)
        else:
            raise SystemExit(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description="Install the peer gateways.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install", help="install peers into bench/results/.peers/")
    p_install.add_argument("peers", nargs="*", help=f"default: {' '.join(PEERS)}")
    args = parser.parse_args(argv)
    install(args.peers or list(PEERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
